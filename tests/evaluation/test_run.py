import math

import pytest

from envhub.evaluation import k_values, pass_at_k, summarize
from envhub.types import EnvRef, ErrorRecord, Message, Trajectory, TurnRecord


def traj(group: str, reward: float, **kwargs) -> Trajectory:
    return Trajectory(
        env=EnvRef(name="e"),
        task_index=0,
        group_id=group,
        messages=[Message(role="user", content="q")],
        prompt_length=1,
        reward=reward,
        **kwargs,
    )


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 0, 1, 0.0),
        (4, 4, 1, 1.0),
        (4, 1, 1, 0.25),
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (3, 2, 2, 1.0),  # n - c < k
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert math.isclose(pass_at_k(n, c, k), expected)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_k_values():
    assert k_values(1) == [1]
    assert k_values(3) == [1, 2, 3]
    assert k_values(8) == [1, 2, 4, 8]


def test_summarize_groups_components_tools_and_errors():
    trajectories = [
        traj(
            "g0",
            1.0,
            reward_components={"correct": 1.0},
            metrics={"tool_calls": 2, "tool_errors": 1, "tool_error/parse_error": 1},
            turns=[TurnRecord(completion_tokens=10), TurnRecord(completion_tokens=6)],
        ),
        traj(
            "g0",
            0.0,
            reward_components={"correct": 0.0},
            turns=[TurnRecord(completion_tokens=4)],
            stop_reason="max_turns",
        ),
        traj(
            "g1",
            0.0,
            reward_components={"correct": 0.0},
            metrics={"tool_calls": 2},
            errors=[ErrorRecord(stage="env.step", type="ValueError", message="x")],
            stop_reason="error",
            token_drift=[{"turn": 0, "position": 3}],
        ),
        traj("g1", 0.5, reward_components={"correct": 0.5}),
    ]
    s = summarize(trajectories, pass_threshold=1.0)
    assert (s.episodes, s.tasks, s.samples_per_task) == (4, 2, 2)
    assert s.reward_mean == 0.375
    assert math.isclose(
        s.reward_std, math.sqrt(((1 - 0.375) ** 2 + 2 * 0.375**2 + (0.5 - 0.375) ** 2) / 4)
    )
    assert s.components == {"correct": 0.375}
    # g0: one of two passes; g1: none. pass@1 = (0.5 + 0) / 2, pass@2 = (1 + 0) / 2
    assert s.pass_at == {1: 0.25, 2: 0.5}
    assert s.tool_calls == 1.0 and s.tool_validity == 0.75 and s.tool_errors == {"parse_error": 1}
    assert (s.tool_calls_total, s.episodes_with_tool_calls) == (4, 2)
    assert s.turns_mean == 0.75 and s.completion_tokens_mean == 5.0
    assert s.stop_reasons == {"terminated": 2, "max_turns": 1, "error": 1}
    assert (s.episodes_with_errors, s.error_stages, s.token_drift_episodes) == (
        1,
        {"env.step": 1},
        1,
    )


def test_summarize_without_tool_calls_reports_no_validity():
    s = summarize([traj("g0", 1.0)])
    assert s.tool_validity is None and s.pass_at == {1: 1.0}


# -- evaluate: the one entry point that plays an env and summarises it -------------------------


def _letters_policy(messages, tools) -> str:
    """Task 0 and 2 all ``e`` (reward 1), the others half (reward 0.5)."""
    import re

    number = int(re.search(r"\((\d+)\)", messages[-1].content).group(1))
    return "eeee" if number in (0, 2) else "eexx"


def test_named_tasks_get_a_row_each_with_their_own_pass_at_k():
    def named(task: str, index: int, reward: float) -> Trajectory:
        return traj(f"g{index}", reward, info={"task": task}).model_copy(
            update={"task_index": index}
        )

    trajectories = [
        named("upper-case", 1, 1.0), named("say-hi", 0, 0.0), named("upper-case", 1, 0.0),
        named("say-hi", 0, 0.0), named("upper-case", 1, 1.0), named("say-hi", 0, 1.0),
    ]  # fmt: skip
    summary = summarize(trajectories)
    assert summary.per_task == [
        {"task": "say-hi", "task_index": 0, "episodes": 3, "reward_mean": pytest.approx(1 / 3),
         "pass_at": {1: pytest.approx(1 / 3), 2: pytest.approx(2 / 3), 3: 1.0}},
        {"task": "upper-case", "task_index": 1, "episodes": 3, "reward_mean": pytest.approx(2 / 3),
         "pass_at": {1: pytest.approx(2 / 3), 2: 1.0, 3: 1.0}},
    ]  # fmt: skip
    assert summary.pass_at[1] == pytest.approx(0.5)  # the mean of the tasks' own
    unnamed = [traj("g0", 1.0), *trajectories[:2]]  # one episode's task without a name: no rows
    assert summarize(unnamed).per_task == []


def test_evaluate_plays_every_task_and_summarises_it(letter_env: str) -> None:
    import asyncio

    from envhub.evaluation import evaluate
    from envhub.testing import ScriptedEngine

    seen = []
    engine = ScriptedEngine(_letters_policy)
    result = asyncio.run(
        evaluate(engine, letter_env, [0, 1, 2], samples_per_task=2, on_trajectory=seen.append)
    )

    assert [t.task_index for t in result.trajectories] == [0, 0, 1, 1, 2, 2]
    assert [t.reward for t in result.trajectories] == [1.0, 1.0, 0.5, 0.5, 1.0, 1.0]
    assert sorted(id(t) for t in seen) == sorted(id(t) for t in result.trajectories)
    assert engine.requests == 6
    summary = result.summary
    assert summary.pass_threshold == 1.0  # the env's own, read off one env
    assert summary.pass_at == {1: pytest.approx(2 / 3), 2: pytest.approx(2 / 3)}
    assert summary.seconds > 0
    assert summary.model_copy(update={"seconds": 0.0}) == summarize(result.trajectories)


def test_evaluate_takes_a_factory_and_a_threshold(letter_env: str) -> None:
    import asyncio

    from envhub.errors import ConfigError
    from envhub.evaluation import evaluate
    from envhub.testing import LetterEnv, ScriptedEngine

    engine = ScriptedEngine(_letters_policy)
    result = asyncio.run(evaluate(engine, LetterEnv, [1, 3], pass_threshold=0.5, seed=4))
    assert result.summary.pass_at == {1: 1.0}
    with pytest.raises(ConfigError, match="env_args go with an env name"):
        asyncio.run(evaluate(engine, LetterEnv, [1], env_args={"x": 1}))
