"""Harness envs driven by the rollout runner: real ``openai`` SDK programs against the endpoint,
a scripted token-level engine, and the token record checked token by token."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from envhub.harness import HarnessEnv
from envhub.rewards.rubric import Rubric, reward
from envhub.rollout.runner import RolloutRunner
from envhub.state import State
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.types import Message, Trajectory

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
TASKS = [{"question": "What is 2 + 3 + 4?", "answer": "9"}]


@reward
def correct(state: State, answer: str) -> float:
    """1 when the program's result says the answer."""
    return float(answer in str(state.data.get("result")))


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def adder_policy(messages: list[Message], tools: Any) -> str:
    """Adds 2 + 3, then 5 + 4, then answers: three calls of a program's loop."""
    results = [m.content for m in messages if m.role == "tool"]
    if not results:
        return "Let me add. " + call("add", a=2, b=3)
    if len(results) == 1:
        return call("add", a=int(results[0]), b=4)
    return f"The answer is {results[-1]}."


def run_tool(tool_call: Any) -> str:
    arguments = json.loads(tool_call.function.arguments)
    return str(arguments["a"] + arguments["b"])


async def chat_agent(client: Any, prompt: str) -> str:
    """An ``openai``-SDK tool loop, as people write them."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You add numbers with the add tool."},
        {"role": "user", "content": prompt},
    ]
    while True:
        response = await client.chat.completions.create(
            model="anything", messages=messages, tools=[ADD]
        )
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content
        for tool_call in message.tool_calls:
            messages.append(
                {"role": "tool", "tool_call_id": tool_call.id, "content": run_tool(tool_call)}
            )


async def streaming_chat_agent(client: Any, prompt: str) -> str:
    """The same loop over ``stream=True``, assembling the chunks as SDK users do."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You add numbers with the add tool."},
        {"role": "user", "content": prompt},
    ]
    while True:
        stream = await client.chat.completions.create(
            model="anything", messages=messages, tools=[ADD], stream=True
        )
        text, calls = "", {}
        async for chunk in stream:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            text += delta.content or ""
            for part in delta.tool_calls or ():
                entry = calls.setdefault(part.index, {"id": part.id, "name": "", "arguments": ""})
                entry["name"] += part.function.name or ""
                entry["arguments"] += part.function.arguments or ""
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls.values()
            ]
        messages.append(message)
        if not calls:
            return text
        for c in calls.values():
            arguments = json.loads(c["arguments"])
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": c["id"],
                    "content": str(arguments["a"] + arguments["b"]),
                }
            )


def rollout(
    env_factory: Any, policy: Any, tasks: list[int] | None = None, **kwargs: Any
) -> list[Trajectory]:
    engine = ScriptedEngine(policy, ByteChatTokenizer())
    runner = RolloutRunner(engine, env_factory, **kwargs)
    return asyncio.run(runner.run(tasks or [0]))


