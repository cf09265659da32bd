"""Agent programs for the program-host tests, in a module the host's child process imports
(functions in a test module itself are not importable there under pytest's module names)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

from envhub.harness import PolicyFailure


async def ask(client: Any) -> str:
    """One call, its reply's text."""
    reply = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    return reply.choices[0].message.content


async def gives_up(client: Any) -> str:
    """Gives up on the policy's first reply."""
    await ask(client)
    raise PolicyFailure("the reply named no tool")


async def breaks(client: Any) -> str:
    """Crashes after one call."""
    await ask(client)
    raise RuntimeError("the agent's parser broke")


async def returns_a_lock(client: Any) -> Any:
    """Returns what does not pickle."""
    await ask(client)
    return threading.Lock()


async def waits_after_a_call(client: Any, task: dict[str, Any]) -> str:
    """Calls once, then waits until stopped; writes ``task['marker']`` when it is cancelled."""
    await ask(client)
    try:
        await asyncio.sleep(3600)
        return "never"
    except asyncio.CancelledError:
        Path(task["marker"]).write_text("cancelled")
        raise


async def reports_pid(client: Any, task: dict[str, Any]) -> str:
    """Writes its process id to ``task['marker']``, then keeps calling (the test kills it)."""
    Path(task["marker"]).write_text(str(os.getpid()))
    await ask(client)
    await ask(client)
    return "never"
