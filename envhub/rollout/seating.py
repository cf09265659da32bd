"""Who acts in an episode, where each actor's record lives, and how the episode's end reaches
the records: what the episode loop (:mod:`envhub.rollout.episode`) asks of an episode besides
its env.

A one-role episode has one actor, whose record is the episode's own (:class:`OneActor`); an
episode with several roles seats each actor the policy plays on a record of its own
(:class:`~envhub.rollout.roles.RoleSeats`). The loop is the same for both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from envhub.env import Env, EpisodeEnv
from envhub.rollout.record import EpisodeRecord
from envhub.types import Message


class Seating(Protocol):
    """The actors of one episode, as the episode loop sees them.

    An actor is named by a string, or ``None`` when the episode has only one.
    """

    def to_move(self, info: dict[str, Any]) -> str | None:
        """The actor that moves next, from the reset's or the last step's ``info``."""
        ...

    def upcoming(self, info: dict[str, Any]) -> Mapping[str, list[Any]]:
        """Actors that move after :meth:`to_move` without seeing each other's moves, in order,
        with what each will be shown (their turns may be sampled at once)."""
        ...

    def record(self, ep: EpisodeRecord, actor: str | None) -> EpisodeRecord | None:
        """``actor``'s record, once it has had its first turn."""
        ...

    def new_record(self, ep: EpisodeRecord, env: Env) -> EpisodeRecord:
        """A record for an actor's first turn (filed by :meth:`seat`)."""
        ...

    def seat(self, ep: EpisodeRecord, actor: str | None, record: EpisodeRecord) -> None:
        """File ``record`` as ``actor``'s."""
        ...

    def payments(self, reward: float, info: dict[str, Any]) -> Mapping[str | None, float]:
        """What each actor was paid at a step that returned ``reward`` and ``info``."""
        ...

    def finish(
        self, ep: EpisodeRecord, terminated: bool, truncated: bool, info: dict[str, Any]
    ) -> None:
        """End every record as the env's last step reported."""
        ...

    async def truncate(self, env: Env, ep: EpisodeRecord, reason: str) -> None:
        """End the episode from outside: the acting actor has no tokens or context left."""
        ...

    def fail(
        self, ep: EpisodeRecord, actor: str | None, stage: str, error: BaseException, turn: int
    ) -> None:
        """Record ``actor``'s failure (its turn's engine call or env step, ...)."""
        ...


class OneActor:
    """The seating of a one-role episode: one actor, ``None``, whose record is the episode's."""

    def __init__(self) -> None:
        self._record: EpisodeRecord | None = None

    def to_move(self, info: dict[str, Any]) -> None:
        """Always the one actor."""
        return None

    def upcoming(self, info: dict[str, Any]) -> Mapping[str, list[Message]]:
        """Nobody: the one actor sees every move."""
        return {}

    def record(self, ep: EpisodeRecord, actor: str | None) -> EpisodeRecord | None:
        """The episode's record, once its first turn opened it."""
        return self._record

    def new_record(self, ep: EpisodeRecord, env: Env) -> EpisodeRecord:
        """The episode's own record, with the env's episode state when it keeps one."""
        ep.state = env.state if isinstance(env, EpisodeEnv) else None
        return ep

    def seat(self, ep: EpisodeRecord, actor: str | None, record: EpisodeRecord) -> None:
        """Remember that the episode's record is open."""
        self._record = record

    def payments(self, reward: float, info: dict[str, Any]) -> Mapping[str | None, float]:
        """The step's reward, to the one actor."""
        return {None: float(reward)}

    def finish(
        self, ep: EpisodeRecord, terminated: bool, truncated: bool, info: dict[str, Any]
    ) -> None:
        """Take the end, the reward components, metrics and errors from the last ``info``."""
        ep.terminated, ep.truncated = bool(terminated), bool(truncated)
        ep.stop_reason = info.get("stop_reason") or ("terminated" if terminated else "truncated")
        ep.components = dict(info.get("reward_components", {}))
        ep.env_metrics = dict(info.get("metrics", {}))
        ep.errors.extend(info.get("errors", []))

    async def truncate(self, env: Env, ep: EpisodeRecord, reason: str) -> None:
        """Ask an env with episode state to score the cut-short episode; else just end it."""
        if ep.trace is not None:  # the env's last reply will never be answered: keep it out
            ep.trace.trim_to_last_sampled()
        if isinstance(env, EpisodeEnv) and env.state is not None and env.state.stop_reason is None:
            reward, info = await env.atruncate(reason)
            ep.reward += float(reward)  # a score no turn returned
            self.finish(ep, False, True, info)
        else:
            ep.truncated, ep.stop_reason = True, reason

    def fail(
        self, ep: EpisodeRecord, actor: str | None, stage: str, error: BaseException, turn: int
    ) -> None:
        """Record the failure on the episode."""
        ep.fail(stage, error, turn)
