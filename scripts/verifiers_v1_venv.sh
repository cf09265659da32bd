#!/usr/bin/env bash
# Build .venv-verifiers: a separate venv with verifiers 0.4 (its v1 API), where
# examples/agents/verifiers_v1_agent.py runs a verifiers v1 environment as a harness program
# (envhub.harness.verifiers_v1.VerifiersV1Env). envhub's own venv keeps verifiers 0.3 (the
# `verifiers` extra); the two cannot share a venv (0.4 needs openai>=2.54 and mcp==2.0.0).
# Re-running it is safe and quick: an existing venv with the right version is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${VERIFIERS_V1_VERSION:-0.4.0}
VENV=${VERIFIERS_V1_VENV:-.venv-verifiers}
PYTHON=${PYTHON:-python3}

if [ -x "$VENV/bin/python" ] &&
    "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('verifiers') != '$VERSION')" 2>/dev/null &&
    "$VENV/bin/python" -c "import verifiers.v1" 2>/dev/null; then
    echo "$VENV: verifiers $VERSION is installed"
    exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "verifiers==$VERSION"
"$VENV/bin/python" -c "import verifiers, verifiers.v1; print('$VENV: verifiers', verifiers.__version__)"
