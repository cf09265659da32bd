"""RemoteEnv against a real server: the same episodes as the local env, the env contract, the
URL's arguments, and the env's own errors coming through as such."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import envhub
from envhub import registry
from envhub.errors import RemoteEnvError
from envhub.serve.remote import RemoteEnv, parse_url
from envhub.testing import Policy, replay
from envhub.types import Message, assistant

ENVS = ("calculator", "guess-number")
SCHEMES = ("ws", "http")


@pytest.fixture(scope="module")
def servers(serve: Callable[..., Any]) -> dict[str, Any]:
    return {name: serve(name) for name in ENVS}


def episode(env: envhub.Env, seed: int, policy: Policy) -> list[Any]:
    """Everything the env said in one episode: the reset, then each step's five values."""
    observation, info = env.reset(seed=seed)
    said: list[Any] = [(observation, info, env.tool_schemas)]
    conversation = list(observation)
    for _ in range(20):
        action = policy(conversation, env.tool_schemas)
        result = env.step(action)
        said.append(result)
        conversation += [assistant(action), *result[0]]
        if result[2] or result[3]:
            return said
    raise AssertionError("the episode did not end")


def policies(name: str) -> list[Policy]:
    local = envhub.make(name)
    junk = replay("no idea", '<tool_call>{"name": "calculate", "arguments": {}}</tool_call>')
    return [local.reference_policy, junk]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("name", ENVS)
def test_a_remote_env_says_exactly_what_the_local_one_says(
    servers: dict[str, Any], name: str, scheme: str
) -> None:
    local, remote = envhub.make(name), envhub.make(servers[name].url(scheme))
    for seed in (0, 7):
        for policy in policies(name):
            assert episode(remote, seed, policy) == episode(local, seed, policy)
    assert (remote.name, remote.version, remote.reward_range) == (
        local.name,
        local.version,
        local.reward_range,
    )
    assert (remote.max_turns, remote.tool_schemas) == (local.max_turns, local.tool_schemas)
    remote.close()


def test_observations_and_infos_keep_their_types(servers: dict[str, Any]) -> None:
    remote = envhub.make(servers["calculator"].url())
    observation, _ = remote.reset(seed=3)
    assert all(type(m) is Message for m in observation)
    tool_call = '<tool_call>{"name": "calculate", "arguments": {"expression": "1+1"}}</tool_call>'
    remote.step(tool_call)
    *_, info = remote.step("\\boxed{nope}")
    assert info["errors"] == [] and info["reward_components"] == {
        "correct": 0.0,
        "tool_validity": 1.0,
    }
    remote.close()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_check_env_passes_on_a_remote_env(servers: dict[str, Any], scheme: str) -> None:
    report = envhub.check_env(envhub.make(servers["calculator"].url(scheme)))
    assert report.passed, report.failures


def test_query_and_keyword_arguments_make_the_env(servers: dict[str, Any]) -> None:
    url = servers["guess-number"].url() + "?max_turns=2"
    remote = envhub.make(url)
    assert remote.max_turns == 2 and remote.env_args == {"max_turns": 2}
    remote.reset(seed=0)
    assert remote.step("1")[3] is False
    assert remote.step("2")[3] is True  # truncated after two turns
    remote.close()
    assert envhub.make(url, max_turns=3).max_turns == 3  # keywords win over the query


def test_arguments_the_env_rejects_fail_at_make_with_the_loaders_message(
    servers: dict[str, Any],
) -> None:
    with pytest.raises(RemoteEnvError, match="raised EnvLoadError in create: env 'calculator'"):
        envhub.make(servers["calculator"].url(), colour="red")


def test_an_error_of_the_env_is_raised_with_its_class_and_message(
    servers: dict[str, Any],
) -> None:
    remote = envhub.make(servers["calculator"].url())
    with pytest.raises(RemoteEnvError, match=r"raised EnvhubError in step: calculator: call rese"):
        remote.step("hello")
    try:
        envhub.make("calculator").step("hello")
    except envhub.errors.EnvhubError as local:
        assert str(local) == "calculator: call reset() before step()"
    remote.close()


def test_a_wrong_env_name_in_the_url_is_refused_at_make(servers: dict[str, Any]) -> None:
    for scheme in SCHEMES:
        with pytest.raises(RemoteEnvError, match="this server serves 'calculator', not 'wordle'"):
            RemoteEnv(servers["calculator"].url(scheme, env="wordle"))


