"""check_env: each kind of broken env fails the check that names the problem; calculator passes;
a task env is checked across its whole dataset, and a failure leads with the error recorded."""

from __future__ import annotations

import random
from typing import Any

import gymnasium as gym
import pytest

from envhub.checks.checker import check_env, spread_tasks
from envhub.env import Env, SingleTurnEnv
from envhub.envs.calculator import CalculatorEnv
from envhub.errors import EnvCheckError
from envhub.rewards.match import exact_match
from envhub.rewards.rubric import Rubric, reward
from envhub.state import State
from envhub.types import Message, user

CHECKS = [
    "api",
    "reset",
    "dataset",
    "determinism",
    "tool schemas",
    "episodes",
    "null policy at floor",
    "reference policy at top",
    "close",
]


class Good(Env):
    """Guess the seeded number; "right" is always right. Reward 1 for right, else 0."""

    name = "good"
    reward_range = (0.0, 1.0)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        gym.Env.reset(self, seed=seed)
        return [user(f"task {self.prompt_number()}")], {}

    def prompt_number(self) -> int:
        return int(self.np_random.integers(1000))

    def step(self, action: Any) -> tuple[list[Message], Any, bool, bool, dict[str, Any]]:
        return [], self.score(action), True, False, {}

    def score(self, action: Any) -> Any:
        return 1.0 if action == "right" else 0.0

    @staticmethod
    def reference_policy(messages: list[Message], tools: Any) -> str:
        return "right"


def failures(env: Env, **kwargs: Any) -> dict[str, str]:
    report = check_env(env, raise_on_failure=False, **kwargs)
    assert [r.name for r in report.results] == CHECKS
    return {r.name: r.detail for r in report.failures}


def test_a_good_env_passes() -> None:
    report = check_env(Good())
    assert report.passed and report.failures == []
    assert {r.name: r.detail for r in report.results} == {
        "api": "Good v0.0.0",
        "reset": "3 seeds",
        "dataset": "no dataset",
        "determinism": "3 seeds x (null, random) actions",
        "tool schemas": "no tools",
        "episodes": "random actions: rewards [0.0, 0.0, 0.0]",
        "null policy at floor": "0.0",
        "reference policy at top": "1.0",
        "close": "idempotent",
    }


def test_calculator_passes() -> None:
    report = check_env(CalculatorEnv(num_tasks=8), seeds=(0, 1))
    assert report.passed, report.failures
    assert {r.name: r.detail for r in report.results}["tool schemas"] == "calculate"


class NondeterministicReset(Good):
    def prompt_number(self) -> int:
        return random.randrange(10**9)


class OutOfRange(Good):
    def score(self, action: Any) -> Any:
        return 2.0


class BoolReward(Good):
    def score(self, action: Any) -> Any:
        return action == "right"


class NanReward(Good):
    def score(self, action: Any) -> Any:
        return float("nan")


class NeverEnds(Good):
    def step(self, action: Any) -> tuple[list[Message], Any, bool, bool, dict[str, Any]]:
        return [user("more")], 0.0, False, False, {}


class CloseTwiceFails(Good):
    def close(self) -> None:
        if getattr(self, "closed_once", False):
            raise RuntimeError("already closed")
        self.closed_once = True


class RewardsSilence(Good):
    def score(self, action: Any) -> Any:
        return 1.0 if action in ("", "right") else 0.0


class WrongReference(Good):
    @staticmethod
    def reference_policy(messages: list[Message], tools: Any) -> str:
        return "wrong"


def _schema(name: str, parameters: Any) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": "A tool.", "parameters": parameters},
    }


class BadToolName(Good):
    @property
    def tool_schemas(self) -> list[dict[str, Any]] | None:
        return [_schema("bad name", {"type": "object", "properties": {}})]


class BadToolParameters(Good):
    @property
    def tool_schemas(self) -> list[dict[str, Any]] | None:
        return [_schema("ok", {"type": "object", "properties": {"x": {"type": "integr"}}})]


class RepeatedTools(Good):
    @property
    def tool_schemas(self) -> list[dict[str, Any]] | None:
        return [_schema("t", {"type": "object"}), _schema("t", {"type": "object"})]


