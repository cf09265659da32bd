"""The OpenEnv adapter against real OpenEnv servers (openenv-core's FastAPI app under uvicorn on
127.0.0.1), and `envhub serve --protocol openenv` driven by OpenEnv's own client.

Run as a script (`python test_openenv.py PORT`), this file serves the echo-guess env itself:
the test that kills a server mid-episode needs one in its own process.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

pytest.importorskip("openenv.core")

import uvicorn  # noqa: E402
from fastmcp import FastMCP  # noqa: E402
from openenv.core import GenericEnvClient  # noqa: E402
from openenv.core.env_server import (  # noqa: E402
    Action,
    Environment,
    Observation,
    State,
    create_fastapi_app,
)
from openenv.core.env_server.mcp_environment import MCPEnvironment  # noqa: E402
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation  # noqa: E402

import envhub  # noqa: E402
from envhub.defaults import free_port
from envhub.errors import (  # noqa: E402
    EnvhubError,
    EnvLoadError,
    EnvNotFoundError,
    RemoteEnvUnavailableError,
)
from envhub.rollout.runner import RolloutRunner  # noqa: E402
from envhub.testing import ByteChatTokenizer, ScriptedEngine, null_policy  # noqa: E402
from envhub.types import Message, ToolCall  # noqa: E402

WORDS = ("apple", "river", "stone", "cloud", "ember", "maple")
TURNS = 4


class SayAction(Action):
    message: str


class EchoObservation(Observation):
    echoed_message: str = ""
    message_length: int = 0


class EchoGuessEnvironment(Environment):
    """Echoes each message; pays 1 and ends when the message is the word the seed picked,
    ends unpaid after TURNS messages."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)
        self.word = ""

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Any:
        self.word = random.Random(seed).choice(WORDS)
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(echoed_message=f"Say the word: {self.word}", reward=0.0)

    def step(self, action: Any, timeout_s: float | None = None, **_: Any) -> Any:
        self._state.step_count += 1
        said = action.message.strip()
        won = said == self.word
        return EchoObservation(
            echoed_message=said,
            message_length=len(said),
            done=won or self._state.step_count >= TURNS,
            reward=1.0 if won else 0.0,
        )

    @property
    def state(self) -> State:
        return self._state


class TaggedAction(Action):
    message: str
    tag: int


class CountObservation(Observation):
    count: int = 0


def say_the_word(messages: list[Message], tools: Any) -> str:
    """Wrong once, then the word from the prompt."""
    if sum(m.role == "assistant" for m in messages) == 0:
        return "pear"
    return messages[0].content.rsplit(" ", 1)[-1]


def wait_healthy(port: int, alive: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while True:
        assert alive(), "the server died while starting"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)


def echo_app(action: type = SayAction, observation: type = EchoObservation) -> Any:
    return create_fastapi_app(EchoGuessEnvironment, action, observation, max_concurrent_envs=64)


def start_thread_server(app: Any) -> tuple[uvicorn.Server, threading.Thread, int]:
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_healthy(port, thread.is_alive)
    return server, thread, port


@pytest.fixture(scope="module")
def servers() -> Iterator[Callable[[Any], str]]:
    """`start(app)` serves an ASGI app in a thread; its base URL. All stop with the module."""
    running: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(app: Any) -> str:
        server, thread, port = start_thread_server(app)
        running.append((server, thread))
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in running:
        server.should_exit = True
        thread.join(timeout=15)


@pytest.fixture(scope="module")
def echo_url(servers: Callable[[Any], str]) -> str:
    return servers(echo_app())


# -- the adapter on an OpenEnv server -------------------------------------------------------


def drive_with_openenv_client(url: str, seed: int, actions: list[str]) -> list[tuple]:
    async def run() -> list[tuple]:
        async with GenericEnvClient(base_url=url) as client:
            first = await client.reset(seed=seed)
            seen = [(first.observation["echoed_message"], first.reward, first.done)]
            for text in actions:
                result = await client.step({"message": text})
                seen.append((result.observation["echoed_message"], result.reward, result.done))
                if result.done:
                    break
            return seen

    return asyncio.run(run())


