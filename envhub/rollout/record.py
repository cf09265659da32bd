"""The record of one episode in progress, and of each actor in it.

A one-role episode has one record: its own. An episode with several roles (:mod:`envhub.roles`)
keeps one record per actor the policy plays in its ``seats``; the episode's own record then holds
only what belongs to the whole episode (a timeout, an env that could not be made or reset).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from envhub.rollout.tokens import TokenTrace
from envhub.state import State
from envhub.types import ErrorRecord, Message, TokenSegment, TurnRecord, is_infrastructure_error


@dataclass
class EpisodeRecord:
    """Mutable record of one episode, or of one actor in it, while it is played (kept outside
    the episode coroutine so that a timeout still leaves everything recorded so far)."""

    task_index: int
    sample_index: int
    group_id: str
    seed: int
    messages: list[Message] = field(default_factory=list)
    prompt_length: int = 0
    tools: list[dict[str, Any]] | None = None
    trace: TokenTrace | None = None
    segment_start: int = 0
    """Where the current segment's conversation starts in ``messages`` (0 unless the env
    started a new segment: :data:`~envhub.env.NEW_SEGMENT`)."""
    segments: list[TokenSegment] = field(default_factory=list)
    """Token records of the finished segments before ``trace``."""
    segment_turn: int = 0
    """The first turn of the current segment."""
    drift: list[dict[str, Any]] = field(default_factory=list)
    """Drift recorded by the finished segments' traces."""
    turns: list[TurnRecord] = field(default_factory=list)
    errors: list[ErrorRecord] = field(default_factory=list)
    reward: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    env_metrics: dict[str, float] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    stop_reason: str = "error"
    state: State | None = None
    discard_env: bool = False
    """Set when the env timed out: its worker thread may still run, so it is not reused."""
    started: float = field(default_factory=time.perf_counter)
    seats: dict[str, EpisodeRecord] = field(default_factory=dict)
    """In an episode with several roles: each actor the policy played, by actor id, with its
    own record; empty for a one-role episode."""
    result: str | None = None
    """An actor's result as the env reported it (``win``, ``crashed``, ...)."""
    last_finish: str | None = None
    """The last turn's finish reason (how the next reply is appended to the tokens)."""

    @property
    def conversation(self) -> list[Message]:
        """The current segment's messages (all of them, unless the env started a new one)."""
        return self.messages[self.segment_start :] if self.segment_start else self.messages

    def fail(self, stage: str, error: BaseException | str, turn: int | None = None) -> None:
        """Record ``error`` at ``stage`` (``engine``, ``env.step``, ...) and end the record
        with it: ``stop_reason`` ``timeout`` or ``error``."""
        timed_out = isinstance(error, (asyncio.TimeoutError, TimeoutError))
        kind = "timeout" if timed_out else type(error).__name__
        # The engine is infrastructure, whatever it raised; elsewhere the exception tells.
        infra = stage == "engine" or (
            isinstance(error, BaseException) and is_infrastructure_error(error)
        )
        self.errors.append(
            ErrorRecord(stage=stage, type=kind, message=str(error) or kind, turn=turn, infra=infra)
        )
        self.stop_reason = "timeout" if timed_out else "error"
        self.discard_env = self.discard_env or (timed_out and stage.startswith("env."))

    def tool_counts(self) -> tuple[int, int]:
        """Tool calls and failed calls so far, from the env's metrics (a ``TaskEnv``'s state)."""
        metrics = self.state.metrics if self.state is not None else {}
        return int(metrics.get("tool_calls", 0)), int(metrics.get("tool_errors", 0))
