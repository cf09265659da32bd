"""The seating of an episode with several roles (:mod:`envhub.roles`).

Each actor the policy plays gets its own record (kept in the episode's ``seats``): its
conversation, its token trace and its turns, built by the one episode loop
(:mod:`envhub.rollout.episode`) exactly as a one-role episode's are: its prompt rendered with the
chat template, its own sampled tokens with mask 1, and whatever it sees between its turns (the
other actors' moves as the env tells them) appended with mask 0 when it next moves. So each
actor's trajectory trains that actor's tokens only, with that actor's reward.

A failure during an actor's turn (the engine failing to sample it, the env raising on it) is
recorded on that actor's trajectory as on any episode, and on every other actor's as
``role_crashed`` at stage ``role:<actor>``: their episodes were cut short by it, so none of them
is trained on (the outcome is a failure, not a reward of 0).

Actors that move one after another without seeing each other's moves (the env lists them in
``info["upcoming"]``: the solvers of one problem) are sampled together by the loop (see
:mod:`envhub.rollout.episode`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envhub.env import Env
from envhub.roles import ROLE, ROLE_COMPONENTS, ROLE_RESULTS, ROLE_REWARDS, UPCOMING
from envhub.rollout.record import EpisodeRecord
from envhub.types import ErrorRecord


class RoleSeats:
    """The seating of a :class:`~envhub.roles.MultiRoleEnv`'s episode: the env names the actor
    to move; each actor the policy plays has its own record in the episode's ``seats``."""

    def to_move(self, info: dict[str, Any]) -> str | None:
        """The actor ``info["to_move"]`` names (``None`` once the match has ended)."""
        return info[ROLE]

    def upcoming(self, info: dict[str, Any]) -> Mapping[str, list[Any]]:
        """The actors ``info["upcoming"]`` lists, with what each will be shown."""
        return info.get(UPCOMING) or {}

    def record(self, ep: EpisodeRecord, actor: str | None) -> EpisodeRecord | None:
        """``actor``'s seat, once it has had its first turn."""
        return ep.seats.get(actor) if actor is not None else None

    def new_record(self, ep: EpisodeRecord, env: Env) -> EpisodeRecord:
        """A fresh record for one actor of ``ep`` (ended ``terminated`` unless told else)."""
        seat = EpisodeRecord(ep.task_index, ep.sample_index, ep.group_id, ep.seed)
        seat.stop_reason = "terminated"
        return seat

    def seat(self, ep: EpisodeRecord, actor: str | None, record: EpisodeRecord) -> None:
        """File ``record`` in ``ep.seats`` as ``actor``'s."""
        assert actor is not None
        ep.seats[actor] = record

    def payments(self, reward: float, info: dict[str, Any]) -> Mapping[str | None, float]:
        """What every actor was paid at the step (``info["role_rewards"]``); pay to an actor
        the policy does not play, or that has not moved yet, has no tokens to go to."""
        return info.get(ROLE_REWARDS, {})

    def finish(
        self, ep: EpisodeRecord, terminated: bool, truncated: bool, info: dict[str, Any]
    ) -> None:
        """Close every actor's record with the episode's end as the env reported it."""
        terminated, truncated = bool(terminated), bool(truncated)
        results = info.get(ROLE_RESULTS, {})
        components = info.get(ROLE_COMPONENTS, {})
        errors = [
            e if isinstance(e, ErrorRecord) else ErrorRecord(**e) for e in info.get("errors", [])
        ]
        for actor, seat in ep.seats.items():
            seat.terminated, seat.truncated = terminated, truncated
            seat.stop_reason = info.get("stop_reason") or (
                "terminated" if terminated else "truncated"
            )
            seat.components = dict(components.get(actor, {}))
            seat.env_metrics = dict(info.get("metrics", {}))
            seat.errors.extend(errors)
            seat.result = results.get(actor) or ("aborted" if errors else None)
        ep.stop_reason = "terminated"

    async def truncate(self, env: Env, ep: EpisodeRecord, reason: str) -> None:
        """End the whole match as truncated."""
        for seat in ep.seats.values():
            if seat.trace is not None:
                seat.trace.trim_to_last_sampled()
        atruncate = getattr(env, "atruncate", None)
        info = (await atruncate(reason))[1] if atruncate is not None else {"stop_reason": reason}
        self.finish(ep, False, True, info)

    def fail(
        self, ep: EpisodeRecord, actor: str | None, stage: str, error: BaseException, turn: int
    ) -> None:
        """Record ``actor``'s failure on its own record, and on every other actor's as the
        reason its episode was cut short."""
        assert actor is not None
        own_seat = ep.seats[actor]
        own_seat.fail(stage, error, turn)
        own, own_seat.result = own_seat.errors[-1], "crashed"
        # An env whose step timed out may still be running it: the episode's env goes with it.
        ep.discard_env = ep.discard_env or own_seat.discard_env
        for other, seat in ep.seats.items():
            if other == actor:
                continue
            seat.errors.append(
                ErrorRecord(
                    stage=f"role:{actor}",
                    type="role_crashed",
                    message=f"the episode ended when {actor} failed: {own.type}: {own.message}",
                    turn=turn,
                    infra=own.infra,
                )
            )
            seat.stop_reason, seat.result = "error", "aborted"
        ep.stop_reason = "error"