def drive_with_adapter(env: envhub.Env, seed: int, actions: list[str]) -> list[tuple]:
    [prompt], info = env.reset(seed=seed)
    assert info["observation"]["message_length"] == 0
    seen = [(prompt.content, 0.0, False)]
    for text in actions:
        [reply], reward, terminated, truncated, info = env.step(text)
        assert (reply.role, truncated, info["turn"]) == ("user", False, len(seen))
        seen.append((reply.content, reward, terminated))
        if terminated:
            break
    return seen


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_the_adapter_sees_what_openenvs_own_client_sees(echo_url: str, seed: int) -> None:
    word = random.Random(seed).choice(WORDS)
    actions = ["hello", "", word, "never sent"]
    with envhub.make(f"openenv:{echo_url}") as env:
        assert (env.action_field, env.observation_field) == ("message", "echoed_message")
        assert env.name == "openenv:EchoGuessEnvironment"
        ours = drive_with_adapter(env, seed, actions)
    theirs = drive_with_openenv_client(echo_url, seed, actions)
    assert ours == theirs
    assert ours[-1] == (word, 1.0, True) and len(ours) == 4


def test_max_turns_truncates_an_episode_the_env_has_not_ended(echo_url: str) -> None:
    env = envhub.make(f"openenv:{echo_url}?max_turns=2", system_prompt="Be brief.")
    prompt, _ = env.reset(seed=0)
    assert [m.role for m in prompt] == ["system", "user"]
    assert env.step("a")[2:4] == (False, False)
    assert env.step("b")[2:4] == (False, True)
    [reply], _, terminated, truncated, info = env.step("c")  # as OpenEnv: the server answers
    assert (reply.content, terminated, truncated, info["turn"]) == ("c", False, True, 3)
    env.close()


def test_a_step_after_done_is_answered_as_openenvs_client_is(echo_url: str) -> None:
    word = random.Random(1).choice(WORDS)
    actions = [word, "again", "and again"]

    async def theirs() -> list[tuple]:
        async with GenericEnvClient(base_url=echo_url) as client:
            await client.reset(seed=1)
            seen = []
            for text in actions:
                result = await client.step({"message": text})
                seen.append((result.observation["echoed_message"], result.reward, result.done))
            return seen

    with envhub.make(f"openenv:{echo_url}") as env:
        with pytest.raises(EnvhubError, match=r"call reset\(\) before step\(\)"):
            env.step("too early")
        env.reset(seed=1)
        ours = [(r[0][0].content, r[1], r[2]) for r in map(env.step, actions)]
    assert ours == asyncio.run(theirs())
    assert ours[0] == (word, 1.0, True) and ours[1] == ("again", 0.0, False)


def test_check_env_passes_on_an_openenv_server(echo_url: str) -> None:
    report = envhub.check_env(envhub.make(f"openenv:{echo_url}", reward_range=(0.0, 1.0)))
    assert report.passed, report.failures


def roll_out(make: Callable[[], envhub.Env], policy: Any, tasks: list[int]) -> list[Any]:
    engine = ScriptedEngine(policy, ByteChatTokenizer())
    runner = RolloutRunner(engine, make, max_concurrency=2, seed=3)
    return asyncio.run(runner.run(tasks, samples_per_task=2))


def test_the_runner_runs_episodes_on_an_openenv_server(echo_url: str) -> None:
    make = lambda: envhub.make(f"openenv:{echo_url}")  # noqa: E731
    won = roll_out(make, say_the_word, [0, 1])
    assert [(t.outcome, t.reward, len(t.turns)) for t in won] == [("ok", 1.0, 2)] * 4
    lost = roll_out(make, null_policy, [0])
    assert [(t.outcome, t.reward, len(t.turns), t.terminated) for t in lost] == [
        ("ok", 0.0, TURNS, True)
    ] * 2


