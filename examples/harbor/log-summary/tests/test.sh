#!/bin/bash
# Partial reward in reward.json: half for each line of the summary that is right.
mkdir -p /logs/verifier
errors=$(awk '$3 == 500' /app/logs/access.log | wc -l)
top=$(awk '{print $1}' /app/logs/access.log | sort | uniq -c | sort -rn | awk 'NR == 1 {print $2}')
line1=$(sed -n 1p /app/summary.txt 2>/dev/null)
line2=$(sed -n 2p /app/summary.txt 2>/dev/null)
e=0; t=0
[ "$line1" = "errors: $errors" ] && e=1
[ "$line2" = "top: $top" ] && t=1
reward=$(awk -v e=$e -v t=$t 'BEGIN {print (e + t) / 2}')
printf '{"reward": %s, "errors_line": %s, "top_line": %s}\n' "$reward" "$e" "$t" > /logs/verifier/reward.json
