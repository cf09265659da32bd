#!/usr/bin/env bash
# Run the Megatron backend's CPU tests against another megatron-core release, without touching
# .venv: the release is unpacked into a folder of its own and put first on PYTHONPATH.
#   bash scripts/test_megatron_core.sh 0.19.2 [pytest args...]
# megatron-core 0.17+ declares Python >= 3.12; its code runs on 3.11, so on a 3.11 machine this
# installs it with --ignore-requires-python (a check, not a supported install).
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: scripts/test_megatron_core.sh VERSION [pytest args...]}
shift
target=${TMPDIR:-/tmp}/envhub-megatron-core-$version
if [ ! -d "$target/megatron/core" ]; then
    .venv/bin/python -m pip install -q --no-deps --ignore-requires-python --target "$target" \
        "megatron-core==$version"
fi
PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}" .venv/bin/python -c \
    "import megatron.core as m; print('megatron-core', m.__version__, 'from', m.__file__)"
PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}" .venv/bin/python -m pytest -p no:cacheprovider \
    tests/trainer/megatron "$@"