def test_how_an_action_with_a_non_text_field_is_mapped(servers: Callable[[Any], str]) -> None:
    url = servers(echo_app(TaggedAction, CountObservation))  # only its /schema is read
    env = envhub.make(f"openenv:{url}")
    assert (env.action_mode, env.action_field, env.observation_field) == ("tool", "message", None)
    [tool] = env.tool_schemas
    assert tool["function"]["name"] == "tagged"
    assert tool["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "message": {"title": "Message", "type": "string"},
            "tag": {"title": "Tag", "type": "integer"},
        },
        "required": ["message", "tag"],
        "additionalProperties": False,
    }
    [prompt], _ = env.reset(seed=0)  # no string field in the observation's schema: JSON
    word = random.Random(0).choice(WORDS)
    assert prompt.content == f'{{"echoed_message": "Say the word: {word}", "message_length": 0}}'
    [reply], *_ = env.step(call("tagged", message="hi", tag=1))
    assert reply.content == '{"echoed_message": "hi", "message_length": 2}'
    env.close()
    with pytest.raises(EnvLoadError, match=r"needs \['tag'\] besides the text field 'message'"):
        envhub.make(f"openenv:{url}", action_field="message")
    with pytest.raises(EnvLoadError, match=r"has no field 'words'"):
        envhub.make(f"openenv:{url}", action_field="words")
    with pytest.raises(EnvLoadError, match=r"not a CallToolAction"):
        envhub.make(f"openenv:{url}", action_mode="mcp")
    with pytest.raises(EnvLoadError, match=r"action_mode must be one of"):
        envhub.make(f"openenv:{url}", action_mode="json")
    env = envhub.make(f"openenv:{url}", action_defaults={"tag": 1})
    assert (env.action_mode, env.action_defaults, env.tool_schemas) == ("text", {"tag": 1}, None)
    env.close()
    env = envhub.make(f"openenv:{url}", action_mode="tool", action_defaults={"tag": 1})
    assert env.tool_schemas[0]["function"]["parameters"]["properties"].keys() == {"message"}
    env.close()
    with pytest.raises(EnvNotFoundError, match="by its URL"):
        envhub.make("openenv:echo")


def test_an_unreachable_server_is_an_infrastructure_error() -> None:
    with pytest.raises(RemoteEnvUnavailableError, match="cannot reach"):
        envhub.make(f"openenv:http://127.0.0.1:{free_port()}")


@pytest.fixture
def process_server() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    process = subprocess.Popen([sys.executable, __file__, str(port)])
    wait_healthy(port, lambda: process.poll() is None)
    yield process, f"http://127.0.0.1:{port}"
    if process.poll() is None:
        process.kill()
        process.wait()


def test_an_openenv_server_killed_mid_episode_is_an_infra_failure(
    process_server: tuple[subprocess.Popen[bytes], str],
) -> None:
    process, url = process_server

    def kill_then_answer(messages: list[Message], tools: Any) -> str:
        if len(messages) == 3:  # the episode is under way: the server dies now
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
        return say_the_word(messages, tools)

    engine = ScriptedEngine(kill_then_answer)
    make = lambda: envhub.make(f"openenv:{url}", timeout=5)  # noqa: E731
    killed, after = asyncio.run(RolloutRunner(engine, make, max_concurrency=1).run([0, 1]))
    assert (killed.outcome, after.outcome) == ("infra_failure", "infra_failure")
    [error] = killed.errors
    assert (error.stage, error.type, error.turn, error.infra) == (
        "env.step",
        "RemoteEnvUnavailableError",
        1,
        True,
    )
    assert "the OpenEnv session was lost mid-episode" in error.message
    [error] = after.errors  # the next episode cannot start: the server is gone
    assert error.infra and "cannot reach" in error.message


# -- typed actions: an int field, and MCP tools ---------------------------------------------


class GuessAction(Action):
    """Guess the secret number."""

    number: int = Field(description="Your guess, 1 to 20")


class HintObservation(Observation):
    hint: str = ""


