#!/usr/bin/env bash
# Run the test suite on a machine that is busy with other work, as a user's laptop or a shared
# CI runner is: one CPU-bound process pinned to each core (LOAD=N for another count) for the
# whole run. A test that fails here and passes on an idle machine measures load, not a bug.
#
#   bash scripts/loaded_tests.sh                 # the README's test command, loaded
#   LOAD=4 bash scripts/loaded_tests.sh tests/tools -x
#
# It prints how long the run took; docs/developers.md gives the idle and loaded times.
set -euo pipefail
cd "$(dirname "$0")/.."

cores=$(nproc)
load=${LOAD:-$cores}
busy=()
stop_load() { [ ${#busy[@]} -eq 0 ] || kill "${busy[@]}" 2>/dev/null || true; }
trap stop_load EXIT
for i in $(seq 0 $((load - 1))); do
    taskset -c $((i % cores)) sh -c 'while :; do :; done' &
    busy+=($!)
done

started=$(date +%s)
status=0
.venv/bin/python -m pytest "$@" || status=$?
echo "loaded run: $load busy processes pinned to $cores cores; $(($(date +%s) - started)) s; exit $status"
exit "$status"
