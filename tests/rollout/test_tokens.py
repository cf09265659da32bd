"""The token contract, token by token: ids exactly as sampled, the loss mask, sampler logprobs.

Every expected list is built by hand from the byte tokenizer's ChatML layout

    <|im_start|>{role}\\n{content}<|im_end|>\\n   per message, then <|im_start|>assistant\\n

so a change in how the runner stitches turns together shows up as a wrong token at a known place.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from typing import Any

from envhub.envs.calculator import SYSTEM_PROMPT, CalculatorEnv, calculate, reference_policy
from envhub.inference.base import GenerateRequest, Generation, InferenceEngine, SamplingParams
from envhub.rollout.runner import RolloutRunner
from envhub.rollout.tokens import TokenTrace, _env_part, _turn_closing, common_prefix_length
from envhub.testing import ByteChatTokenizer, Policy, ScriptedEngine
from envhub.types import Message, Trajectory, tool_message

IM_START, IM_END, NL = 256, 257, 10
GEN = [IM_START, *b"assistant\n"]
THINK = "<think>Use the tool.</think>\n"


def text(s: str) -> list[int]:
    return list(s.encode())


def message(role: str, content: str) -> list[int]:
    return [IM_START, *text(f"{role}\n{content}"), IM_END, NL]


def logprobs(n: int) -> list[float]:
    """What the test engines report for a turn of n tokens: distinct, so misplacement shows."""
    return [-(k + 1) / 64 for k in range(n)]


def assert_tokens(actual: Sequence[Any] | None, expected: Sequence[Any]) -> None:
    assert actual is not None
    for i, (a, e) in enumerate(zip(actual, expected, strict=False)):
        assert a == e, (
            f"position {i}: got {a!r}, expected {expected[i]!r} "
            f"(context {list(expected[max(0, i - 5) : i + 5])})"
        )
    assert len(actual) == len(expected)


class LoggingEngine(ScriptedEngine):
    """Scripted engine that reports distinct logprobs and remembers each request's prompt ids."""

    def __init__(self, policy: Policy, tokenizer: ByteChatTokenizer) -> None:
        super().__init__(policy, tokenizer)
        self.prompts: list[list[int] | None] = []

    async def generate(self, request: GenerateRequest) -> Generation:
        self.prompts.append(request.prompt_ids)
        generation = await super().generate(request)
        assert generation.token_ids is not None
        return generation.model_copy(update={"logprobs": logprobs(len(generation.token_ids))})


