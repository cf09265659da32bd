"""One episode of an envhub env as a tinker cookbook ``Env`` (token level).

The cookbook's loop samples tokens; envhub envs take messages. Each step here parses the
sampled tokens into an assistant message with the renderer (its tool calls as the renderer
parses them), plays it into the envhub env as an :class:`~envhub.types.AssistantTurn` (with
the sampled token count and the sampler's stop reason), and renders the conversation so far
into the next observation. The env scores every turn itself, a truncated or unparsable one
included: the adapter adds no reward of its own.

Token exactness: a turn's observation is the renderer's rendering of the conversation. When
that rendering starts with the previous observation plus the sampled tokens, the episode is
one token sequence and the cookbook trains it as one datum. When it differs only in how the
sampled turn's text was tokenized, and the renderer has the extension property, the sampled
tokens are kept in its place (:func:`continue_tokens`). Otherwise (a renderer that rewrites
history, such as Qwen3's thinking stripped from earlier turns; a sampled stop string that is
not the rendered end of a turn, such as ``role_colon``'s ``\\n\\nUser:`` before a tool's
reply) the observation is the renderer's own rendering and the cookbook starts a new datum;
each turn is still trained on exactly the prompt it was sampled from.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import tinker
from tinker_cookbook import renderers
from tinker_cookbook.rl import types

from envhub.adapters.cookbook.messages import from_cookbook, opening, to_cookbook
from envhub.env import NEW_SEGMENT, Env, close_quietly
from envhub.types import AssistantTurn, Message, as_message

_STOP_REASONS = {"terminated": types.StopReason.COMPLETED}
"""envhub's ``stop_reason`` -> the cookbook's, where the names differ."""
_SEARCH = 64
"""How far from the sampled length the rendered turn's end is looked for, in tokens."""


