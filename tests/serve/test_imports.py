"""The server's dependencies stay out of `import envhub` and out of the client."""

from __future__ import annotations

import json
import subprocess
import sys

SERVER = ("starlette", "uvicorn")

_PROBE = """
import json, sys
loaded = {}
import envhub, envhub.loader
loaded["import envhub"] = sorted(m for m in %(mods)r if m in sys.modules)
import envhub.serve.remote
loaded["envhub.serve.remote"] = sorted(m for m in %(mods)r if m in sys.modules)
print(json.dumps(loaded))
"""


def test_neither_envhub_nor_the_client_imports_the_server_or_the_network_clients() -> None:
    modules = (*SERVER, "websockets", "httpx", "aiohttp")
    result = subprocess.run(
        [sys.executable, "-c", _PROBE % {"mods": modules}], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    # websockets, httpx and aiohttp load when a RemoteEnv connects, not when its module is imported.
    assert json.loads(result.stdout) == {"import envhub": [], "envhub.serve.remote": []}
