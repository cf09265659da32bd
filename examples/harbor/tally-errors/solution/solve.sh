#!/bin/bash
cd /app && grep -c ',error$' data/records.csv > summary.txt
