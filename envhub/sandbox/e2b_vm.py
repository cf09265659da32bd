"""One command in an e2b VM, and its files: what :class:`~envhub.sandbox.e2b.E2BSandbox`'s runs
and :class:`~envhub.sandbox.e2b_session.E2BSession`'s calls share (both import this module; it
imports neither). The e2b SDK is imported when a function needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from envhub.sandbox.calls import ExecResult, Limits, classify_exit


async def write_files(vm: Any, folder: str, files: dict[str, bytes]) -> None:
    """Write ``files`` (paths relative to ``folder``) into the VM."""
    from e2b.sandbox.filesystem.filesystem import WriteEntry

    await vm.files.write_files(
        [WriteEntry(path=f"{folder}/{path}", data=data) for path, data in files.items()]
    )


async def read_files(vm: Any, folder: str, wanted: list[str]) -> dict[str, bytes]:
    """The files of ``wanted`` (relative to ``folder``) that exist in the VM."""
    found = {}
    for path in wanted:
        with contextlib.suppress(Exception):  # a missing file is simply not returned
            found[path] = bytes(await vm.files.read(f"{folder}/{path}", format="bytes"))
    return found


async def execute(vm: Any, line: str, folder: str, limits: Limits) -> ExecResult:
    """Run the shell ``line`` in ``folder``, killed past ``limits.wall_time`` or past
    ``limits.output_bytes`` of stdout or stderr, as the local backend does."""
    from e2b import CommandExitException

    out, err, over = bytearray(), bytearray(), asyncio.Event()

    def keep(buffer: bytearray) -> Any:
        def on_data(text: str) -> None:
            data = text.encode("utf-8", errors="replace")
            room = limits.output_bytes - len(buffer)
            buffer.extend(data[: max(room, 0)])
            if len(data) > room:
                over.set()

        return on_data

    loop = asyncio.get_running_loop()
    started = loop.time()
    handle = await vm.commands.run(
        line, background=True, cwd=folder, on_stdout=keep(out), on_stderr=keep(err), timeout=0
    )
    waiter = asyncio.ensure_future(handle.wait())
    watch = asyncio.ensure_future(over.wait())
    exit_code, killed_for = None, None
    try:
        done, _ = await asyncio.wait(
            {waiter, watch}, timeout=limits.wall_time, return_when=asyncio.FIRST_COMPLETED
        )
        if waiter in done:
            try:
                exit_code = waiter.result().exit_code
            except CommandExitException as e:
                exit_code = e.exit_code
        else:
            killed_for = "output_limit" if watch in done else "timeout"
            with contextlib.suppress(Exception):  # it may have ended meanwhile
                await handle.kill()
    finally:
        watch.cancel()
        if not waiter.done():
            waiter.cancel()
    seconds = loop.time() - started
    stdout, stderr = out.decode("utf-8", errors="replace"), err.decode("utf-8", errors="replace")
    if exit_code is not None and exit_code < 0:  # envd reports death by signal n as -n
        exit_code = 128 - exit_code
    reason = killed_for or classify_exit(exit_code or 0, stderr)
    return ExecResult(stdout, stderr, exit_code, reason, seconds)  # type: ignore[arg-type]
