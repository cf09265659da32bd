"""A local envd: e2b's in-VM agent protocol on 127.0.0.1, running commands in a LocalSandbox.

The real e2b SDK talks to it unchanged (``E2BSandbox(debug=True, sandbox_url=server.url,
http_version="1.1")``), so the e2b backend is tested end to end without e2b's cloud, and
benchmarks can measure the SDK's own overhead. It serves:

- ``/process.Process/*`` (Connect RPC, through the service stubs shipped in the e2b wheel):
  ``Start`` runs the command line in a fresh :class:`~envhub.sandbox.LocalSandbox` run whose
  working folder holds the files uploaded under the command's ``cwd``; ``SendSignal`` kills
  it; output is streamed back when the run ends;
- ``GET|POST /files?path=``: a flat in-memory file store (what a run leaves in its working
  folder is stored back under its ``cwd``).

A test and bench fixture: one process, no auth, no persistence, no PTY, no live stdin; the
store keeps every run's files until the server stops. Run it in its own process
(:func:`local_envd_process`, or ``python tests/sandbox/envd_local.py``) when the SDK is used
from the same program. A test helper, not part of the package (tests beside it import it
relatively; ``bench/`` puts this folder on ``sys.path``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from envhub.defaults import free_port
from envhub.sandbox.base import Limits
from envhub.sandbox.local import LocalSandbox
from envhub.sandbox.outputs import ALL_FILES

_CHUNK = 1 << 15


class _Process:
    """The ``process.Process`` service."""

    def __init__(self, box: LocalSandbox, store: dict[str, bytes], limits: Limits) -> None:
        self.box, self.store, self.limits = box, store, limits
        self.pids = itertools.count(1000)
        self.running: dict[int, asyncio.Task[Any]] = {}

    def start(self, request: Any, ctx: Any) -> AsyncIterator[Any]:
        return self._start(request)

    async def _start(self, request: Any) -> AsyncIterator[Any]:
        from e2b.envd.process.process_pb import ProcessEvent, StartResponse
        from protobuf import Oneof

        def event(kind: str, value: Any) -> Any:
            return StartResponse(event=ProcessEvent(event=Oneof(kind, value)))

        pid = next(self.pids)
        config = request.process
        task = asyncio.ensure_future(self._run([config.cmd, *config.args], config.cwd or ""))
        self.running[pid] = task
        yield event("start", ProcessEvent.StartEvent(pid=pid))
        try:
            result = await task
        except asyncio.CancelledError:
            yield event(
                "end", ProcessEvent.EndEvent(exit_code=-9, exited=False, status="signal: killed")
            )
            return
        finally:
            self.running.pop(pid, None)
        for name, data in (("stdout", result.stdout.encode()), ("stderr", result.stderr.encode())):
            for i in range(0, len(data), _CHUNK):
                yield event(
                    "data", ProcessEvent.DataEvent(output=Oneof(name, data[i : i + _CHUNK]))
                )
        code = result.exit_code if result.exit_code is not None else -9
        yield event(
            "end",
            ProcessEvent.EndEvent(
                exit_code=code, exited=result.exit_code is not None, status=f"exit status {code}"
            ),
        )

    async def _run(self, argv: list[str], cwd: str) -> Any:
        prefix = cwd.rstrip("/") + "/" if cwd else None
        files = {
            path[len(prefix) :]: data
            for path, data in self.store.items()
            if prefix and path.startswith(prefix)
        }
        result = await self.box.arun(
            argv, files=files, output_files=[ALL_FILES] if prefix else (), limits=self.limits
        )
        if prefix:
            for path in [p for p in self.store if p.startswith(prefix)]:
                del self.store[path]
            self.store.update({prefix + path: data for path, data in result.files.items()})
        return result

    def __getattr__(self, name: str) -> Any:
        """The service's other methods (List, Connect, Update, stdin, ...) are not served."""

        async def unimplemented(*args: Any) -> Any:
            from connectrpc.code import Code
            from connectrpc.errors import ConnectError

            raise ConnectError(Code.UNIMPLEMENTED, f"the local envd does not serve {name}")

        return unimplemented

    async def send_signal(self, request: Any, ctx: Any) -> Any:
        from e2b.envd.process.process_pb import SendSignalResponse

        task = self.running.get(request.process.selector.value)
        if task is not None:
            task.cancel()
        return SendSignalResponse()


