"""MCP tools against a real MCP server (tests/tools/mcp_server.py) over stdio and streamable HTTP:
the server's schemas, results, errors, timeouts, a server lost mid-episode, and its process."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types
import pytest

from envhub.checks.checker import check_env
from envhub.defaults import free_port
from envhub.errors import ToolServerUnavailableError
from envhub.multiturn import ToolEnv
from envhub.rewards.match import exact_match
from envhub.rewards.rubric import Rubric
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ScriptedEngine
from envhub.tools.mcp import MCPToolEnv, MCPTools, result_text
from envhub.types import ErrorRecord, Message, is_infrastructure_error, tool_message

SERVER = Path(__file__).with_name("mcp_server.py")
STDIO = MCPTools.stdio(sys.executable, [str(SERVER)])
TASKS = [
    {"question": "What is 2 + 3?", "answer": "5"},
    {"question": "What is 40 + 2?", "answer": "42"},
]


def hermes(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


def solve(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Adds the question's two numbers with the server's ``add``, then boxes the result."""
    if messages[-1].role == "tool":
        return f"\\boxed{{{messages[-1].content}}}"
    question = next(m.content or "" for m in messages if m.role == "user")
    a, b = (int(word) for word in question.rstrip("?").split() if word.isdigit())
    return hermes("add", {"a": a, "b": b})


class Adder(MCPToolEnv):
    """Add two numbers with the MCP server's ``add``."""

    name = "mcp-adder"
    server = STDIO
    reference_policy = staticmethod(solve)

    def load_dataset(self) -> list[dict[str, Any]]:
        return TASKS

    def default_rubric(self) -> Rubric:
        return Rubric([exact_match()])


def load_server() -> Any:
    spec = importlib.util.spec_from_file_location("envhub_test_mcp_server", SERVER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.server


def start_http_server() -> tuple[subprocess.Popen[bytes], MCPTools]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)], stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return process, MCPTools.http(f"http://127.0.0.1:{port}/mcp")
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("the MCP test server did not start listening")


