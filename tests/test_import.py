"""`import envhub` stays light.

It imports no torch, transformers or vLLM, even after touching the public API.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "vllm")

_PROBE = """
import json, sys
loaded = {}
import envhub
loaded["import envhub"] = sorted(m for m in %(heavy)r if m in sys.modules)
envhub.Env
loaded["envhub.Env"] = sorted(m for m in %(heavy)r if m in sys.modules)
for name in envhub.__all__:
    getattr(envhub, name)
import envhub.tools, envhub.rewards.math, envhub.rewards.judge, \
envhub.testing, envhub.rollout.tokens, envhub.report
loaded["whole SDK"] = sorted(m for m in %(heavy)r if m in sys.modules)
print(json.dumps(loaded))
"""


def test_the_sdk_imports_without_heavy_dependencies() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE % {"heavy": HEAVY}],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"import envhub": [], "envhub.Env": [], "whole SDK": []}
