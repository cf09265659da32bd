"""Rubrics: weighted sets of reward functions, each component reported on its own.

A reward function is a plain function (sync or async) returning a float. It asks for what it
needs by naming parameters from a fixed vocabulary, checked when the function is declared, not
when it first runs:

- per episode (:func:`reward`): ``prompt``, ``completion`` (messages after the prompt),
  ``response`` (text of the last assistant message), ``answer``, ``info``, ``task``, ``state``;
- per group of samples of one task (:func:`group_reward`): the plural forms ``prompts``,
  ``completions``, ``responses``, ``answers``, ``infos``, ``tasks``, ``states``; it returns one
  float per sample (use it for relative or diversity rewards).

A function that raises or returns something that is not a finite number scores 0 for that
component, and the error is recorded on the episode; scoring goes on.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from envhub.errors import RewardDefinitionError
from envhub.state import State
from envhub.types import ErrorRecord, is_infrastructure_error

EPISODE_ARGS = ("prompt", "completion", "response", "answer", "info", "task", "state")
GROUP_ARGS = tuple(f"{name}s" for name in EPISODE_ARGS)


@dataclass(frozen=True)
class RewardFunction:
    """A reward function with its weight and the arguments it asked for."""

    fn: Callable[..., Any]
    name: str
    weight: float = 1.0
    group: bool = False
    params: tuple[str, ...] = ()
    takes_all: bool = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function as is (no weight applied)."""
        return self.fn(*args, **kwargs)


def _declared_params(
    fn: Callable[..., Any], allowed: Sequence[str], kind: str
) -> tuple[tuple[str, ...], bool]:
    params, takes_all = [], False
    for p in inspect.signature(fn).parameters.values():
        if p.kind == p.VAR_KEYWORD:
            takes_all = True
        elif p.kind == p.VAR_POSITIONAL:
            raise RewardDefinitionError(
                f"{kind} {fn.__name__!r}: *args is not supported; name the arguments you need"
            )
        elif p.name in allowed:
            params.append(p.name)
        elif p.default is p.empty:
            raise RewardDefinitionError(
                f"{kind} {fn.__name__!r} asks for {p.name!r}, which is not provided; "
                f"choose from {', '.join(allowed)} (or take **kwargs)"
            )
    return tuple(params), takes_all


def _make(fn: Callable[..., Any], weight: float, name: str | None, group: bool) -> RewardFunction:
    if isinstance(fn, RewardFunction):
        return RewardFunction(fn.fn, name or fn.name, float(weight), group, fn.params, fn.takes_all)
    allowed = GROUP_ARGS if group else EPISODE_ARGS
    params, takes_all = _declared_params(fn, allowed, "group reward" if group else "reward")
    return RewardFunction(fn, name or fn.__name__, float(weight), group, params, takes_all)


def reward(
    fn: Callable[..., Any] | None = None, *, weight: float = 1.0, name: str | None = None
) -> Any:
    """Declare a per-episode reward function: ``@reward`` or ``@reward(weight=0.2)``."""
    return (
        _make(fn, weight, name, group=False)
        if fn is not None
        else (lambda f: _make(f, weight, name, False))
    )


def group_reward(
    fn: Callable[..., Any] | None = None, *, weight: float = 1.0, name: str | None = None
) -> Any:
    """Declare a group reward function (plural arguments, one float per sample)."""
    return (
        _make(fn, weight, name, group=True)
        if fn is not None
        else (lambda f: _make(f, weight, name, True))
    )


@dataclass
class Score:
    """The result of scoring: weighted total, each unweighted component, and any errors."""

    total: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    errors: list[ErrorRecord] = field(default_factory=list)


def episode_arguments(state: State) -> dict[str, Any]:
    """Values of :data:`EPISODE_ARGS` for one episode."""
    return {
        "prompt": state.prompt,
        "completion": state.completion,
        "response": state.response,
        "answer": state.answer,
        "info": state.info,
        "task": state.task,
        "state": state,
    }


def _as_float(value: Any, where: str) -> float:
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, numbers.Real) or not math.isfinite(value):  # Real: numpy scalars too
        raise TypeError(f"{where} returned {value!r}; a reward must be a finite number")
    return float(value)


