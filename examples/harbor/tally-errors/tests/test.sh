#!/bin/bash
# Binary reward: 1 when /app/summary.txt holds the number of error records (88 of 400).
mkdir -p /logs/verifier
if [ "$(tr -d '[:space:]' < /app/summary.txt 2>/dev/null)" = "88" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
