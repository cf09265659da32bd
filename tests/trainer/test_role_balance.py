"""``algorithm.role_balance``: each role of a multi-role env weighs the same in the update."""

from __future__ import annotations

import pytest

from envhub.trainer.algorithms import ObjectiveSpec, policy_objective
from envhub.trainer.batch import Sample, build_batch, micro_batches
from envhub.trainer.config import AlgorithmConfig
from envhub.trainer.role_balance import balance_roles, role_weights
from envhub.types import Trajectory

from .test_batch import _traj as batch_trajectory


def _traj(group: str, role: str | None, reward: float, answer: list[int], sample: int = 0):
    """test_batch's trajectory (prompt token 1, then ``answer`` in the loss), played as ``role``."""
    t = batch_trajectory(group, reward, [1, *answer], [0] + [1] * len(answer))
    return t.model_copy(update={"role": role, "sample_index": sample})


def _sample(trajectory: int, tokens: int, advantage: float = 1.0) -> Sample:
    ids, mask = [1] * (tokens + 1), [0] + [1] * tokens
    return Sample(ids, mask, [0.0] * (tokens + 1), advantage, trajectory)


def _setter_and_solvers() -> list[Trajectory]:
    """One episode: a setter's 3-token problem, then 4 solvers' answers (2 right in 6 tokens,
    2 wrong in 2), and the same task's second setter (1 token, reward 0: the pair has signal)."""
    return [
        _traj("g0", "setter", 1.0, [5, 6, 7], sample=0),
        *[_traj("g0", f"solver#{k}", float(k < 2), [7] * (6 if k < 2 else 2)) for k in range(4)],
        _traj("g0", "setter", 0.0, [8], sample=1),
    ]


def test_weights_by_hand_on_tokens_and_on_sequences() -> None:
    trajectories = _setter_and_solvers()
    samples = [_sample(0, 2), *[_sample(k, 6) for k in range(1, 5)], _sample(5, 2)]
    # tokens: setter 4, solver 24, total 28, two roles
    assert role_weights(samples, trajectories, "token-mean") == {
        "setter": pytest.approx(28 / 8),
        "solver": pytest.approx(28 / 48),
    }
    assert role_weights(samples, trajectories, "seq-mean-token-sum-norm")["setter"] == 3.5
    # sequences: setter 2, solver 4, total 6
    assert role_weights(samples, trajectories, "seq-mean-token-mean") == {
        "setter": pytest.approx(6 / 4),
        "solver": pytest.approx(6 / 8),
    }


def test_one_role_and_one_role_env_samples_are_left_alone() -> None:
    one_role = [_traj("a", None, 1.0, [5]), _traj("a", None, 0.0, [6, 7])]
    samples = [_sample(0, 1, 0.5), _sample(1, 2, -0.5)]
    assert role_weights(samples, one_role, "token-mean") == {}
    assert balance_roles(samples, one_role, "token-mean") == (samples, {})
    # a one-role env beside the setter-solver episode: its sample keeps 1, the roles share the
    # rest (setter 4 + solver 24 tokens = 28, each role 14)
    mixed = [*_setter_and_solvers(), _traj("b", None, 1.0, [3] * 10)]
    samples = [_sample(0, 2), *[_sample(k, 6) for k in range(1, 5)], _sample(5, 2), _sample(6, 10)]
    balanced, stats = balance_roles(samples, mixed, "token-mean")
    assert [s.advantage for s in balanced] == pytest.approx([3.5] + [28 / 48] * 4 + [3.5, 1.0])
    assert stats == {"batch/role_weight/setter": 3.5, "batch/role_weight/solver": 28 / 48}
    assert samples[0].advantage == 1.0  # the input is not changed


def test_per_token_advantages_are_scaled_too() -> None:
    trajectories = _setter_and_solvers()[:2]
    samples = [_sample(0, 2), _sample(1, 6)]
    samples[0].token_advantages = [0.0, 1.0, -1.0]
    balanced, _ = balance_roles(samples, trajectories, "token-mean")
    w = 8 / 4  # 2 setter tokens, 6 solver tokens
    assert balanced[0].token_advantages == [0.0, w, -w]
    assert balanced[1].advantage == pytest.approx(8 / 12)


def test_off_by_default_and_one_role_batches_are_unchanged() -> None:
    one_role = [_traj("a", None, r, [5 + i] * (i + 1)) for i, r in enumerate([1.0, 0.0, 0.0])]
    plain = build_batch(one_role, AlgorithmConfig(), max_tokens=16)
    balanced = build_batch(one_role, AlgorithmConfig(role_balance=True), max_tokens=16)
    assert balanced.samples == plain.samples and balanced.stats == plain.stats
    assert AlgorithmConfig().role_balance is False