class GuessNumberEnvironment(Environment):
    """The seed picks a number in 1..20; each guess is answered higher/lower; a right guess pays
    1 and ends the episode."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)
        self.secret = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Any:
        self.secret = random.Random(seed).randint(1, 20)
        self._state = State(episode_id=episode_id, step_count=0)
        return HintObservation(hint="Guess my number, 1 to 20.")

    def step(self, action: Any, timeout_s: float | None = None, **_: Any) -> Any:
        self._state.step_count += 1
        right = action.number == self.secret
        hint = "right" if right else "higher" if action.number < self.secret else "lower"
        return HintObservation(hint=hint, done=right, reward=1.0 if right else 0.0)

    @property
    def state(self) -> State:
        return self._state


class CounterEnvironment(MCPEnvironment):
    """MCP tools `add` and `submit`: submitting pays 1 if the counter reached the target the
    seed picked, and ends the episode."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("counter")

        @mcp.tool
        def add(amount: int) -> int:
            """Add `amount` to the counter; returns the new total."""
            self.total += amount
            return self.total

        @mcp.tool
        def submit() -> str:
            """End the episode with the counter as it is."""
            return f"submitted {self.total}"

        super().__init__(mcp)
        self.total, self.target = 0, 0
        self._state = State(step_count=0)

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, quiet: bool = False, **_: Any
    ) -> Any:
        self.total, self.target = 0, random.Random(seed).randint(5, 9)
        self._state = State(episode_id=episode_id, step_count=0)
        if quiet:
            return Observation()
        return HintObservation(hint=f"Make the counter reach {self.target}, then submit.")

    async def step_async(self, action: Any, timeout_s: float | None = None, **kw: Any) -> Any:
        observation = await super().step_async(action, timeout_s=timeout_s, **kw)
        if isinstance(action, CallToolAction) and action.tool_name == "submit":
            observation.done = True
            observation.reward = 1.0 if self.total == self.target else 0.0
        return observation

    def _step_impl(self, action: Any, timeout_s: float | None = None, **_: Any) -> Any:
        return HintObservation(hint="call a tool")

    @property
    def state(self) -> State:
        return self._state


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture(scope="module")
def guess_url(servers: Callable[[Any], str]) -> str:
    app = create_fastapi_app(
        GuessNumberEnvironment, GuessAction, HintObservation, max_concurrent_envs=8
    )
    return servers(app)


@pytest.fixture(scope="module")
def counter_url(servers: Callable[[Any], str]) -> str:
    app = create_fastapi_app(
        CounterEnvironment, CallToolAction, CallToolObservation, max_concurrent_envs=8
    )
    return servers(app)


def search_guess(messages: list[Message], tools: Any) -> str:
    """Bisect 1..20 from the hints so far (one guess a turn; failed turns are skipped)."""
    low, high = 1, 20
    for said, hint in zip(messages, messages[1:], strict=False):
        if said.role == "assistant" and hint.content in ("higher", "lower"):
            number = json.loads(said.content.split(">", 1)[1].split("</", 1)[0])["arguments"]
            if hint.content == "higher":
                low = number["number"] + 1
            else:
                high = number["number"] - 1
    return call("guess", number=(low + high) // 2)


def test_an_int_field_action_is_a_tool_the_model_calls(guess_url: str) -> None:
    env = envhub.make(f"openenv:{guess_url}")
    assert (env.action_mode, env.observation_field) == ("tool", "hint")
    assert env.tool_schemas == [
        {
            "type": "function",
            "function": {
                "name": "guess",
                "description": "Guess the secret number.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "number": {
                            "description": "Your guess, 1 to 20",
                            "title": "Number",
                            "type": "integer",
                        }
                    },
                    "required": ["number"],
                    "additionalProperties": False,
                },
            },
        }
    ]
    secret = random.Random(4).randint(1, 20)
    [prompt], _ = env.reset(seed=4)
    assert prompt.content == "Guess my number, 1 to 20."
    wrong = 1 if secret != 1 else 2  # a structured call, as an OpenAI-compatible server sends it
    structured = Message(
        role="assistant", content="", tool_calls=(ToolCall.make("c7", "guess", {"number": wrong}),)
    )
    [reply], reward, terminated, _, info = env.step(structured)
    assert (reply.tool_call_id, reply.content, reward, terminated) == ("c7", "higher", 0.0, False)
    [reply], reward, terminated, truncated, info = env.step(call("guess", number=secret))
    assert (reply.role, reply.name, reply.content) == ("tool", "guess", "right")
    assert (reward, terminated, truncated, info["observation"]) == (
        1.0,
        True,
        False,
        {"hint": "right"},
    )
    assert info["metrics"] == {"tool_calls": 2}
    env.close()
    [won] = roll_out(lambda: envhub.make(f"openenv:{guess_url}"), search_guess, [0])[:1]
    assert (won.outcome, won.reward, won.metrics["tool_calls"]) == ("ok", 1.0, len(won.turns))


