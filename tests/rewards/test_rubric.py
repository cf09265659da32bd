"""Rubrics: weights, totals, components, declaration-time checks, errors recorded as data."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pytest

from envhub.errors import RewardDefinitionError
from envhub.rewards.rubric import RewardFunction, Rubric, episode_arguments, group_reward, reward
from envhub.state import State
from envhub.types import ErrorRecord, Message, assistant, tool_message, user


def make_state(response: str = "42", answer: Any = "42", **task: Any) -> State:
    prompt = [user("What is 6 * 7?")]
    messages = [*prompt, assistant("Let me think."), tool_message("ok", "c1"), assistant(response)]
    return State(
        task={"question": "What is 6 * 7?", "answer": answer, **task},
        task_index=0,
        prompt=prompt,
        messages=messages,
    )


def test_episode_arguments() -> None:
    state = make_state(info={"level": 2})
    args = episode_arguments(state)
    assert args["prompt"] == [user("What is 6 * 7?")]
    assert args["completion"] == [
        assistant("Let me think."),
        tool_message("ok", "c1"),
        assistant("42"),
    ]
    assert args["response"] == "42"
    assert args["answer"] == "42"
    assert args["info"] == {"level": 2}
    assert args["task"] == {"question": "What is 6 * 7?", "answer": "42", "info": {"level": 2}}
    assert args["state"] is state


def test_weighted_total_and_unweighted_components() -> None:
    @reward(weight=0.5)
    def correct(response: str, answer: str) -> float:
        return float(response == answer)

    @reward(weight=-0.25, name="length")
    def long_answers(completion: list[Message]) -> int:
        return len(completion)

    score = asyncio.run(Rubric([correct, long_answers]).score(make_state()))
    assert score.components == {"correct": 1.0, "length": 3.0}
    assert score.total == 0.5 * 1.0 - 0.25 * 3.0
    assert score.errors == []


def test_weights_for_plain_functions_and_redeclared_weights() -> None:
    def one() -> float:
        return 1.0

    def two() -> float:
        return 2.0

    rubric = Rubric([one, reward(two, weight=5.0)], weights=[3.0, None])
    assert rubric.weights == {"one": 3.0, "two": 5.0}
    assert asyncio.run(rubric.score(make_state())).total == 3.0 * 1.0 + 5.0 * 2.0
    assert Rubric([reward(two, weight=5.0)], weights=[0.5]).weights == {"two": 0.5}


def test_rubric_construction_errors() -> None:
    def one() -> float:
        return 1.0

    with pytest.raises(RewardDefinitionError, match=r"^1 reward functions but 2 weights$"):
        Rubric([one], weights=[1.0, 2.0])
    with pytest.raises(
        RewardDefinitionError, match=r"^reward names must be unique, got \['one', 'one'\]$"
    ):
        Rubric([one, one])


def test_async_reward_functions_are_awaited() -> None:
    @reward
    async def slow(response: str) -> float:
        await asyncio.sleep(0)
        return 0.75

    score = asyncio.run(Rubric([slow]).score(make_state()))
    assert (score.total, score.components) == (0.75, {"slow": 0.75})


def test_declared_parameters_and_kwargs() -> None:
    seen: dict[str, Any] = {}

    @reward
    def everything(**kwargs: Any) -> float:
        seen.update(kwargs)
        return 1.0

    @reward
    def with_default(answer: str, tolerance: float = 0.1) -> float:
        return tolerance

    assert everything.takes_all and everything.params == ()
    assert with_default.params == ("answer",)
    score = asyncio.run(Rubric([everything, with_default]).score(make_state()))
    assert sorted(seen) == ["answer", "completion", "info", "prompt", "response", "state", "task"]
    assert score.components == {"everything": 1.0, "with_default": 0.1}


def test_unknown_parameter_is_rejected_at_declaration_with_the_allowed_list() -> None:
    with pytest.raises(RewardDefinitionError) as info:

        @reward
        def bad(response: str, ground_truth: str) -> float:
            return 0.0

    assert str(info.value) == (
        "reward 'bad' asks for 'ground_truth', which is not provided; "
        "choose from prompt, completion, response, answer, info, task, state (or take **kwargs)"
    )


def test_group_rewards_use_the_plural_vocabulary() -> None:
    with pytest.raises(RewardDefinitionError) as info:

        @group_reward
        def bad(response: str) -> list[float]:
            return []

    assert str(info.value) == (
        "group reward 'bad' asks for 'response', which is not provided; "
        "choose from prompts, completions, responses, answers, infos, tasks, states "
        "(or take **kwargs)"
    )


def test_var_positional_is_rejected() -> None:
    def bad(*args: Any) -> float:
        return 0.0

    with pytest.raises(RewardDefinitionError) as info:
        reward(bad)
    assert str(info.value) == "reward 'bad': *args is not supported; name the arguments you need"


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (float("nan"), "returned nan; a reward must be a finite number"),
        (float("inf"), "returned inf; a reward must be a finite number"),
        ("1.0", "returned '1.0'; a reward must be a finite number"),
        (None, "returned None; a reward must be a finite number"),
        ([1.0], "returned [1.0]; a reward must be a finite number"),
    ],
)
def test_non_finite_or_non_numeric_returns_score_zero_and_are_recorded(
    value: Any, error: str
) -> None:
    @reward
    def broken() -> Any:
        return value

    @reward
    def fine() -> float:
        return 1.0

    score = asyncio.run(Rubric([broken, fine]).score(make_state()))
    assert score.components == {"broken": 0.0, "fine": 1.0}
    assert score.total == 1.0
    assert score.errors == [
        ErrorRecord(stage="reward:broken", type="TypeError", message=f"broken {error}")
    ]


def test_a_raising_reward_scores_zero_and_scoring_goes_on() -> None:
    @reward(weight=2.0)
    def crashes(answer: str) -> float:
        raise KeyError("missing field")

    @reward
    def fine() -> float:
        return 0.5

    score = asyncio.run(Rubric([crashes, fine]).score(make_state()))
    assert score.components == {"crashes": 0.0, "fine": 0.5}
    assert score.total == 0.5
    assert score.errors == [
        ErrorRecord(stage="reward:crashes", type="KeyError", message="'missing field'")
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, 1.0), (False, 0.0), (np.float32(0.5), 0.5), (np.int64(3), 3.0), (2, 2.0)],
)
def test_bools_ints_and_numpy_scalars_are_numbers(value: Any, expected: float) -> None:
    score = asyncio.run(Rubric([reward(lambda: value, name="r")]).score(make_state()))
    assert score.components == {"r": expected}
    assert type(score.components["r"]) is float
    assert score.errors == []


def test_group_rewards_score_every_sample() -> None:
    @group_reward(weight=0.5)
    def rank(responses: list[str], answers: list[str]) -> list[float]:
        return [float(i) for i, _ in enumerate(responses)]

    @reward
    def per_episode() -> float:
        return 1.0

    rubric = Rubric([per_episode, rank])
    assert [f.name for f in rubric.episode_funcs] == ["per_episode"]
    assert [f.name for f in rubric.group_funcs] == ["rank"]
    scores = asyncio.run(rubric.score_group([make_state("a"), make_state("b"), make_state("c")]))
    assert [s.components for s in scores] == [{"rank": 0.0}, {"rank": 1.0}, {"rank": 2.0}]
    assert [s.total for s in scores] == [0.0, 0.5, 1.0]
    assert all(s.errors == [] for s in scores)


@pytest.mark.parametrize(
    ("result", "error"),
    [
        (
            [1.0],
            ErrorRecord(
                stage="reward:spread",
                type="ValueError",
                message="returned 1 values for a group of 2",
            ),
        ),
        (
            [1.0, float("nan")],
            ErrorRecord(
                stage="reward:spread",
                type="TypeError",
                message="spread returned nan; a reward must be a finite number",
            ),
        ),
        (
            0.5,
            ErrorRecord(
                stage="reward:spread", type="TypeError", message="'float' object is not iterable"
            ),
        ),
    ],
)
def test_bad_group_results_score_zero_for_everyone_and_are_recorded(
    result: Any, error: ErrorRecord
) -> None:
    @group_reward
    def spread(states: list[State]) -> Any:
        return result

    scores = asyncio.run(Rubric([spread]).score_group([make_state(), make_state()]))
    assert [s.components for s in scores] == [{"spread": 0.0}, {"spread": 0.0}]
    assert [s.errors for s in scores] == [[error], [error]]


def test_async_group_reward() -> None:
    @group_reward
    async def first_wins(states: list[State]) -> list[float]:
        return [1.0] + [0.0] * (len(states) - 1)

    scores = asyncio.run(Rubric([first_wins]).score_group([make_state(), make_state()]))
    assert [s.total for s in scores] == [1.0, 0.0]


def test_reward_function_is_callable_and_keeps_its_declaration() -> None:
    @reward(weight=3)
    def r(response: str) -> float:
        return len(response)

    assert isinstance(r, RewardFunction)
    assert (r.name, r.weight, r.group, r.params) == ("r", 3.0, False, ("response",))
    assert r("abc") == 3
    renamed = reward(r, name="other", weight=1)
    assert (renamed.name, renamed.weight, renamed.params) == ("other", 1.0, ("response",))
    assert math.isclose(asyncio.run(Rubric([r]).score(make_state("abcd"))).total, 12.0)