def sampled_runs(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of 1s in a loss mask."""
    runs, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append((start, i))
            start = None
    return runs


def expected_turn_ids(traj: Trajectory) -> list[list[int]]:
    tokenizer = ByteChatTokenizer()
    return [
        tokenizer.encode(m.content or "") + [tokenizer.eos_token_id]
        for m in traj.messages
        if m.role == "assistant"
    ]


def assert_token_exact(traj: Trajectory) -> None:
    """The record is the template's rendering of the recorded conversation (the last turn ends on
    its sampled end token), the sampled turns sit exactly where the mask is 1, and nothing else
    is in the loss."""
    tokenizer = ByteChatTokenizer()
    rendered = tokenizer.render_sync(traj.messages, traj.tools, add_generation_prompt=False)
    assert traj.token_ids == rendered[:-1]
    runs = sampled_runs(traj.loss_mask)
    assert [traj.token_ids[a:b] for a, b in runs] == expected_turn_ids(traj)
    assert sum(traj.loss_mask) == sum(len(ids) for ids in expected_turn_ids(traj))
    assert traj.prompt_token_count == runs[0][0]


def assert_adder_episode(traj: Trajectory) -> None:
    """The 3-call adder episode (:func:`adder_policy`) as one token record: ok, rewarded, no
    prefix break; the conversation as the program built it (its tool results answer the parsed
    calls), recorded token for token."""
    assert traj.errors == [] and traj.outcome == "ok"
    assert traj.reward == 1.0 and traj.reward_components == {"correct": 1.0}
    assert [t.tool_calls for t in traj.turns] == [1, 1, 0]
    assert traj.metrics["segments"] == 1 and traj.metrics["prefix_breaks"] == 0
    assert traj.segments == []
    assert [m.role for m in traj.messages] == [
        "system", "user", "assistant", "tool", "assistant", "tool", "assistant",
    ]  # fmt: skip
    assert traj.messages[0].content == "You add numbers with the add tool."
    assert [m.content for m in traj.messages if m.role == "tool"] == ["5", "9"]
    assert [t["function"]["name"] for t in traj.tools] == ["add"]
    assert_token_exact(traj)


def test_a_three_call_tool_episode_records_exactly_the_sampled_tokens() -> None:
    env = lambda: HarnessEnv(chat_agent, TASKS, rubric=Rubric([correct]))  # noqa: E731
    (traj,) = rollout(env, adder_policy)
    assert_adder_episode(traj)
    assert traj.tools == [ADD]


def test_streaming_and_plain_calls_record_the_same_episode() -> None:
    plain = rollout(lambda: HarnessEnv(chat_agent, TASKS, rubric=Rubric([correct])), adder_policy)
    streamed = rollout(
        lambda: HarnessEnv(streaming_chat_agent, TASKS, rubric=Rubric([correct])), adder_policy
    )
    for a, b in zip(plain, streamed, strict=True):
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask
        assert a.messages == b.messages and a.reward == b.reward == 1.0


async def forgetful_agent(client: Any, prompt: str) -> str:
    """Keeps only the last tool result on its second call (a history rewrite)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    first = await client.chat.completions.create(model="m", messages=messages, tools=[ADD])
    tool_call = first.choices[0].message.tool_calls[0]
    summary = [{"role": "user", "content": f"{prompt} (so far: {run_tool(tool_call)})"}]
    second = await client.chat.completions.create(model="m", messages=summary, tools=[ADD])
    return second.choices[0].message.content


def test_a_rewritten_history_starts_a_second_segment() -> None:
    def policy(messages: list[Message], tools: Any) -> str:
        return call("add", a=2, b=3) if "so far" not in messages[-1].content else "9"

    (traj,) = rollout(lambda: HarnessEnv(forgetful_agent, TASKS, rubric=Rubric([correct])), policy)
    assert traj.outcome == "ok" and traj.reward == 1.0
    assert traj.metrics["segments"] == 2 and traj.metrics["prefix_breaks"] == 1
    tokenizer = ByteChatTokenizer()
    (first,) = traj.segments
    turn0, turn1 = (m for m in traj.messages if m.role == "assistant")
    first_prompt = tokenizer.render_sync(traj.messages[:1], [ADD], add_generation_prompt=True)
    assert first.token_ids == first_prompt + tokenizer.encode(turn0.content) + [257]
    assert first.loss_mask == [0] * len(first_prompt) + [1] * (
        len(first.token_ids) - len(first_prompt)
    )
    assert first.first_turn == 0
    second_prompt = tokenizer.render_sync(traj.messages[-2:-1], [ADD], add_generation_prompt=True)
    assert traj.token_ids == second_prompt + tokenizer.encode("9") + [257]
    assert traj.loss_mask == [0] * len(second_prompt) + [1, 1]
    assert traj.prompt_token_count == len(second_prompt)