def gone(pid: int, within: float = 5.0) -> bool:
    """Whether process ``pid`` has exited and been reaped (no zombie) within ``within`` s."""
    deadline = time.monotonic() + within
    while os.path.exists(f"/proc/{pid}"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def exited(pid: int) -> None:
    """Wait until ``pid`` is dead (reaped or a zombie): a killed server is really gone."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z":
                return
        except (FileNotFoundError, IndexError):
            return
        time.sleep(0.01)


@pytest.fixture(scope="module")
def http_server() -> Iterator[MCPTools]:
    process, spec = start_http_server()
    yield spec
    process.kill()
    process.wait()


@pytest.fixture(params=["stdio", "http"])
def server(request: pytest.FixtureRequest) -> MCPTools:
    return STDIO if request.param == "stdio" else request.getfixturevalue("http_server")


def test_the_tool_schemas_are_the_servers(server: MCPTools) -> None:
    listing = asyncio.run(load_server().list_tools())  # the server's own listing, in-process
    with Adder(server=server) as env:
        env.reset(seed=0)
        assert env.tool_schemas == [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.input_schema,
                },
            }
            for t in listing
        ]
        assert [t.name for t in listing] == ["add", "fail", "slow", "pid"]


def test_results_errors_and_timeouts_become_tool_messages(server: MCPTools) -> None:
    with Adder(server=server, tool_timeout=0.5) as env:
        env.reset(seed=0, options={"task_index": 0})
        observation, _, terminated, _, _ = env.step(hermes("add", {"a": 2, "b": 3}))
        assert (observation, terminated) == ([tool_message("5", "call_1_1", "add")], False)
        text = (
            hermes("fail", {"reason": "no such file"})
            + hermes("add", {"a": "two", "b": 3})
            + hermes("add", {"a": 2})
            + hermes("slow", {"seconds": 30})
            + hermes("add", {"a": 2, "b": 3})
        )
        observation, _, terminated, _, _ = env.step(text)
        assert [m.content for m in observation] == [
            "Error: fail raised MCPToolError: Error executing tool fail: no such file",
            "Error: invalid arguments for add: argument 'a': 'two' is not of type 'integer'",
            "Error: invalid arguments for add: missing required argument 'b'",
            "Error: slow did not finish within 0.5 s",
            "5",  # the timed-out call did not take the session with it
        ]
        assert not terminated
        _, reward, terminated, _, info = env.step("It is \\boxed{5}.")
        assert (reward, terminated) == (1.0, True)
        assert info["metrics"] == {
            "tool_calls": 6,
            "tool_errors": 4,
            "tool_error/tool_error": 1,
            "tool_error/invalid_arguments": 2,
            "tool_error/timeout": 1,
        }


def test_check_env_passes_and_close_ends_the_server_process() -> None:
    env = Adder()
    env.reset(seed=0)
    pid = env.toolset["pid"]()
    assert os.path.exists(f"/proc/{pid}")
    report = check_env(env)  # closes the env at the end
    assert report.passed, str(report)
    assert gone(pid), "the stdio server outlived env.close() (or is a zombie)"
    env.close()  # idempotent


def test_a_connection_gives_tools_that_any_tool_env_can_use() -> None:
    with STDIO.connect() as connection:
        env = ToolEnv(TASKS, tools=connection.tools)
        env.reset(seed=0)
        assert env.step(hermes("add", {"a": 40, "b": 2}))[0] == [
            tool_message("42", "call_1_1", "add")
        ]
        pid = env.toolset["pid"]()
    assert not connection.alive
    assert gone(pid)


def test_a_server_killed_mid_episode_is_an_infrastructure_failure_and_reset_reconnects() -> None:
    killed: list[int] = []

    def policy(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        last = messages[-1]
        if last.role != "tool":
            return hermes("pid", {})
        if last.name == "pid":
            if not killed:  # the first episode loses its server between two calls
                killed.append(int(last.content or ""))
                os.kill(killed[0], signal.SIGKILL)
                exited(killed[0])
            return hermes("add", {"a": 2, "b": 3})
        return f"\\boxed{{{last.content}}}"

    runner = RolloutRunner(ScriptedEngine(policy), Adder, max_concurrency=1)
    first, second = asyncio.run(runner.run([0, 0]))
    assert first.outcome == "infra_failure"
    assert first.errors == [
        ErrorRecord(
            stage="env.step",
            type="ToolServerUnavailableError",
            message=f"{STDIO} is gone (MCPError: Connection closed)",
            turn=1,
            infra=True,
        )
    ]
    # The same env (a pool of one) was reset for the next episode and started a new server.
    assert (second.outcome, second.reward) == ("ok", 1.0)
    second_pid = int(next(m.content for m in second.messages if m.name == "pid") or "")
    assert second_pid != killed[0]
    assert gone(second_pid), "the runner closed the env, so its server must be gone"


def test_an_http_server_lost_mid_episode_fails_the_step_as_infrastructure() -> None:
    process, spec = start_http_server()
    try:
        with Adder(server=spec) as env:
            env.reset(seed=0)
            assert env.step(hermes("add", {"a": 1, "b": 1}))[0][0].content == "2"
            process.kill()
            process.wait()
            with pytest.raises(ToolServerUnavailableError, match="is gone") as caught:
                env.step(hermes("add", {"a": 1, "b": 1}))
            assert is_infrastructure_error(caught.value)
            with pytest.raises(ToolServerUnavailableError, match="cannot connect"):
                env.reset(seed=0)
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize(
    "spec",
    [
        MCPTools.stdio(sys.executable, ["-c", "import sys; sys.exit(3)"]),
        MCPTools.http(f"http://127.0.0.1:{free_port()}/mcp"),
    ],
    ids=["stdio-exits", "http-refused"],
)
def test_a_server_that_cannot_be_reached_fails_reset_as_infrastructure(spec: MCPTools) -> None:
    message = re.escape(f"cannot connect to {spec}: ")
    with Adder(server=spec) as env, pytest.raises(ToolServerUnavailableError, match=message):
        env.reset(seed=0)


def test_non_text_content_is_described() -> None:
    png = base64.b64encode(b"\x89PNG" + bytes(96)).decode()
    result = mcp_types.CallToolResult(
        content=[
            mcp_types.TextContent(text="two files:"),
            mcp_types.ImageContent(data=png, mime_type="image/png"),
            mcp_types.ResourceLink(name="notes", uri="file:///tmp/notes.txt"),
            mcp_types.EmbeddedResource(
                resource=mcp_types.TextResourceContents(uri="file:///a.txt", text="hello")
            ),
            mcp_types.EmbeddedResource(
                resource=mcp_types.BlobResourceContents(
                    uri="file:///b.bin", blob=png, mime_type="application/octet-stream"
                )
            ),
        ]
    )
    assert result_text(result).splitlines() == [
        "two files:",
        "[image: image/png, 100 bytes]",
        "[resource link: notes <file:///tmp/notes.txt>]",
        "hello",
        "[resource: file:///b.bin, application/octet-stream]",
    ]
    structured = mcp_types.CallToolResult(content=[], structured_content={"result": 5})
    assert result_text(structured) == '{"result": 5}'


def test_envhub_imports_no_mcp_until_a_connection_opens() -> None:
    probe = "import sys, envhub, envhub.tools, envhub.tools.mcp; print('mcp' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "False"