class EnvhubEnv(types.Env):
    """One episode of an envhub env, as the cookbook's RL loop drives it.

    Args:
        make: Makes the envhub env (called once, when the episode starts).
        renderer: Renders messages to tokens and parses sampled tokens back.
        seed: The env's ``reset`` seed.
        options: The env's ``reset`` options (``{"task_index": i}`` picks the task).
    """

    def __init__(
        self,
        make: Callable[[], Env],
        renderer: renderers.Renderer,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.make, self.renderer, self.seed, self.options = make, renderer, seed, options
        self.env: Env | None = None
        self.history: list[renderers.Message] = []
        """The conversation as the renderer sees it (its parsed turns, the env's replies)."""
        self.turns: list[Message] = []
        """The assistant turns played into the env, as it received them."""
        self.observation: list[int] = []

    async def initial_observation(self) -> tuple[tinker.ModelInput, Any]:
        """Reset the env; its prompt rendered (tools included) and the renderer's stops."""
        self.env = self.make()
        shown, info = await self.env.areset(seed=self.seed, options=self.options)
        tools = info.get("tools") or self.env.tool_schemas
        self.history = opening(self.renderer, [as_message(m) for m in shown], tools)
        self.observation = self.renderer.build_generation_prompt(self.history).to_ints()
        return tinker.ModelInput.from_ints(self.observation), self.renderer.get_stop_sequences()

    async def step(self, action: list[int], *, extra: Any = None) -> types.StepResult:
        """Play the sampled tokens into the env as one assistant turn."""
        assert self.env is not None, "initial_observation() starts the episode"
        stop_reason = (extra or {}).get("stop_reason", "stop")
        parsed, termination = self.renderer.parse_response(action)
        message = from_cookbook(parsed, f"call_{len(self.turns)}_")
        self.turns.append(message)
        turn = AssistantTurn(message=message, num_tokens=len(action), finish_reason=stop_reason)
        try:
            shown, reward, terminated, truncated, info = await self.env.astep(turn)
        except BaseException:
            self.close()
            raise
        metrics: dict[str, float] = {"parse_error": float(not termination.is_clean)}
        stops, logs = self.renderer.get_stop_sequences(), self._logs(turn)
        if terminated or truncated:
            self.close()
            metrics |= episode_metrics(info)
            return types.StepResult(
                float(reward), True, tinker.ModelInput.empty(), stops, metrics, logs
            )
        self._extend(parsed, message, [as_message(m) for m in shown], info)
        rendered = self.renderer.build_generation_prompt(self.history).to_ints()
        tokens, exact = continue_tokens(self.renderer, self.observation, action, rendered)
        self.observation = tokens
        metrics["token_exact"] = float(exact and not info.get(NEW_SEGMENT))
        return types.StepResult(
            float(reward), False, tinker.ModelInput.from_ints(tokens), stops, metrics, logs
        )

    def _logs(self, turn: AssistantTurn) -> dict[str, str | int]:
        """What the cookbook writes to its rollout summaries for this turn: the turn as the
        env received it and the episode's reset arguments, enough to replay the episode."""
        message = turn.message
        logs: dict[str, str | int] = {"assistant": message.content or ""}
        logs["finish_reason"] = turn.finish_reason or "stop"
        if message.tool_calls:
            logs["tool_calls"] = json.dumps([c.model_dump(mode="json") for c in message.tool_calls])
        if self.seed is not None:
            logs["seed"] = self.seed
        if self.options and "task_index" in self.options:
            logs["task_index"] = int(self.options["task_index"])
        return logs

    def close(self) -> None:
        """Close the envhub env (idempotent)."""
        if self.env is not None:
            close_quietly(self.env)

    def _extend(
        self,
        parsed: renderers.Message,
        message: Message,
        shown: list[Message],
        info: dict[str, Any],
    ) -> None:
        """Add the turn and the env's reply to the history (or start the env's new one)."""
        if info.get(NEW_SEGMENT):  # a harness rewrote its conversation: render the new one
            self.history = opening(self.renderer, shown, info.get("tools"))
            return
        if message.tool_calls:  # the ids the env answers, for renderers that show them
            parsed = {**parsed, "tool_calls": to_cookbook(message)["tool_calls"]}  # type: ignore[typeddict-item]
        self.history += [parsed, *(to_cookbook(m) for m in shown)]


def continue_tokens(
    renderer: renderers.Renderer, previous: list[int], action: list[int], rendered: list[int]
) -> tuple[list[int], bool]:
    """The next observation and whether it extends ``previous + action`` token for token.

    ``rendered`` is the renderer's rendering of the conversation after the turn. It is kept
    when it extends the sampled tokens; when the renderer has the extension property and its
    rendering of the turn differs from the sampled tokens only in tokenization (the same
    text), the sampled tokens replace it; else ``rendered`` stands, not extending."""
    sampled = previous + action
    if rendered[: len(sampled)] == sampled:
        return rendered, True
    if not renderer.has_extension_property or rendered[: len(previous)] != previous:
        return rendered, False
    rest = rendered[len(previous) :]
    end = _turn_end(renderer.tokenizer, rest, renderer.tokenizer.decode(action), len(action))
    if end is None:
        return rendered, False
    return sampled + rest[end:], True


def _turn_end(tokenizer: Any, rest: list[int], text: str, near: int) -> int | None:
    """The length of the prefix of ``rest`` that decodes to ``text``, looked for near ``near``
    tokens; ``None`` when none does."""
    for offset in range(_SEARCH):
        for end in {near - offset, near + offset}:
            if 0 < end <= len(rest) and tokenizer.decode(rest[:end]) == text:
                return end
    return None


def episode_metrics(info: dict[str, Any]) -> dict[str, float]:
    """The final step's metrics: each reward component (``reward/<name>``), the env's own
    counts, its errors and its stop reason as the cookbook names it (``stop/<reason>``)."""
    metrics = {f"reward/{k}": float(v) for k, v in (info.get("reward_components") or {}).items()}
    for name, value in (info.get("metrics") or {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics[name] = float(value)
    metrics["errors"] = float(len(info.get("errors") or []))
    reason = info.get("stop_reason")
    if reason:
        metrics[f"{types.STOP_METRIC_PREFIX}{_STOP_REASONS.get(reason, reason)}"] = 1.0
    return metrics