async def _invoke(func: RewardFunction, available: dict[str, Any]) -> Any:
    kwargs = dict(available) if func.takes_all else {k: available[k] for k in func.params}
    result = func.fn(**kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


class Rubric:
    """A weighted set of reward functions.

    Args:
        funcs: Reward functions, plain or declared with :func:`reward` / :func:`group_reward`.
        weights: Optional weights for plain functions, in order (default 1.0 each).
    """

    def __init__(
        self, funcs: Sequence[Callable[..., Any]] = (), weights: Sequence[float] | None = None
    ) -> None:
        weights = list(weights) if weights is not None else [None] * len(funcs)
        if len(weights) != len(funcs):
            raise RewardDefinitionError(f"{len(funcs)} reward functions but {len(weights)} weights")
        self.funcs: list[RewardFunction] = []
        for fn, w in zip(funcs, weights, strict=True):
            base = fn if isinstance(fn, RewardFunction) else reward(fn)
            self.funcs.append(base if w is None else _make(base, w, None, base.group))
        names = [f.name for f in self.funcs]
        if len(set(names)) != len(names):
            raise RewardDefinitionError(f"reward names must be unique, got {names}")

    @property
    def episode_funcs(self) -> list[RewardFunction]:
        """The functions that score one episode at a time, in order."""
        return [f for f in self.funcs if not f.group]

    @property
    def group_funcs(self) -> list[RewardFunction]:
        """The functions that score a whole group of episodes at once, in order."""
        return [f for f in self.funcs if f.group]

    @property
    def weights(self) -> dict[str, float]:
        """Each function's weight, by name."""
        return {f.name: f.weight for f in self.funcs}

    async def score(self, state: State) -> Score:
        """Score one finished episode with the per-episode functions."""
        available, score = episode_arguments(state), Score()
        for func in self.episode_funcs:
            try:
                value = _as_float(await _invoke(func, available), func.name)
            except Exception as e:  # user code: record, score 0, go on
                score.errors.append(_error_record(func, e))
                value = 0.0
            score.components[func.name] = value
            score.total += func.weight * value
        return score

    async def score_group(self, states: Sequence[State]) -> list[Score]:
        """Score a group of episodes of one task with the group functions."""
        scores = [Score() for _ in states]
        per_episode = [episode_arguments(s) for s in states]
        available = {f"{k}s": [a[k] for a in per_episode] for k in EPISODE_ARGS}
        for func in self.group_funcs:
            values, error = await self._group_values(func, available, len(states))
            for score, value in zip(scores, values, strict=True):
                score.components[func.name] = value
                score.total += func.weight * value
                if error:
                    score.errors.append(error)
        return scores

    async def _group_values(
        self, func: RewardFunction, available: dict[str, Any], n: int
    ) -> tuple[list[float], ErrorRecord | None]:
        try:
            values = list(await _invoke(func, available))
            if len(values) != n:
                raise ValueError(f"returned {len(values)} values for a group of {n}")
            return [_as_float(v, func.name) for v in values], None
        except Exception as e:
            return [0.0] * n, _error_record(func, e)


async def add_group_scores(env: Any, episodes: Sequence[Any]) -> None:
    """Add ``env``'s group rewards to a group's ``episodes`` (each with ``state``, ``reward``,
    ``components`` and ``errors``), as the rollout runner does and a re-score must do again;
    nothing when the env has no group rewards or an episode has no state."""
    rubric = getattr(env, "rubric", None)
    if rubric is None or not rubric.group_funcs or any(e.state is None for e in episodes):
        return
    scores = await rubric.score_group([e.state for e in episodes])
    for episode, score in zip(episodes, scores, strict=True):
        episode.reward += score.total
        episode.components.update(score.components)
        episode.errors.extend(score.errors)


def _error_record(func: RewardFunction, error: Exception) -> ErrorRecord:
    """What a failing reward leaves on the episode; a sandbox or network failure inside it is
    infrastructure's, not the reward's (``infra``)."""
    return ErrorRecord(
        stage=f"reward:{func.name}",
        type=type(error).__name__,
        message=str(error),
        infra=is_infrastructure_error(error),
    )