def test_urls_split_into_endpoint_and_json_arguments() -> None:
    assert parse_url("ws://h:1/calculator?max_turns=3&name=x&flag=true") == (
        "ws://h:1/calculator",
        {"max_turns": 3, "name": "x", "flag": True},
    )
    with pytest.raises(envhub.errors.ConfigError, match="not a remote env URL"):
        parse_url("ftp://h/x")


def test_close_frees_the_session_on_the_server(servers: dict[str, Any]) -> None:
    server = servers["calculator"]
    before = server.metrics()["sessions_open"]
    remote = envhub.make(server.url("http"))
    assert server.metrics()["sessions_open"] == before + 1
    remote.close()
    remote.close()
    server.wait_for("sessions_open", before)


def test_a_remote_task_envs_state_follows_the_local_one(servers: dict[str, Any]) -> None:
    local, remote = envhub.make("calculator"), envhub.make(servers["calculator"].url())
    tool_call = '<tool_call>{"name": "calculate", "arguments": {"expression": "2*3"}}</tool_call>'
    for env in (local, remote):
        env.reset(seed=1)
        env.step(tool_call)
        env.step('<tool_call>{"name": "calculate"}</tool_call>')  # no arguments: a tool error

    def view(env: Any) -> tuple[Any, ...]:
        s = env.state
        return s.messages, s.prompt, s.turn, s.tokens, dict(s.metrics), s.stop_reason

    assert view(remote) == view(local)
    assert remote.state.messages[2].tool_calls and remote.state.metrics["tool_errors"] == 1
    cut = [asyncio.run(env.atruncate("max_tokens")) for env in (local, remote)]
    assert cut[1] == cut[0] and cut[1][1]["stop_reason"] == "max_tokens"
    assert view(remote) == view(local) and remote.state.reward_components
    remote.close()


def test_async_calls_run_on_the_callers_loop_over_its_own_connection(
    servers: dict[str, Any],
) -> None:
    server = servers["guess-number"]
    remote = envhub.make(server.url())  # its session is opened over the I/O thread's connection
    connections = server.metrics()["connections_open"]

    async def episode() -> Any:
        await remote.areset(seed=0)
        assert server.metrics()["connections_open"] == connections + 1  # this loop's own
        return await remote.astep("5")

    first, second = asyncio.run(episode()), asyncio.run(episode())  # a second loop, same session
    assert first == second
    server.wait_for("connections_open", connections)  # each loop's connection closed with it
    assert remote.reset(seed=0) and remote.step("5") == first
    remote.close()


def test_a_plain_env_has_no_state_and_cannot_be_truncated(serve: Callable[..., Any]) -> None:
    class Plain(envhub.Env):
        name = "plain-for-serve"

        def reset(self, *, seed: Any = None, options: Any = None) -> Any:
            return [], {}

        def step(self, action: Any) -> Any:
            return [], 0.0, True, False, {}

    envhub.register(Plain.name, Plain, override=True)
    try:
        remote = envhub.make(serve(Plain.name).url())
        remote.reset()
        assert remote.state is None
        with pytest.raises(RemoteEnvError, match="plain-for-serve is not a TaskEnv"):
            asyncio.run(remote.atruncate("max_tokens"))
        remote.close()
    finally:  # later tests list the registry (`envhub list`'s layout tests)
        registry._registered.pop(Plain.name, None)


def test_one_sessions_steps_take_the_protocols_direct_line(
    servers: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With this uvicorn, a session's frames are started where their bytes arrive (the direct
    line of envhub/serve/timeouts.py): a uvicorn whose internals changed would quietly serve
    every frame the slow way, which only this test notices."""
    from envhub.serve.app.ws_route import WebSocketHandler

    taken: list[bool] = []
    direct = WebSocketHandler._direct

    def counted(self: WebSocketHandler, *args: Any) -> bool:
        taken.append(direct(self, *args))
        return taken[-1]

    monkeypatch.setattr(WebSocketHandler, "_direct", counted)
    remote = envhub.make(servers["guess-number"].url("ws"))
    remote.reset(seed=0)
    for guess in (50, 25, 75):
        remote.step(f"<guess>{guess}</guess>")
    remote.close()
    assert taken.count(True) >= 3  # at least the three steps (reset and close may go too)
