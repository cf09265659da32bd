"""The step's rollout metrics: the pooled share of valid tool calls is its own metric, apart
from the ``tool_validity`` reward component (a mean per episode)."""

from types import SimpleNamespace

from envhub.trainer.step import rollout_metrics
from envhub.types import EnvRef, Message, Trajectory


def _episode(calls: int, errors: int, validity: float) -> Trajectory:
    return Trajectory(
        env=EnvRef(name="tools"),
        task_index=0,
        group_id="g0",
        messages=[Message(role="user", content="q")],
        prompt_length=1,
        reward=validity,
        reward_components={"tool_validity": validity},
        metrics={"tool_calls": float(calls), "tool_errors": float(errors)},
    )


def test_valid_tool_calls_pool_every_call_and_the_component_keeps_its_own_name() -> None:
    # 1 of 1 calls valid, 1 of 3 valid: 2 of 4 calls pooled; per episode (1.0 + 1/3) / 2
    episodes = [_episode(1, 0, 1.0), _episode(3, 2, 1 / 3)]
    metrics = rollout_metrics(episodes, SimpleNamespace(pass_threshold=1.0))
    assert metrics["rollout/valid_tool_calls"] == 0.5
    assert metrics["reward/tool_validity"] == (1.0 + 1 / 3) / 2
    assert metrics["rollout/tool_calls"] == 2.0
    assert "rollout/tool_validity" not in metrics


def test_a_step_without_tool_calls_has_no_valid_share() -> None:
    metrics = rollout_metrics([_episode(0, 0, 1.0)], SimpleNamespace(pass_threshold=1.0))
    assert "rollout/valid_tool_calls" not in metrics