async def _files(scope: dict[str, Any], receive: Any, send: Any, store: dict[str, bytes]) -> None:
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    request = Request(scope, receive)
    path = request.query_params.get("path", "")
    if request.method == "GET":
        if path not in store:
            response: Response = JSONResponse(
                {"code": 404, "message": f"path '{path}' does not exist"}, status_code=404
            )
        else:
            response = Response(store[path], media_type="application/octet-stream")
    elif request.headers.get("content-type", "").startswith("multipart/form-data"):
        written = []
        async with request.form() as form:
            for _, upload in form.multi_items():
                target = path or upload.filename
                store[target] = await upload.read()
                written.append({"name": target.rsplit("/", 1)[-1], "type": "file", "path": target})
        response = JSONResponse(written)
    else:
        store[path] = await request.body()
        response = JSONResponse([{"name": path.rsplit("/", 1)[-1], "type": "file", "path": path}])
    await response(scope, receive, send)


class LocalEnvd:
    """Serve the envd protocol on 127.0.0.1 from a thread.

    Args:
        sandbox: Runs the commands (default: a new :class:`~envhub.sandbox.LocalSandbox`).
        limits: The outer limits of each run (the e2b backend sets its own rlimits inside).
        port: Port to bind (0: any free port).
    """

    def __init__(
        self, sandbox: LocalSandbox | None = None, limits: Limits | None = None, port: int = 0
    ) -> None:
        self.sandbox = sandbox or LocalSandbox()
        self.store: dict[str, bytes] = {}
        self.service = _Process(
            self.sandbox, self.store, limits or Limits(wall_time=600, output_bytes=64 << 20)
        )
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def app(self) -> Any:
        """The ASGI application."""
        from e2b.envd.process.process_connect import ProcessASGIApplication

        rpc = ProcessASGIApplication(self.service)  # type: ignore[arg-type]

        async def route(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["path"].startswith("/process.Process/"):
                await rpc(scope, receive, send)
            elif scope["type"] == "http" and scope["path"] == "/files":
                await _files(scope, receive, send, self.store)
            elif scope["type"] == "http":
                from starlette.responses import Response

                await Response(status_code=204 if scope["path"] == "/health" else 404)(
                    scope, receive, send
                )

        return route

    def start(self) -> LocalEnvd:
        """Start serving; returns when the server accepts connections."""
        import uvicorn

        config = uvicorn.Config(
            self.app(), host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, daemon=True, name="envhub-local-envd"
        )
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the local envd could not start on port {self.port}")
            threading.Event().wait(0.01)
        return self

    def stop(self) -> None:
        """Ask the server to exit and wait up to 10 s for its thread to end."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> LocalEnvd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def local_envd_process(
    port: int = 0, base_uid: int = 61500, timeout: float = 60.0
) -> Iterator[str]:
    """Run a :class:`LocalEnvd` in a child process; yields its URL, stops it on exit.

    The e2b SDK's transport threads and the sandbox's forks are then in different processes:
    forking a process whose foreign (non-Python) threads may hold libc locks can leave a child
    stuck before it execs.
    """
    import subprocess
    import sys
    import time

    port = port or free_port()
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),  # a script: this folder is no package of an installed one
        "--port",
        str(port),
        "--base-uid",
        str(base_uid),
    ]
    proc = subprocess.Popen(argv)
    try:
        deadline = time.monotonic() + timeout
        while not _answers(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the local envd did not start (exit status {proc.poll()})")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _answers(port: int) -> bool:
    with contextlib.closing(socket.socket()) as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def main() -> None:
    """``python tests/sandbox/envd_local.py --port 49983``: serve until interrupted."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(
        description="A local envd (e2b's in-VM protocol) backed by the local sandbox."
    )
    parser.add_argument("--port", type=int, default=49983)
    parser.add_argument("--base-uid", type=int, default=61500)
    args = parser.parse_args()
    server = LocalEnvd(LocalSandbox(base_uid=args.base_uid), port=args.port).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