def test_the_balanced_loss_is_the_mean_of_each_roles_token_mean() -> None:
    """Token by token: with the ratio at 1 the ppo_clip token loss is ``-A``; the balanced
    token-mean over the batch equals the mean over roles of each role's own token mean."""
    trajectories = _setter_and_solvers()
    batch = build_batch(trajectories, AlgorithmConfig(role_balance=True), max_tokens=16)
    plain = build_batch(trajectories, AlgorithmConfig(), max_tokens=16)
    # setter 3 + 1 tokens, solver 6 + 6 + 2 + 2: total 20
    assert batch.stats["batch/role_weight/setter"] == pytest.approx(20 / 8)
    assert batch.stats["batch/role_weight/solver"] == pytest.approx(20 / 32)
    # GRPO within each group: setters (1, 0) -> +-0.7071; solvers (1, 1, 0, 0) -> +-0.8660
    by_role: dict[str, list[float]] = {}
    for s in plain.samples:
        role = trajectories[s.trajectory].role_name
        by_role.setdefault(role, []).extend([-s.advantage] * sum(s.loss_mask[1:]))
    expected = sum(sum(v) / len(v) for v in by_role.values()) / len(by_role)
    (mb,) = micro_batches(batch, 1024, pad_id=0)
    logprobs = mb.sampler_logprobs.clone()
    loss, _ = policy_objective(
        ObjectiveSpec(),
        logprobs=logprobs,
        old_logprobs=logprobs,
        advantages=mb.advantages,
        mask=mb.loss_mask,
        num_tokens=batch.num_tokens,
        num_sequences=batch.num_sequences,
    )
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx((-2 * 2**-0.5 / 4 - 8 * 0.75**0.5 / 16) / 2, rel=1e-5)
    # unbalanced, the setters' 4 tokens of 20 weigh 1/5 of the loss, not 1/2
    unbalanced = sum(sum(v) for v in by_role.values()) / 20
    assert expected != pytest.approx(unbalanced)


def test_role_scale_by_hand_alone_and_after_the_balance() -> None:
    trajectories = _setter_and_solvers()
    samples = [_sample(0, 2), *[_sample(k, 6) for k in range(1, 5)], _sample(5, 2)]
    scaled, stats = balance_roles(
        samples, trajectories, "token-mean", balance=False, scale={"solver": 0.25, "x": 3.0}
    )
    assert [s.advantage for s in scaled] == [1.0, 0.25, 0.25, 0.25, 0.25, 1.0]
    assert stats == {"batch/role_weight/solver": 0.25}  # a role not in the batch is not logged
    both, stats = balance_roles(samples, trajectories, "token-mean", scale={"solver": 0.25})
    assert [s.advantage for s in both] == pytest.approx([3.5] + [28 / 48 * 0.25] * 4 + [3.5])
    assert stats["batch/role_weight/solver"] == pytest.approx(28 / 48 * 0.25)


def test_a_role_scaled_to_zero_is_played_but_not_trained() -> None:
    trajectories = _setter_and_solvers()
    batch = build_batch(trajectories, AlgorithmConfig(role_scale={"solver": 0.0}), max_tokens=16)
    kept = {trajectories[s.trajectory].role_name: s.has_signal for s in batch.samples}
    assert kept == {"setter": True, "solver": False}
    assert batch.stats["batch/role_weight/solver"] == 0.0
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        AlgorithmConfig(role_scale={"solver": -1.0})


def test_a_role_scale_naming_no_role_the_policy_plays_is_refused_at_start(tmp_path) -> None:
    from envhub.errors import ConfigError
    from envhub.trainer.config import validate_config
    from envhub.trainer.loop import train

    def config(scale: dict[str, float], env: str = "setter-solver") -> object:
        return validate_config({
            "envs": [{"name": env}],
            "algorithm": {"role_scale": scale},
            "logging": {"output_dir": str(tmp_path), "run_name": "run"},
        })  # fmt: skip

    with pytest.raises(ConfigError) as misspelt:
        train(config({"solvr": 0.25}))
    assert str(misspelt.value) == (
        "algorithm.role_scale names no role the policy plays: 'solvr' (did you mean 'solver'?); "
        "the envs' roles are ['setter', 'solver']"
    )
    with pytest.raises(ConfigError, match=r"no env of the run has roles the policy plays"):
        train(config({"solver": 0.5}, env="arithmetic"))
    assert not (tmp_path / "run").exists()  # refused before anything was written