class PositionalReset(Good):
    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:  # type: ignore[override]
        return super().reset(seed=seed, options=options)


@pytest.mark.parametrize(
    ("env", "check", "detail"),
    [
        (
            NondeterministicReset(),
            "determinism",
            "seed 0: two runs with the same seed and actions differ",
        ),
        (OutOfRange(), "episodes", "seed 0: total reward 2.0 outside reward_range (0.0, 1.0)"),
        (BoolReward(), "episodes", "reward must be a float, got bool"),
        (NanReward(), "episodes", "reward must be finite, got nan"),
        (NeverEnds(), "episodes", "episode (seed 0) did not end within 5 steps"),
        (CloseTwiceFails(), "close", "RuntimeError: already closed"),
        (
            RewardsSilence(),
            "null policy at floor",
            "seed 0: the empty answer scored 1.0; it must score the floor of reward_range, 0.0",
        ),
        (
            WrongReference(),
            "reference policy at top",
            "seed 0: the reference policy scored 0.0; it must score the top of reward_range, 1.0",
        ),
        (BadToolName(), "tool schemas", "tool name 'bad name' must match ^[a-zA-Z0-9_-]{1,64}$"),
        (RepeatedTools(), "tool schemas", "tool names repeat: ['t', 't']"),
        (PositionalReset(), "api", "reset() must take keyword-only `seed`"),
    ],
)
def test_each_broken_env_fails_the_check_that_names_its_problem(
    env: Env, check: str, detail: str
) -> None:
    found = failures(env, max_steps=5)
    assert found[check] == detail


def test_an_invalid_parameters_schema_fails_the_tool_check() -> None:
    detail = failures(BadToolParameters())["tool schemas"]
    assert detail.startswith("SchemaError: 'integr' is not valid under any of the given schemas")


def test_every_failure_is_reported_at_once() -> None:
    assert set(failures(NeverEnds(), max_steps=5)) == {
        "determinism",
        "episodes",
        "null policy at floor",
        "reference policy at top",
    }
    with pytest.raises(EnvCheckError) as info:
        check_env(OutOfRange())
    assert str(info.value) == (
        "good fails 3 check(s):\n"
        "  - episodes: seed 0: total reward 2.0 outside reward_range (0.0, 1.0)\n"
        "  - null policy at floor: seed 0: the empty answer scored 2.0; "
        "it must score the floor of reward_range, 0.0\n"
        "  - reference policy at top: seed 0: the reference policy scored 2.0; "
        "it must score the top of reward_range, 1.0"
    )


def test_an_env_without_a_finite_reward_range_skips_floor_and_top() -> None:
    class Unbounded(Good):
        reward_range = (float("-inf"), float("inf"))

    report = check_env(Unbounded())
    details = {r.name: (r.outcome, r.detail) for r in report.results}
    assert (details["null policy at floor"], details["reference policy at top"]) == (
        ("skipped", "no finite floor in reward_range"),
        ("skipped", "no finite top in reward_range"),
    )
    assert report.passed


def test_no_reference_policy_is_a_skipped_row_in_the_table_and_the_dict() -> None:
    class NoReference(Good):
        reference_policy = None

    report = check_env(NoReference())
    assert report.passed
    assert [r.to_dict() for r in report.results if r.outcome != "ok"] == [
        {
            "check": "reference policy at top",
            "passed": True,
            "outcome": "skipped",
            "detail": "no reference policy declared",
        }
    ]
    assert report.to_dict()["results"][0] == {
        "check": "api",
        "passed": True,
        "outcome": "ok",
        "detail": "NoReference v0.0.0",
    }
    assert "│ reference policy at top │ skipped │ no reference policy declared" in str(report)