def test_replies_the_action_schema_rejects_are_the_policys_failed_turns(guess_url: str) -> None:
    script = iter(
        [
            call("guess", number="five"),  # not an integer
            call("gues", number=3),  # no such tool
            "I think it is 3.",  # no call at all
            '<tool_call>{"name": "guess", "arguments": {"number": 3</tool_call>',  # bad JSON
            call("guess", number=3, extra=1),  # a field the action does not have
        ]
    )
    replies: list[list[Message]] = []

    def policy(messages: list[Message], tools: Any) -> str:
        if len(messages) > 1:
            replies.append([m for m in messages[-1:]])
        return next(script, None) or search_guess(messages, tools)

    make = lambda: envhub.make(f"openenv:{guess_url}", invalid_reward=-0.25)  # noqa: E731
    [episode] = asyncio.run(RolloutRunner(ScriptedEngine(policy), make, seed=0).run([0]))
    metrics = {k: v for k, v in episode.metrics.items() if k.startswith(("tool", "invalid"))}
    assert metrics == {
        "tool_calls": float(len(episode.turns) - 1),  # every turn one call, but the third
        "tool_errors": 4.0,
        "tool_error/invalid_arguments": 2.0,
        "tool_error/unknown_tool": 1.0,
        "tool_error/parse_error": 1.0,
        "invalid_turns": 5.0,
    }
    assert episode.outcome == "ok" and [t.reward for t in episode.turns][:5] == [-0.25] * 5
    texts = [m.content for [m] in replies[:5]]
    assert (
        texts[0]
        == "Error: invalid arguments for guess: argument 'number': 'five' is not of type 'integer'"
    )
    assert texts[1].startswith("Error: there is no tool named 'gues'. Did you mean 'guess'?")
    assert texts[2] == "Error: this reply called no tool; act by calling one of the tools: guess"
    assert texts[4] == "Error: invalid arguments for guess: unexpected argument 'extra'"
    assert [m.role for [m] in replies[:5]] == ["tool", "tool", "user", "tool", "tool"]


def test_check_env_passes_on_typed_and_mcp_envs(guess_url: str, counter_url: str) -> None:
    for url in (guess_url, counter_url):
        report = envhub.check_env(envhub.make(f"openenv:{url}", reward_range=(0.0, 1.0)))
        assert report.passed, report.failures


def test_a_policy_that_never_acts_validly_runs_out_of_turns(guess_url: str) -> None:
    make = lambda: envhub.make(f"openenv:{guess_url}", max_turns=3)  # noqa: E731
    [episode] = asyncio.run(RolloutRunner(ScriptedEngine(null_policy), make).run([0]))
    assert (episode.outcome, episode.reward, len(episode.turns)) == ("policy_failure", 0.0, 3)
    assert episode.metrics["invalid_turns"] == 3.0 and episode.errors == []


def test_mcp_tools_are_the_models_tools(counter_url: str) -> None:
    env = envhub.make(f"openenv:{counter_url}")
    assert env.action_mode == "mcp"
    assert [t["function"]["name"] for t in env.tool_schemas] == ["add", "submit"]
    assert env.tool_schemas[0]["function"]["parameters"] == {
        "type": "object",
        "additionalProperties": False,
        "properties": {"amount": {"type": "integer"}},
        "required": ["amount"],
    }
    target = random.Random(2).randint(5, 9)
    [prompt], _ = env.reset(seed=2)
    assert prompt.content == f"Make the counter reach {target}, then submit."
    turn = call("add", amount=2) + call("add", amount="x") + call("add", amount=target - 2)
    replies, reward, terminated, _, info = env.step(turn)
    assert [(m.role, m.name, m.content) for m in replies] == [
        ("tool", "add", "2"),
        (
            "tool",
            "add",
            "Error: invalid arguments for add: argument 'amount': 'x' is not of type 'integer'",
        ),
        ("tool", "add", str(target)),
    ]
    assert (reward, terminated) == (0.0, False)
    replies, reward, terminated, _, info = env.step(call("multiply", amount=2))
    assert replies[0].content.startswith("Error: there is no tool named 'multiply'")
    [reply], reward, terminated, _, info = env.step(call("submit"))
    assert (reply.content, reward, terminated) == (f"submitted {target}", 1.0, True)
    assert info["metrics"] == {
        "tool_calls": 5,
        "tool_errors": 2,
        "tool_error/invalid_arguments": 1,
        "tool_error/unknown_tool": 1,
        "invalid_turns": 1,
    }
    env.close()


