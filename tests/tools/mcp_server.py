"""A tiny MCP server for tests/tools/test_mcp.py, written with the MCP SDK's own server API.

Run ``python mcp_server.py`` for stdio, ``python mcp_server.py http PORT`` for streamable HTTP
on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("envhub-test", log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def fail(reason: str) -> str:
    """Always fails, saying why."""
    raise ToolError(reason)


@server.tool()
async def slow(seconds: float) -> str:
    """Answer after ``seconds``."""
    await asyncio.sleep(seconds)
    return "done"


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