def test_print_shows_the_table_envhub_check_prints(capsys: pytest.CaptureFixture[str]) -> None:
    report = check_env(Good())
    print(report)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "good: passed"
    assert lines[1].startswith("┏") and lines[-1].startswith("└")
    rows = [
        [cell.strip() for cell in line.split("│")[1:4]] for line in lines if line.startswith("│")
    ]
    assert rows == [
        ["api", "ok", "Good v0.0.0"],
        ["reset", "ok", "3 seeds"],
        ["dataset", "ok", "no dataset"],
        ["determinism", "ok", "3 seeds x (null, random) actions"],
        ["tool schemas", "ok", "no tools"],
        ["episodes", "ok", "random actions: rewards [0.0, 0.0, 0.0]"],
        ["null policy at floor", "ok", "0.0"],
        ["reference policy at top", "ok", "1.0"],
        ["close", "ok", "idempotent"],
    ]


def test_a_plain_gymnasium_env_is_not_an_envhub_env() -> None:
    assert failures(gym.make("CartPole-v1").unwrapped)["api"] == "CartPoleEnv is not an envhub.Env"


# -- task envs: seeds spread over the dataset, causes before symptoms ---------------------------


@reward
def says_yes(response: str, answer: Any) -> Any:
    return "yes"


@reward
def divides(response: str) -> float:
    return 1 / 0


class Sums(SingleTurnEnv):
    """20 sums; the reference adds them up. Records the task of every reset."""

    name = "sums"
    reward_range = (0.0, 1.0)

    def __init__(self, **kwargs: Any) -> None:
        rows = [{"question": f"{i} + {i}", "answer": str(2 * i)} for i in range(20)]
        super().__init__(rows, **kwargs)
        self.tasks_seen: set[int] = set()

    def default_rubric(self) -> Rubric:
        return Rubric([exact_match(extract=False)])

    async def setup_state(self, state: State) -> None:
        self.tasks_seen.add(state.task_index)

    @staticmethod
    def reference_policy(messages: list[Message], tools: Any) -> str:
        left, right = str(messages[-1].content).split(" + ")
        return str(int(left) + int(right))


@pytest.mark.parametrize(
    ("count", "size", "tasks"),
    [
        (3, 20, [0, 9, 19]),
        (3, 8, [0, 3, 7]),
        (5, 8, [0, 1, 3, 5, 7]),
        (1, 5, [0]),
        (2, 2, [0, 1]),
        (5, 3, [0, 1, 2, 0, 1]),
    ],
)
def test_check_tasks_spread_from_the_first_to_the_last(count: int, size: int, tasks: list[int]):
    assert spread_tasks(count, size) == tasks


def test_a_task_env_is_checked_on_tasks_across_its_whole_dataset() -> None:
    # Before, seeds 0, 1, 2 drew whichever 3 of the 20 tasks the generator picked.
    env = Sums()
    report = check_env(env)
    assert report.passed, report.failures
    details = {r.name: r.detail for r in report.results}
    assert details["reset"] == "3 seeds on tasks 0, 9, 19 of 20"
    assert details["dataset"] == "20 tasks make prompts"
    assert env.tasks_seen == {0, 9, 19}


def test_a_failure_leads_with_the_error_the_episode_recorded() -> None:
    # Before: "seed 0: the reference policy scored 0.0; ..." and the TypeError only on the
    # trajectory.
    found = failures(Sums(rubric=Rubric([says_yes])))
    assert found == {
        "reference policy at top": "reward `says_yes` raised TypeError: says_yes returned 'yes'; "
        "a reward must be a finite number — seed 0, task 0: the reference policy scored 0.0; "
        "it must score the top of reward_range, 1.0"
    }
    two = failures(Sums(rubric=Rubric([divides, says_yes])))["reference policy at top"]
    assert two.startswith(
        "reward `divides` raised ZeroDivisionError: division by zero (and 1 more error) — seed 0"
    )


def test_a_row_that_makes_no_prompt_fails_the_dataset_check() -> None:
    class Games(Sums):
        reference_policy = None

        def format_prompt(self, task: dict[str, Any]) -> list[Message]:
            return [user(f"{task['low']} to {task['high']}")]

    games = Games()
    games.dataset = [{"low": i, "high": 9, "answer": "1"} for i in range(5)]
    del games.dataset[3]["high"]
    # The seeded episodes play tasks 0, 2 and 4: only the dataset check reads every row.
    assert failures(games) == {"dataset": "task 3: format_prompt raised KeyError: 'high'"}
