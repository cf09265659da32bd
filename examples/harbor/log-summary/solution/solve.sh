#!/bin/bash
cd /app
errors=$(awk '$3 == 500' logs/access.log | wc -l)
top=$(awk '{print $1}' logs/access.log | sort | uniq -c | sort -rn | awk 'NR == 1 {print $2}')
printf 'errors: %s\ntop: %s\n' "$errors" "$top" > summary.txt