def test_a_turn_stops_at_the_call_that_ends_the_episode(counter_url: str) -> None:
    with envhub.make(f"openenv:{counter_url}") as env:
        [prompt], _ = env.reset(options={"quiet": True})  # an empty observation
        assert prompt.content == "The environment is ready. Act by calling its tools: add, submit."
        env.reset(seed=0)
        replies, reward, terminated, _, info = env.step(call("submit") + call("add", amount=1))
        assert [m.content for m in replies] == ["submitted 0", "Error: not run: the episode ended"]
        assert (reward, terminated, info["metrics"]) == (0.0, True, {"tool_calls": 2})
        [reply], *_ = env.step(call("add", amount=4))  # after done: the server still answers
        assert reply.content == "4"


def counter_policy(messages: list[Message], tools: Any) -> str:
    if len(messages) > 2:
        return call("submit")
    target = int(messages[0].content.split()[4].rstrip(","))
    return call("add", amount=1) + call("add", amount=target - 1)


def test_the_runner_runs_an_mcp_env(counter_url: str) -> None:
    make = lambda: envhub.make(f"openenv:{counter_url}")  # noqa: E731
    episodes = roll_out(make, counter_policy, [0, 1])
    assert [(t.outcome, t.reward, len(t.turns)) for t in episodes] == [("ok", 1.0, 2)] * 4
    assert {t.metrics["tool_calls"] for t in episodes} == {3.0}
    assert [t.tools[0]["function"]["name"] for t in episodes] == ["add"] * 4


class ShoutAction(Action):
    message: str

    @field_validator("message")
    @classmethod
    def shouted(cls, value: str) -> str:
        if value != value.upper():  # not in the JSON schema: only the server can tell
            raise PydanticCustomError("shout", "shout it")
        return value


def test_an_action_the_server_rejects_is_the_policys_failed_turn(
    servers: Callable[[Any], str],
) -> None:
    url = servers(echo_app(ShoutAction))
    with envhub.make(f"openenv:{url}") as env:
        assert env.action_mode == "text"
        env.reset(seed=0)
        [reply], reward, terminated, truncated, info = env.step("quiet please")
        assert reply.role == "user" and reply.content.startswith(
            "Error: the env rejected the action as invalid: {'message': 'quiet please'}"
        )
        assert (reward, terminated, info["metrics"]) == (0.0, False, {"invalid_turns": 1})
        [reply], *_ = env.step("LOUD")
        assert reply.content == "LOUD"


class MiscountingEnvironment(EchoGuessEnvironment):
    """A bug in the env's own step: it builds an observation pydantic refuses."""

    def step(self, action: Any, timeout_s: float | None = None, **_: Any) -> Any:
        return EchoObservation(echoed_message=action.message, message_length="many")


def test_a_validation_error_inside_the_envs_own_step_is_the_envs_failure(
    servers: Callable[[Any], str],
) -> None:
    # OpenEnv answers both with VALIDATION_ERROR; only the action's own is the policy's turn.
    app = create_fastapi_app(MiscountingEnvironment, SayAction, EchoObservation)
    url = servers(app)
    engine = ScriptedEngine(lambda messages, tools: "hello")
    make = lambda: envhub.make(f"openenv:{url}")  # noqa: E731
    [episode] = asyncio.run(RolloutRunner(engine, make, max_concurrency=1).run([0]))
    assert episode.outcome == "env_failure"
    [error] = episode.errors
    assert (error.stage, error.type, error.turn) == ("env.step", "RemoteEnvError", 0)
    assert error.message == (
        f"openenv:MiscountingEnvironment at {url}: the env's own step failed a validation that "
        "is not about the action (message_length: Input should be a valid integer, unable to "
        "parse string as an integer): a bug in the env"
    )


# -- envhub serve --protocol openenv, driven by OpenEnv's own client ------------------------


@pytest.fixture(scope="module")
def calculator_url(servers: Callable[[Any], str]) -> str:
    from envhub.serve.openenv_protocol import build_openenv_app
    from envhub.serve.server import ServeSettings

    return servers(build_openenv_app(ServeSettings(env="calculator")))


