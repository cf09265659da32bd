"""Replay stored episodes through an env, without generating: the basis of re-scoring.

An episode is replayed by resetting the env with the stored seed and task, then stepping it
with each stored assistant turn as the runner gave it (text, tool calls when the engine had
parsed them, token count and finish reason, so token budgets run out where they did). The env
thereby rebuilds its state exactly, game boards and sandboxes included, and scores the episode
as it would have; a rubric that reads only messages needs nothing more, and one that reads env
state gets the state the stored turns produce.

Each reply of the env is compared with the stored one. When they differ (the new version of a
game answers differently, say) the replay goes on with the stored assistant turns, which were
written against the stored replies, and the first difference is reported as a *divergence*:
such an episode's new reward scores turns the policy never wrote against these replies.

Limits: a replay has no timeouts (an env that hangs hangs the replay), and env replies are
told apart from assistant turns by role, so an env that replies with assistant messages
cannot be aligned with its record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from envhub.env import Env, EpisodeEnv
from envhub.state import State
from envhub.types import (
    AssistantTurn,
    ErrorRecord,
    Message,
    Trajectory,
    TurnRecord,
    as_message,
    assistant,
    is_infrastructure_error,
)

RUNNER_BUDGETS = ("max_tokens", "max_context")
"""Stop reasons the runner itself ends an episode with (through ``TaskEnv.atruncate``) when the
token budget or the context runs out before the next turn."""


@dataclass
class Replay:
    """What replaying one stored episode gave: the new score and how the episode ended."""

    reward: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    """The env's own metrics (tool calls, ...)."""
    errors: list[ErrorRecord] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    stop_reason: str = "error"
    state: State | None = None
    """The env's state at the end (for group rewards); ``None`` for envs without one."""
    divergence: str | None = None
    """The first place where the env's reply differed from the stored one, in words."""

    @property
    def failed(self) -> bool:
        """The replay did not reach the episode's end (the env raised, or cannot be scored)."""
        return self.stop_reason in ("error", "timeout")

    def fail(self, stage: str, error: Exception, turn: int | None = None) -> Replay:
        """Record ``error`` (raised by the env at ``stage``) as the reason the replay stopped."""
        infra = is_infrastructure_error(error)
        message = str(error) or type(error).__name__
        self.errors.append(ErrorRecord(stage=stage, type=type(error).__name__, message=message,
                                       turn=turn, infra=infra))  # fmt: skip
        self.stop_reason = "error"
        return self

    def finish(
        self, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]
    ) -> Replay:
        """Take the env's final step as the runner does (``RolloutRunner._finish``): the
        episode's reward is the sum of its steps' (see :meth:`step`)."""
        self.reward += float(reward)
        self.terminated, self.truncated = terminated, truncated
        self.stop_reason = info.get("stop_reason") or ("terminated" if terminated else "truncated")
        self.components = dict(info.get("reward_components", {}))
        self.metrics = {k: float(v) for k, v in info.get("metrics", {}).items()}
        self.errors.extend(info.get("errors", []))
        return self

    def step(self, reward: float) -> None:
        """Add the reward of a step that did not end the episode."""
        self.reward += float(reward)

    def diverged(self, where: str) -> None:
        """Note a divergence (the first one is kept)."""
        self.divergence = self.divergence or where


def stored_turns(t: Trajectory) -> list[tuple[Message, list[Message], TurnRecord]]:
    """Each completed turn of ``t``: the assistant message, the env's stored reply to it, and
    the turn's record."""
    completion = t.messages[t.prompt_length :]
    starts = [i for i, m in enumerate(completion) if m.role == "assistant"]
    ends = [*starts[1:], len(completion)]
    pairs = [(completion[s], completion[s + 1 : e]) for s, e in zip(starts, ends, strict=True)]
    return [(m, reply, record) for (m, reply), record in zip(pairs, t.turns, strict=False)]


def action_of(message: Message, record: TurnRecord) -> AssistantTurn:
    """The action the runner gave the env for this stored turn."""
    calls = list(message.tool_calls or ()) if record.structured_tool_calls else None
    return AssistantTurn(
        message=assistant(message.content or "", calls),
        num_tokens=record.completion_tokens,
        finish_reason=record.finish_reason,
    )


async def replay_episode(env: Env, t: Trajectory) -> Replay:
    """Replay ``t`` through ``env`` (see the module docstring). An env that raises is recorded
    on the replay, as the runner records it, and ends it."""
    replay = Replay()
    try:
        prompt, _ = await env.areset(seed=t.seed, options={"task_index": t.task_index})
    except Exception as e:
        return replay.fail("env.reset", e)
    _compare(replay, "the prompt", prompt, t.messages[: t.prompt_length])
    replay.state = env.state if isinstance(env, EpisodeEnv) else None
    turns = stored_turns(t)
    for k, (message, reply, record) in enumerate(turns):
        try:
            observation, reward, terminated, truncated, info = await env.astep(
                action_of(message, record)
            )
        except Exception as e:
            return replay.fail("env.step", e, k)
        _compare(replay, f"turn {k}", observation, reply)
        if terminated or truncated:
            if k + 1 < len(turns):
                replay.diverged(f"turn {k}: the episode ended; the stored one went on")
            return replay.finish(reward, bool(terminated), bool(truncated), info)
        replay.step(reward)
    return await _end(env, t, replay)


async def _end(env: Env, t: Trajectory, replay: Replay) -> Replay:
    """After the last stored turn the env has not ended the episode: end it as the runner did
    (a token or context budget), or as the stored record says when the env disagrees."""
    if t.stop_reason in ("error", "timeout"):
        replay.stop_reason = t.stop_reason  # the stored episode never reached its end either
        return replay
    active = isinstance(env, EpisodeEnv) and env.state is not None and env.state.stop_reason is None
    if not active:
        replay.diverged("the env did not end the episode and cannot be told to")
        replay.stop_reason = "error"
        return replay
    if t.stop_reason not in RUNNER_BUDGETS:
        replay.diverged(f"the episode did not end after its {len(t.turns)} stored turns")
    reward, info = await env.atruncate(t.stop_reason)  # type: ignore[attr-defined]
    return replay.finish(reward, False, True, info)


def _compare(
    replay: Replay,
    where: str,
    observation: Sequence[Message | dict[str, Any]],
    stored: list[Message],
) -> None:
    new = [as_message(m) for m in observation]
    if new == stored:
        return
    if len(new) != len(stored):
        replay.diverged(f"{where}: {len(new)} message(s) where {len(stored)} were stored")
        return
    i = next(i for i, (a, b) in enumerate(zip(new, stored, strict=True)) if a != b)
    replay.diverged(f"{where}: {_short(new[i])} where the stored episode has {_short(stored[i])}")


def _short(message: Message, limit: int = 60) -> str:
    text = message.content or ""
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{message.role} {text!r}"
