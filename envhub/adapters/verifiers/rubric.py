"""verifiers' rubric as an envhub rubric, with reward-function errors recorded."""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

from envhub.rewards.rubric import Rubric, Score
from envhub.state import State
from envhub.types import ErrorRecord, is_infrastructure_error

_reward_errors: ContextVar[list[ErrorRecord] | None] = ContextVar("_reward_errors", default=None)


class VerifiersRubric(Rubric):
    """An envhub rubric whose scores are the verifiers rubric's own: ``score_rollout`` on the
    episode's verifiers state (``score_group`` over a group when it has group rewards).

    Args:
        vf_rubric: The verifiers environment's rubric.
    """

    def __init__(self, vf_rubric: Any) -> None:
        super().__init__()
        self.vf_rubric = _instrumented(vf_rubric)
        self.grouped = bool(vf_rubric.has_group_rewards)

    @property
    def group_funcs(self) -> list[Any]:
        """Non-empty when the verifiers rubric has group rewards: the runner then scores each
        group with :meth:`score_group` (and :meth:`score` scores nothing)."""
        return [self.vf_rubric] if self.grouped else []

    async def score(self, state: State) -> Score:
        """The verifiers rubric's score of the finished episode (0 for a grouped rubric)."""
        vf_state = state.data.get("vf_state")
        if self.grouped or vf_state is None:
            return Score()
        return (await self._scored([vf_state], lambda s: self.vf_rubric.score_rollout(s[0])))[0]

    async def score_group(self, states: Sequence[State]) -> list[Score]:
        """The verifiers rubric's ``score_group`` over a group's finished episodes."""
        vf_states = [s.data.get("vf_state") for s in states]
        if any(v is None for v in vf_states):
            return [Score() for _ in states]
        return await self._scored(vf_states, self.vf_rubric.score_group)

    async def _scored(self, vf_states: list[Any], scorer: Callable[[Any], Any]) -> list[Score]:
        errors: list[ErrorRecord] = []
        token = _reward_errors.set(errors)
        try:
            await scorer(vf_states)
            for vf_state in vf_states:
                await self.vf_rubric.cleanup(vf_state)
        finally:
            _reward_errors.reset(token)
        return [
            Score(
                total=float(v["reward"]),
                components={k: float(x) for k, x in (v["metrics"] or {}).items()},
                errors=list(errors),
            )
            for v in vf_states
        ]


def _instrumented(vf_rubric: Any) -> Any:
    """A shallow copy of a verifiers rubric (and of the rubrics of a ``RubricGroup``) whose
    reward functions record what they raise before verifiers scores it 0."""
    rubric = copy.copy(vf_rubric)
    if isinstance(getattr(rubric, "rubrics", None), list):
        rubric.rubrics = [_instrumented(r) for r in rubric.rubrics]
    rubric.funcs = [_recording(f) for f in rubric.funcs]
    return rubric


def _recording(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func``, same name and signature (verifiers injects arguments by name), recording an
    exception on the episode being scored before re-raising it."""

    def record(e: Exception) -> None:
        errors = _reward_errors.get()
        if errors is not None:
            errors.append(
                ErrorRecord(
                    stage=f"reward:{getattr(func, '__name__', repr(func))}",
                    type=type(e).__name__,
                    message=str(e),
                    infra=is_infrastructure_error(e),
                )
            )

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return await func(*args, **kwargs)
            except Exception as e:
                record(e)
                raise

    else:

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return func(*args, **kwargs)
            except Exception as e:
                record(e)
                raise

    return wrapper
