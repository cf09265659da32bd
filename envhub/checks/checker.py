"""``check_env``: the env contract as executable checks.

Each check runs on its own; a failure in one does not hide the others. ``check_env`` raises
:class:`EnvCheckError` listing every failure (or returns the report with
``raise_on_failure=False``).

Checks: the API shape; reset output (valid messages); every dataset row of a
:class:`~envhub.env.TaskEnv` makes a prompt; determinism under a seed (same seed, same
actions -> same observations, rewards and flags); tool schemas (valid OpenAI function schemas);
episodes end within their budget with finite rewards of the right types inside
``reward_range``; a null (empty) policy scores the floor; the env's ``reference_policy``, if it
has one, scores the top; ``close`` is idempotent and the env is a context manager. A
:class:`~envhub.roles.MultiRoleEnv` is played through each actor's own view; every actor's
total must lie in its role's range and obey the env's ``reward_mode``, under the null
policy the actor that moves first scores its role's floor, and an actor the env listed in
``info["upcoming"]`` is shown, on its turn, exactly what the list said.

A ``TaskEnv``'s episodes are pinned to tasks spread over its whole dataset (first to last, see
:func:`spread_tasks`), not to whichever tasks the first seeds happen to draw. When a check fails
on an episode that recorded an error (a reward, a tool or the env raised), the message leads
with that error: it is the cause, the score is only the symptom.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from envhub.checks.table import render_text, results_table
from envhub.env import Env, TaskEnv
from envhub.errors import EnvCheckError
from envhub.roles import ROLE, ROLE_REWARDS, UPCOMING, MultiRoleEnv, role_totals_problem
from envhub.testing import Policy, null_policy
from envhub.tools.tool import TOOL_NAME_PATTERN
from envhub.types import ErrorRecord, Message, actor_role, as_message


@dataclass
class CheckResult:
    """The outcome of one named check.

    ``detail`` says what was checked when the check passes (e.g. ``"3 seeds"``), what went wrong
    when it fails, and why nothing was tested when it was skipped.
    """

    name: str
    passed: bool
    detail: str = ""
    skipped: bool = False
    """Nothing was tested (no reference policy declared, a gate left to ``--publish``); a
    skipped check counts as passed."""

    @property
    def outcome(self) -> str:
        """``ok``, ``fail`` or ``skipped``: the result column of the table."""
        return "skipped" if self.skipped else "ok" if self.passed else "fail"

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data (``outcome`` tells a skipped check from a passed one)."""
        return {
            "check": self.name,
            "passed": self.passed,
            "outcome": self.outcome,
            "detail": self.detail,
        }


class SkipCheck(Exception):
    """Raised by a check that has nothing to test; its message says why."""


@dataclass
class CheckReport:
    """Every check's result for one env, in the order the checks ran.

    ``print(report)`` shows the table ``envhub check`` prints.
    """

    env_name: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when every check passed."""
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> list[CheckResult]:
        """The results of the checks that failed."""
        return [r for r in self.results if not r.passed]

    def to_dict(self) -> dict[str, Any]:
        """The verdict and every check's result, as JSON-ready data."""
        return {
            "env": self.env_name,
            "passed": self.passed,
            "results": [r.to_dict() for r in self.results],
        }

    def __rich__(self) -> Any:
        return results_table(self.env_name, self.results, passed=self.passed)

    def __str__(self) -> str:
        return render_text(self.__rich__())


@dataclass(frozen=True)
class _Start:
    """How one checked episode starts: its seed and, for a TaskEnv, the task it is pinned to."""

    seed: int
    task: int | None = None

    @property
    def options(self) -> dict[str, Any] | None:
        return None if self.task is None else {"task_index": self.task}

    def __str__(self) -> str:
        return f"seed {self.seed}" if self.task is None else f"seed {self.seed}, task {self.task}"


@dataclass
class _Episode:
    observations: list[list[dict[str, Any]]]
    rewards: list[float]
    flags: list[tuple[bool, bool]]
    errors: list[ErrorRecord] = field(default_factory=list, compare=False)
    """What the env recorded (``info["errors"]``): the cause when a check fails."""
    role_totals: dict[str, float] = field(default_factory=dict, compare=False)
    """A multi-role env's total per actor that moved (``info["role_rewards"]`` summed)."""

    @property
    def total(self) -> float:
        return sum(self.rewards)

    def blame(self) -> str:
        """The first recorded error, to lead a failure message with ("" when there is none)."""
        if not self.errors:
            return ""
        first, more = self.errors[0], len(self.errors) - 1
        kind, _, name = first.stage.partition(":")
        where = f"{kind} `{name}`" if name else first.stage
        also = f" (and {more} more error{'s' * (more > 1)})" if more else ""
        return f"{where} raised {first.type}: {first.message}{also} — "