class ThinkStrippingTokenizer(ByteChatTokenizer):
    """A template that drops ``<think>`` blocks from earlier assistant turns, as Qwen3's does."""

    _THINK = re.compile(r"<think>.*?</think>\n*", re.DOTALL)

    def render_sync(
        self,
        messages: Sequence[Message],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> list[int]:
        stripped = [
            m.model_copy(update={"content": self._THINK.sub("", m.content or "")})
            if m.role == "assistant"
            else m
            for m in messages
        ]
        return super().render_sync(stripped, tools, add_generation_prompt)


def thinking(policy: Policy) -> Policy:
    return lambda messages, tools: THINK + policy(messages, tools)


def rollout(engine: InferenceEngine, max_tokens: int = 512) -> Trajectory:
    runner = RolloutRunner(
        engine,
        lambda: CalculatorEnv(num_tasks=4),
        sampling=SamplingParams(max_tokens=max_tokens),
        max_concurrency=1,
    )
    (trajectory,) = asyncio.run(runner.run([0]))
    return trajectory


TASK = CalculatorEnv(num_tasks=4).dataset[0]
EXPRESSION = TASK["question"].removeprefix("Compute: ")
ANSWER = TASK["answer"]
PROMPT = (
    message(
        "system", SYSTEM_PROMPT + "\n\n# Tools\n" + json.dumps(calculate.schema, sort_keys=True)
    )
    + message("user", TASK["question"])
    + GEN
)
CALL = (
    '<tool_call>\n{"name": "calculate", '
    f'"arguments": {{"expression": "{EXPRESSION}"}}}}\n</tool_call>'
)
FINAL = f"The result is \\boxed{{{ANSWER}}}."
# where "<think>..." (sampled) and "<tool_call>..." (re-rendered without the think block) part
DRIFT = {
    "turn": 1,
    "position": len(PROMPT) + len("<t"),
    "recorded": text("hink>Use"),
    "rendered": text("ool_call"),
}


def test_the_hand_built_pieces_are_what_the_policy_and_env_produce() -> None:
    assert TASK["question"] == f"Compute: {EXPRESSION}"
    assert reference_policy([Message(role="user", content=TASK["question"])], None) == CALL
    assert reference_policy([tool_message(ANSWER, "call_1_1")], None) == FINAL


def test_a_tool_episode_token_by_token() -> None:
    engine = LoggingEngine(reference_policy, ByteChatTokenizer())
    trajectory = rollout(engine)
    assert (
        trajectory.reward,
        trajectory.stop_reason,
        trajectory.errors,
        trajectory.token_drift,
    ) == (1.0, "terminated", [], [])

    turn1 = text(CALL) + [IM_END]
    glue = [NL]  # what the template writes after <|im_end|> of an assistant turn
    tool = message("tool", ANSWER)
    turn2 = text(FINAL) + [IM_END]
    assert_tokens(trajectory.token_ids, PROMPT + turn1 + glue + tool + GEN + turn2)
    assert_tokens(
        trajectory.loss_mask,
        [0] * len(PROMPT) + [1] * len(turn1) + [0] * len(glue + tool + GEN) + [1] * len(turn2),
    )
    assert_tokens(
        trajectory.sampler_logprobs,
        [0.0] * len(PROMPT)
        + logprobs(len(turn1))
        + [0.0] * len(glue + tool + GEN)
        + logprobs(len(turn2)),
    )
    assert trajectory.prompt_token_count == len(PROMPT)

    # the engine generated each turn from exactly the recorded tokens
    assert engine.prompts == [PROMPT, PROMPT + turn1 + glue + tool + GEN]
    assert [
        (t.prompt_tokens, t.completion_tokens, t.finish_reason, t.tool_calls, t.tool_errors)
        for t in trajectory.turns
    ] == [
        (len(PROMPT), len(turn1), "stop", 1, 0),
        (len(PROMPT + turn1 + glue + tool + GEN), len(turn2), "stop", 0, 0),
    ]
    assert trajectory.metrics["total_tokens"] == len(trajectory.token_ids or [])
    assert (
        trajectory.metrics["completion_tokens"]
        == len(turn1) + len(turn2)
        == sum(trajectory.loss_mask or [])
    )


def test_a_template_that_rewrites_past_turns_is_recorded_as_drift_and_the_tokens_stay_exact() -> (
    None
):
    engine = LoggingEngine(thinking(reference_policy), ThinkStrippingTokenizer())
    trajectory = rollout(engine)
    assert (trajectory.reward, trajectory.errors) == (1.0, [])

    turn1 = text(THINK + CALL) + [IM_END]
    tool = message("tool", ANSWER)
    turn2 = text(THINK + FINAL) + [IM_END]
    assert trajectory.token_drift == [DRIFT]
    # the sampled tokens, <think> included, are kept exactly; the env's part is rendered apart
    assert_tokens(trajectory.token_ids, PROMPT + turn1 + [NL] + tool + GEN + turn2)
    assert_tokens(
        trajectory.loss_mask,
        [0] * len(PROMPT) + [1] * len(turn1) + [0] * len([NL] + tool + GEN) + [1] * len(turn2),
    )
    assert_tokens(
        trajectory.sampler_logprobs,
        [0.0] * len(PROMPT)
        + logprobs(len(turn1))
        + [0.0] * len([NL] + tool + GEN)
        + logprobs(len(turn2)),
    )
    assert engine.prompts[1] == PROMPT + turn1 + [NL] + tool + GEN


def test_a_length_cut_turn_gets_the_templates_closing_as_context() -> None:
    engine = LoggingEngine(reference_policy, ByteChatTokenizer())
    trajectory = rollout(engine, max_tokens=24)
    cut1 = text(CALL)[:24]  # no <|im_end|>: the turn hit max_tokens
    error = "Error: unterminated <tool_call> block (missing </tool_call>)"
    cut2 = text(f"The result is \\boxed{{{error}}}.")[:24]
    tool = message("tool", error)
    assert [t.finish_reason for t in trajectory.turns] == ["length", "length"]
    assert trajectory.token_drift == []
    assert_tokens(trajectory.token_ids, PROMPT + cut1 + [IM_END, NL] + tool + GEN + cut2)
    assert_tokens(
        trajectory.loss_mask,
        [0] * len(PROMPT) + [1] * 24 + [0] * len([IM_END, NL] + tool + GEN) + [1] * 24,
    )
    assert (
        trajectory.reward,
        trajectory.stop_reason,
        trajectory.metrics["tool_calls"],
        trajectory.metrics["tool_errors"],
    ) == (
        0.0,
        "terminated",
        1.0,
        1.0,
    )


def test_a_length_cut_turn_after_drift_also_gets_the_closing() -> None:
    engine = LoggingEngine(thinking(reference_policy), ThinkStrippingTokenizer())
    trajectory = rollout(engine, max_tokens=40)
    cut1 = text(THINK + CALL)[:40]
    error = "Error: unterminated <tool_call> block (missing </tool_call>)"
    cut2 = text(THINK + f"The result is \\boxed{{{error}}}.")[:40]
    tool = message("tool", error)
    assert [d["turn"] for d in trajectory.token_drift] == [1]
    assert_tokens(trajectory.token_ids, PROMPT + cut1 + [IM_END, NL] + tool + GEN + cut2)
    assert_tokens(
        trajectory.loss_mask,
        [0] * len(PROMPT) + [1] * 40 + [0] * len([IM_END, NL] + tool + GEN) + [1] * 40,
    )


# -- the chat-level path: engines that report each turn's prompt ids -------------------------------


class ChatLevelEngine(InferenceEngine):
    """A message-level engine (no tokenizer on our side) that, like vLLM's chat endpoint with
    ``return_token_ids``, reports the prompt as it tokenised it and the sampled ids."""

    def __init__(self, policy: Policy, template: ByteChatTokenizer) -> None:
        self.policy, self.template = policy, template

    async def generate(self, request: GenerateRequest) -> Generation:
        assert request.prompt_ids is None
        text_out = self.policy(list(request.messages), request.tools)
        ids = self.template.encode(text_out) + [self.template.eos_token_id]
        prompt = self.template.render_sync(request.messages, request.tools, True)
        return Generation(
            text=text_out, token_ids=ids, logprobs=logprobs(len(ids)), prompt_token_ids=prompt
        )


def test_chat_level_engine_with_consistent_prefixes_gives_a_valid_trace() -> None:
    trajectory = rollout(ChatLevelEngine(reference_policy, ByteChatTokenizer()))
    turn1, turn2 = text(CALL) + [IM_END], text(FINAL) + [IM_END]
    context = [NL] + message("tool", ANSWER) + GEN
    assert trajectory.token_drift == []
    assert_tokens(trajectory.token_ids, PROMPT + turn1 + context + turn2)
    assert_tokens(
        trajectory.loss_mask,
        [0] * len(PROMPT) + [1] * len(turn1) + [0] * len(context) + [1] * len(turn2),
    )
    assert_tokens(
        trajectory.sampler_logprobs,
        [0.0] * len(PROMPT) + logprobs(len(turn1)) + [0.0] * len(context) + logprobs(len(turn2)),
    )
    assert trajectory.prompt_token_count == len(PROMPT)
    assert [t.prompt_tokens for t in trajectory.turns] == [
        len(PROMPT),
        len(PROMPT + turn1 + context),
    ]


def test_chat_level_engine_with_an_inconsistent_prefix_invalidates_the_token_fields() -> None:
    trajectory = rollout(ChatLevelEngine(thinking(reference_policy), ThinkStrippingTokenizer()))
    assert (
        trajectory.token_ids,
        trajectory.loss_mask,
        trajectory.sampler_logprobs,
        trajectory.prompt_token_count,
    ) == (None, None, None, None)
    assert trajectory.token_drift == [DRIFT]
    assert (trajectory.reward, trajectory.stop_reason, trajectory.errors) == (1.0, "terminated", [])


def test_text_only_engines_record_no_tokens() -> None:
    trajectory = rollout(ScriptedEngine(reference_policy))
    assert (
        trajectory.token_ids,
        trajectory.loss_mask,
        trajectory.sampler_logprobs,
        trajectory.token_drift,
    ) == (None, None, None, [])
    assert [t.completion_tokens for t in trajectory.turns] == [None, None]
    assert trajectory.reward == 1.0


# -- the pieces ------------------------------------------------------------------------------------


def test_common_prefix_length() -> None:
    assert common_prefix_length([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([5], [6]) == 0


def test_token_trace() -> None:
    trace = TokenTrace()
    trace.start([1, 2])
    trace.add_sampled([3, 4], [-0.5, -0.25])
    trace.add_sampled([5], None)
    trace.add_context([6])
    assert (trace.ids, trace.mask, trace.logprobs, trace.prompt_length) == (
        [1, 2, 3, 4, 5, 6],
        [0, 0, 1, 1, 1, 0],
        [0.0, 0.0, -0.5, -0.25, 0.0, 0.0],
        2,
    )
    assert trace.extend_to([1, 2, 3, 4, 5, 6, 7, 8], turn=1)
    assert (trace.ids[-2:], trace.mask[-2:]) == ([7, 8], [0, 0])
    assert not trace.extend_to([1, 2, 9, 9, 9, 9, 9, 9, 9, 9, 9], turn=2)
    assert trace.drift == [
        {"turn": 2, "position": 2, "recorded": [3, 4, 5, 6, 7, 8], "rendered": [9] * 8}
    ]
    assert trace.ids == [1, 2, 3, 4, 5, 6, 7, 8]


def test_closing_and_env_part_of_the_byte_template() -> None:
    tokenizer = ByteChatTokenizer()
    tools = [calculate.schema]
    assert asyncio.run(_turn_closing(tokenizer, None)) == [IM_END, NL]
    assert asyncio.run(_turn_closing(tokenizer, tools)) == [IM_END, NL]
    env_part = asyncio.run(_env_part(tokenizer, [tool_message("7", "c1")], tools))
    assert env_part == message("tool", "7") + GEN


def test_drift_is_recorded_once_per_episode() -> None:
    # Three tool calls, each after a thinking block the template later strips: the record stops
    # being a prefix at the first turn and stays broken, so one drift entry, not one per turn.
    def policy(messages: list[Message], tools: Any) -> str:
        calls = sum(m.role == "tool" for m in messages)
        return THINK + (CALL if calls < 3 else FINAL)

    engine = LoggingEngine(policy, ThinkStrippingTokenizer())
    trajectory = rollout(engine)
    assert len(trajectory.turns) == 4 and trajectory.reward == 1.0
    assert trajectory.token_drift == [DRIFT]
    sampled = [t for t, m in zip(trajectory.token_ids, trajectory.loss_mask, strict=True) if m]
    turns = [text(THINK + CALL) + [IM_END]] * 3 + [text(THINK + FINAL) + [IM_END]]
    assert sampled == [t for turn in turns for t in turn]