def local_episode(seed: int) -> list[tuple[str, float, bool]]:
    from envhub.envs.calculator import reference_policy

    env = envhub.make("calculator")
    messages, _ = env.reset(seed=seed)
    seen, done = [], False
    while not done:
        reply, reward, terminated, truncated, _ = env.step(reference_policy(messages, None))
        messages = [*messages, Message(role="assistant", content="x"), *reply]
        seen.append(("\n\n".join(m.content or "" for m in reply), reward, terminated or truncated))
        done = terminated or truncated
    return seen


def openenv_client_episode(url: str, seed: int) -> list[tuple[str, float, bool]]:
    from envhub.envs.calculator import reference_policy

    async def run() -> list[tuple[str, float, bool]]:
        async with GenericEnvClient(base_url=url) as client:
            result = await client.reset(seed=seed)
            assert result.observation["tools"][0]["function"]["name"] == "calculate"
            messages = [Message.model_validate(m) for m in result.observation["messages"]]
            seen: list[tuple[str, float, bool]] = []
            while not result.done:
                text = reference_policy(messages, None)
                result = await client.step({"message": text})
                reply = [Message.model_validate(m) for m in result.observation["messages"]]
                messages = [*messages, Message(role="assistant", content=text), *reply]
                seen.append((result.observation["text"], result.reward, result.done))
            state = await client.state()
            assert state["step_count"] == len(seen)
            return seen

    return asyncio.run(run())


@pytest.mark.parametrize("seed", [0, 3])
def test_openenvs_client_gets_the_local_envs_rewards_from_envhub_serve(
    calculator_url: str, seed: int
) -> None:
    remote = openenv_client_episode(calculator_url, seed)
    assert remote == local_episode(seed)
    assert [reward for _, reward, _ in remote] == [0.0, 1.0]


def test_the_adapter_drives_envhub_serve_in_the_openenv_protocol(calculator_url: str) -> None:
    from envhub.envs.calculator import reference_policy

    env = envhub.make(f"openenv:{calculator_url}")
    assert (env.action_field, env.observation_field, env.name) == (
        "message",
        "text",
        "openenv:calculator",
    )
    runner = RolloutRunner(ScriptedEngine(reference_policy), lambda: env, max_concurrency=1)
    [trajectory] = asyncio.run(runner.run([2]))
    assert (trajectory.outcome, trajectory.reward) == ("ok", 1.0)


def test_the_openenv_protocols_http_routes(calculator_url: str) -> None:
    with httpx.Client(base_url=calculator_url) as http:
        assert http.get("/health").json() == {"status": "healthy"}
        assert set(http.get("/schema").json()) == {"action", "observation", "state"}
        assert http.post("/step", json={"action": {"message": "hi"}}).status_code == 409
        reset = http.post("/reset", json={"seed": 1, "episode_id": "e1"}).json()
        assert (reset["reward"], reset["done"]) == (None, False)
        step = http.post("/step", json={"action": {"message": "\\boxed{0}"}}).json()
        assert step["observation"]["messages"] == [] and isinstance(step["reward"], float)
        assert http.get("/state").json() == {"episode_id": "e1", "step_count": 1}
        bad = http.post("/step", json={"action": {"words": "x"}})
        assert (bad.status_code, bad.json()["code"]) == (422, "VALIDATION_ERROR")


def test_the_openenv_protocol_refuses_a_token_it_could_not_check() -> None:
    from envhub.errors import ConfigError
    from envhub.serve.openenv_protocol import build_openenv_app
    from envhub.serve.server import ServeSettings

    with pytest.raises(ConfigError, match="OpenEnv's client sends no credentials"):
        build_openenv_app(ServeSettings(env="calculator", token="s3cret"))


def test_envhub_serve_protocol_openenv_from_the_command_line() -> None:
    port = free_port()
    command = [sys.executable, "-m", "envhub.cli", "serve", "calculator", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--protocol", "openenv"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL
    )
    try:
        wait_healthy(port, lambda: process.poll() is None)
        assert openenv_client_episode(f"http://127.0.0.1:{port}", 0) == local_episode(0)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=15)
    log = process.stderr.read().decode()  # type: ignore[union-attr]
    assert f"sessions on ws://127.0.0.1:{port}/ws" in log


if __name__ == "__main__":  # the server of test_an_openenv_server_killed_mid_episode_...
    uvicorn.run(echo_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