def spread_tasks(count: int, size: int) -> list[int]:
    """``count`` task indices spread evenly over ``size`` tasks, the first and last included;
    every task in order (then again) when ``count >= size``. 3 of 20 tasks: ``[0, 9, 19]``."""
    if count >= size:
        return [k % size for k in range(count)]
    if count == 1:
        return [0]
    return [k * (size - 1) // (count - 1) for k in range(count)]


def _starts(env: Env, seeds: tuple[int, ...]) -> tuple[_Start, ...]:
    if not isinstance(env, TaskEnv):
        return tuple(_Start(seed) for seed in seeds)
    tasks = spread_tasks(len(seeds), len(env.dataset))
    return tuple(_Start(seed, task) for seed, task in zip(seeds, tasks, strict=True))


def check_env(
    env: Env,
    *,
    seeds: tuple[int, ...] = (0, 1, 2),
    max_steps: int = 100,
    raise_on_failure: bool = True,
) -> CheckReport:
    """Check ``env`` against the envhub env contract.

    Args:
        env: The env to check; it is closed at the end.
        seeds: Seeds to reset with (each check uses them all). A ``TaskEnv``'s episodes are
            also pinned to tasks spread over its dataset (:func:`spread_tasks`).
        max_steps: An episode that has not ended after this many steps fails.
        raise_on_failure: Raise :class:`EnvCheckError` if any check fails.
    """
    report = CheckReport(getattr(env, "name", type(env).__name__))
    starts = _starts(env, seeds)
    checks: list[tuple[str, Callable[[], str]]] = [
        ("api", lambda: _check_api(env)),
        ("reset", lambda: _check_reset(env, starts)),
        ("dataset", lambda: _check_dataset(env)),
        ("determinism", lambda: _check_determinism(env, starts, max_steps)),
        ("tool schemas", lambda: _check_tools(env)),
        ("episodes", lambda: _check_episodes(env, starts, max_steps)),
        ("null policy at floor", lambda: _check_floor(env, starts, max_steps)),
        ("reference policy at top", lambda: _check_reference(env, starts, max_steps)),
        ("close", lambda: _check_close(env)),
    ]
    for name, check in checks:
        try:
            report.results.append(CheckResult(name, True, check()))
        except SkipCheck as e:
            report.results.append(CheckResult(name, True, str(e), skipped=True))
        except Exception as e:  # each check reports on its own
            report.results.append(
                CheckResult(
                    name,
                    False,
                    f"{type(e).__name__}: {e}" if not isinstance(e, AssertionError) else str(e),
                )
            )
    if raise_on_failure and not report.passed:
        lines = "\n".join(f"  - {r.name}: {r.detail}" for r in report.failures)
        raise EnvCheckError(f"{report.env_name} fails {len(report.failures)} check(s):\n{lines}")
    return report


def _dump(messages: list[Any]) -> list[dict[str, Any]]:
    return [as_message(m).to_openai() for m in messages]


def _check_api(env: Env) -> str:
    assert isinstance(env, Env), f"{type(env).__name__} is not an envhub.Env"
    assert isinstance(env.name, str) and env.name, "env.name must be a non-empty string"
    params = inspect.signature(env.reset).parameters
    for arg in ("seed", "options"):
        assert arg in params and params[arg].kind == inspect.Parameter.KEYWORD_ONLY, (
            f"reset() must take keyword-only `{arg}`"
        )
    low, high = env.reward_range
    assert low <= high, f"reward_range {env.reward_range} is empty"
    return f"{type(env).__name__} v{env.version}"


def _check_reset(env: Env, starts: tuple[_Start, ...]) -> str:
    for start in starts:
        result = env.reset(seed=start.seed, options=start.options)
        assert isinstance(result, tuple) and len(result) == 2, (
            "reset() must return (observation, info)"
        )
        observation, info = result
        assert isinstance(info, dict), f"reset() info must be a dict, got {type(info).__name__}"
        assert env.observation_space.contains(observation), (
            f"reset() observation is not a list of messages: {observation!r:.200}"
        )
        assert observation, "reset() returned no messages"
        assert _dump(observation)[-1]["role"] in ("user", "system", "tool"), (
            "the prompt must not end with an assistant message"
        )
    tasks = [start.task for start in starts if start.task is not None]
    if not tasks:
        return f"{len(starts)} seeds"
    return f"{len(starts)} seeds on tasks {', '.join(map(str, tasks))} of {len(env.dataset)}"


def _check_dataset(env: Env) -> str:
    """Every row makes a prompt: the seeded episodes see a few tasks, a bad row may hide."""
    if not isinstance(env, TaskEnv):
        return "no dataset"
    for index in range(len(env.dataset)):
        try:
            prompt = env.format_prompt(dict(env.dataset[index]))
        except Exception as e:
            raise AssertionError(
                f"task {index}: format_prompt raised {type(e).__name__}: {e}"
            ) from e
        assert prompt, f"task {index}: format_prompt returned no messages"
    return f"{len(env.dataset)} tasks make prompts"


def _run(
    env: Env, start: _Start, policy: Policy, max_steps: int, sampled: bool = False
) -> _Episode:
    observation, info = env.reset(seed=start.seed, options=start.options)
    actor = info.get(ROLE)  # None but for a multi-role env: then each actor has its own view
    views = {actor: list(observation)}
    promised = _note_upcoming({}, info)
    episode = _Episode([_dump(observation)], [], [])
    env.action_space.seed(start.seed)
    for _ in range(max_steps):
        action = (
            env.action_space.sample()
            if sampled
            else policy(list(map(as_message, views[actor])), env.tool_schemas)
        )
        observation, reward, terminated, truncated, info = env.step(action)
        _check_step_types(env, observation, reward, terminated, truncated, info)
        views[actor].append(Message(role="assistant", content=action))
        if actor is not None:
            episode.role_totals.setdefault(actor, 0.0)
            for who, paid in (info.get(ROLE_REWARDS) or {}).items():
                if who in episode.role_totals:
                    episode.role_totals[who] += float(paid)
            actor = info.get(ROLE)
            _keep_promise(promised, actor, observation)
            _note_upcoming(promised, info)
        views.setdefault(actor, []).extend(observation)
        episode.observations.append(_dump(observation))
        episode.rewards.append(float(reward))
        episode.flags.append((terminated, truncated))
        episode.errors += [ErrorRecord.model_validate(e) for e in info.get("errors") or ()]
        if terminated or truncated:
            return episode
    raise AssertionError(f"episode ({start}) did not end within {max_steps} steps")


def _note_upcoming(
    promised: dict[str, list[dict[str, Any]]], info: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    """Add what ``info["upcoming"]`` says each listed actor will be shown on its turn."""
    for actor, shown in (info.get(UPCOMING) or {}).items():
        promised.setdefault(actor, [as_message(m).model_dump() for m in shown])
    return promised


def _keep_promise(
    promised: dict[str, list[dict[str, Any]]], actor: str | None, observation: list[Any]
) -> None:
    """``actor``, whose turn it is, must be shown what ``info["upcoming"]`` said (if it was
    listed): the runner samples listed actors' turns ahead on that word."""
    if actor not in promised:
        return
    said, shown = promised.pop(actor), [as_message(m).model_dump() for m in observation]
    if shown == said:
        return
    pairs = enumerate(zip(said, shown, strict=False))
    at = next((i for i, (a, b) in pairs if a != b), min(len(said), len(shown)))
    raise AssertionError(
        f"info['upcoming'] said {actor} would be shown {len(said)} message(s) on its turn, but it "
        f"was shown {len(shown)}; message {at}: said {_content(said, at)!r}, shown "
        f"{_content(shown, at)!r}. List in Match.upcoming only actors that no move in between "
        "tells anything"
    )


def _content(messages: list[dict[str, Any]], index: int) -> str | None:
    """Message ``index``'s text, cut short (``None`` past the end)."""
    return (messages[index].get("content") or "")[:120] if index < len(messages) else None


def _check_step_types(
    env: Env, observation: Any, reward: Any, terminated: Any, truncated: Any, info: Any
) -> None:
    assert env.observation_space.contains(observation), (
        f"step() observation is not a list of messages: {observation!r:.200}"
    )
    assert isinstance(reward, (int, float)) and not isinstance(reward, bool), (
        f"reward must be a float, got {type(reward).__name__}"
    )
    assert math.isfinite(reward), f"reward must be finite, got {reward}"
    assert isinstance(terminated, bool) and isinstance(truncated, bool), (
        "terminated and truncated must be bools"
    )
    assert isinstance(info, dict), "step() info must be a dict"


def _check_determinism(env: Env, starts: tuple[_Start, ...], max_steps: int) -> str:
    for start in starts:
        for sampled in (False, True):
            first = _run(env, start, null_policy, max_steps, sampled)
            second = _run(env, start, null_policy, max_steps, sampled)
            assert first == second, f"{start}: two runs with the same seed and actions differ"
    return f"{len(starts)} seeds x (null, random) actions"


def _check_tools(env: Env) -> str:
    schemas = env.tool_schemas
    if schemas is None:
        return "no tools"
    names = []
    for schema in schemas:
        assert schema.get("type") == "function", f"tool schema type must be 'function': {schema}"
        function = schema.get("function") or {}
        name = function.get("name", "")
        assert isinstance(name, str) and TOOL_NAME_PATTERN.fullmatch(name), (
            f"tool name {name!r} must match {TOOL_NAME_PATTERN.pattern}"
        )
        assert isinstance(function.get("description"), str) and function["description"], (
            f"tool {name!r} needs a description"
        )
        parameters = function.get("parameters")
        assert isinstance(parameters, dict) and parameters.get("type") == "object", (
            f"tool {name!r}: parameters must be a JSON object schema"
        )
        jsonschema.Draft202012Validator.check_schema(parameters)
        names.append(name)
    assert len(set(names)) == len(names), f"tool names repeat: {names}"
    return ", ".join(names)


def _check_episodes(env: Env, starts: tuple[_Start, ...], max_steps: int) -> str:
    low, high = env.reward_range
    totals = []
    for start in starts:
        episode = _run(env, start, null_policy, max_steps, sampled=True)
        if isinstance(env, MultiRoleEnv):
            problem = role_totals_problem(env, episode.role_totals, bool(episode.errors))
            assert problem is None, f"{episode.blame()}{start}: {problem}"
            totals.append(episode.role_totals)
            continue
        assert low - 1e-9 <= episode.total <= high + 1e-9, (
            f"{episode.blame()}{start}: total reward {episode.total} "
            f"outside reward_range {env.reward_range}"
        )
        totals.append(episode.total)
    return f"random actions: rewards {totals}"


def _check_floor(env: Env, starts: tuple[_Start, ...], max_steps: int) -> str:
    return _check_policy_total(
        env, starts, max_steps, null_policy, env.reward_range[0], "the empty answer", "floor"
    )


def _check_reference(env: Env, starts: tuple[_Start, ...], max_steps: int) -> str:
    policy = getattr(env, "reference_policy", None)
    if policy is None:
        raise SkipCheck("no reference policy declared")
    return _check_policy_total(
        env, starts, max_steps, policy, env.reward_range[1], "the reference policy", "top"
    )


def _check_policy_total(
    env: Env,
    starts: tuple[_Start, ...],
    max_steps: int,
    policy: Policy,
    target: float,
    who: str,
    where: str,
) -> str:
    """Every seed's episode under ``policy`` totals exactly ``target`` (an end of reward_range)."""
    if not math.isfinite(target):
        raise SkipCheck(f"no finite {where} in reward_range")
    for start in starts:
        episode = _run(env, start, policy, max_steps)
        if isinstance(env, MultiRoleEnv) and where == "floor":  # the actor that moved first
            actor, total = next(iter(episode.role_totals.items()))
            floor = env.role_reward_range(actor_role(actor))[0]
            assert math.isclose(total, floor, abs_tol=1e-9), (
                f"{episode.blame()}{start}: {who} scored {total} as {actor}, who moved first; "
                f"it must score the floor of its role's reward range, {floor}"
            )
            continue
        assert math.isclose(episode.total, target, abs_tol=1e-9), (
            f"{episode.blame()}{start}: {who} scored {episode.total}; "
            f"it must score the {where} of reward_range, {target}"
        )
    return f"{target}"


def _check_close(env: Env) -> str:
    env.close()
    env.close()
    with env as same:
        assert same is env, "`with env as e` must give the env itself"
    return "idempotent"