def test_turn_credit_puts_each_segments_turns_advantages_on_its_own_tokens() -> None:
    """The two-segment episode above and a one-turn episode that answers wrong, in one group:
    with ``credit: turn`` (GRPO per turn position, gamma 1), turn 0 (in the first segment) is
    compared with the other episode's turn 0, turn 1 (the last record's) is alone at its
    position; each turn's advantage lies on exactly its own sampled tokens."""
    from envhub.trainer.batch import build_batch
    from envhub.trainer.config import AlgorithmConfig

    def policy(messages: list[Message], tools: Any) -> str:
        return call("add", a=2, b=3) if "so far" not in messages[-1].content else "9"

    (split,) = rollout(lambda: HarnessEnv(forgetful_agent, TASKS, rubric=Rubric([correct])), policy)
    (wrong,) = rollout(
        lambda: HarnessEnv(chat_agent, TASKS, rubric=Rubric([correct])), lambda m, t: "8"
    )
    wrong = wrong.model_copy(update={"group_id": split.group_id})
    batch = build_batch([split, wrong], AlgorithmConfig(credit="turn"), max_tokens=64)
    main, segment, other = batch.samples
    a = 0.5 / 0.5**0.5  # GRPO over returns (1.0, 0.0) at turn 0
    (first,) = split.segments
    assert (segment.trajectory, segment.token_ids) == (0, first.token_ids)
    assert segment.token_advantages == pytest.approx([a * m for m in first.loss_mask], rel=1e-5)
    assert main.token_advantages == [0.0] * len(split.token_ids)  # turn 1: alone, 0
    assert other.token_advantages == pytest.approx([-a * m for m in wrong.loss_mask], rel=1e-5)
    assert batch.stats["batch/segments_skipped"] == 0.0


def test_a_stored_harness_episode_replays_through_its_program_for_a_rescore() -> None:
    """``envhub rescore``'s replay: the program is run again and fed the stored turns; the
    two-segment episode comes out with the same reward and conversation, and no divergence."""
    from envhub.rollout.replay import replay_episode

    def policy(messages: list[Message], tools: Any) -> str:
        return call("add", a=2, b=3) if "so far" not in messages[-1].content else "9"

    make = lambda: HarnessEnv(forgetful_agent, TASKS, rubric=Rubric([correct]))  # noqa: E731
    (traj,) = rollout(make, policy)
    env = make()
    try:
        replayed = asyncio.run(replay_episode(env, traj))
    finally:
        env.close()
    assert replayed.divergence is None and replayed.errors == []
    assert (replayed.reward, replayed.components) == (1.0, {"correct": 1.0})
    assert replayed.metrics["segments"] == 2 and replayed.state.data["result"] == "9"
    assert replayed.state.messages == traj.messages


async def echo_agent(client: Any, task: dict[str, Any]) -> str:
    """Two calls; each reply must name this episode's own tag."""
    tag = task["tag"]
    messages = [{"role": "user", "content": f"tag {tag}"}]
    for _ in range(2):
        reply = await client.chat.completions.create(model="m", messages=messages)
        text = reply.choices[0].message.content
        assert text == f"echo {tag}", f"episode {tag} got {text!r}"
        messages += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": f"again {tag}"},
        ]
    return tag


def test_64_concurrent_episodes_never_see_each_others_calls() -> None:
    tasks = [{"question": f"T{i}", "tag": f"T{i}", "answer": f"T{i}"} for i in range(64)]

    def policy(messages: list[Message], tools: Any) -> str:
        return "echo " + messages[-1].content.split()[-1]

    env = lambda: HarnessEnv(echo_agent, tasks, rubric=Rubric([correct]))  # noqa: E731
    trajectories = rollout(env, policy, list(range(64)), max_concurrency=64)
    assert [t.errors for t in trajectories] == [[]] * 64
    assert [t.outcome for t in trajectories] == ["ok"] * 64
    assert [t.reward for t in trajectories] == [1.0] * 64
    for i, traj in enumerate(trajectories):
        texts = " ".join(m.content or "" for m in traj.messages)
        assert {word for word in texts.split() if word.startswith("T")} == {f"T{i}"}


def test_the_runs_sampling_wins_and_each_override_is_said_once(
    caplog: Any, monkeypatch: Any
) -> None:
    import envhub.harness.env as harness_env

    monkeypatch.setattr(harness_env, "_warned", set())

    async def hot_agent(client: Any, prompt: str) -> str:
        for _ in range(2):
            reply = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": prompt}], temperature=1.7
            )
        return reply.choices[0].message.content

    with caplog.at_level(logging.WARNING, logger="envhub.harness.env"):
        trajectories = rollout(lambda: HarnessEnv(hot_agent, TASKS), lambda m, t: "9", [0, 0])
    assert [t.outcome for t in trajectories] == ["ok", "ok"]
    said = [r.getMessage() for r in caplog.records if "temperature" in r.getMessage()]
    assert len(said) == 1 and "the run's sampling settings are used" in said[0]
