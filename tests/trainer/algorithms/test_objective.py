"""The assembled objective: one value and gradient by hand, and micro-batch invariance."""

from __future__ import annotations

import math

import pytest
import torch

from envhub.errors import ConfigError
from envhub.trainer.algorithms import ObjectiveSpec, policy_objective

LN = math.log


def test_full_objective_by_hand(device: str, assert_close) -> None:
    spec = ObjectiveSpec(
        kl_beta=0.1, kl_estimator="k3", entropy_coef=0.01, mismatch="tis", mismatch_cap=2.0
    )

    def t(*probs: float) -> torch.Tensor:
        return torch.tensor([[LN(p) for p in probs]], device=device)

    logp = t(0.5, 0.5, 0.5).requires_grad_()
    logp.data[0, 2] = float("nan")  # padding: garbage that must not leak
    old = t(0.4, 0.5, 0.5)  # PPO ratios 1.25, 1.0 (inside [0.8, 1.28])
    sampler = t(0.2, 0.5, 0.5)  # trainer/sampler 0.4/0.2 = 2 (= cap), 1 -> TIS weights 2, 1
    ref = t(0.25, 0.5, 0.5)  # k3 with x = ref - logp: e^x - x - 1 = 0.5 + ln 2 - 1, then 0
    entropy = torch.tensor([[1.0, 0.5, float("nan")]], device=device, requires_grad=True)
    mask = torch.tensor([[1, 1, 0]], device=device)

    loss, metrics = policy_objective(
        spec, logprobs=logp, old_logprobs=old, advantages=torch.tensor([2.0], device=device),
        mask=mask, num_tokens=2, num_sequences=1,
        sampler_logprobs=sampler, ref_logprobs=ref, entropy=entropy,
    )  # fmt: skip
    k3 = 0.5 + LN(2) - 1  # 0.193147
    token0 = 2 * -(1.25 * 2) + 0.1 * k3 - 0.01 * 1.0  # TIS weight * PPO + beta*KL - coef*H
    token1 = 1 * -(1.0 * 2) + 0.1 * 0 - 0.01 * 0.5
    assert loss.item() == pytest.approx((token0 + token1) / 2, abs=1e-6)  # token-mean over 2
    loss.backward()
    # d/dlogp: -w*A*ratio + beta*(1 - e^x), over num_tokens = 2:
    #   token 0: (-2*2*1.25 + 0.1*(1 - 0.5)) / 2 = -2.475; token 1: (-1*2*1 + 0) / 2 = -1.
    assert_close(logp.grad, [[-2.475, -1.0, 0.0]])
    assert_close(entropy.grad, [[-0.005, -0.005, 0.0]])
    got = {
        k: metrics[k].item() for k in ("policy_loss", "kl", "entropy", "ratio_mean", "clip_frac")
    }
    assert got == pytest.approx(
        {
            "policy_loss": (-5.0 - 2.0) / 2,
            "kl": k3 / 2,
            "entropy": 0.75,
            "ratio_mean": 1.125,
            "clip_frac": 0.0,
        }
    )
    assert metrics["mismatch_truncated_frac"].item() == 0.0  # 2.0 is not above the cap


def test_without_old_logprobs_it_is_the_on_policy_gradient(assert_close) -> None:
    logp = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]], requires_grad=True)
    loss, metrics = policy_objective(
        ObjectiveSpec(), logprobs=logp, old_logprobs=None, advantages=torch.tensor([1.0, -3.0]),
        mask=torch.tensor([[1, 1], [1, 0]]), num_tokens=3, num_sequences=2,
    )  # fmt: skip
    # Ratio 1 everywhere: loss = -(1 + 1 - 3) / 3; gradient -A / num_tokens on kept tokens.
    assert loss.item() == pytest.approx(1 / 3)
    loss.backward()
    assert_close(logp.grad, [[-1 / 3, -1 / 3], [1.0, 0.0]])
    assert metrics["ratio_mean"].item() == 1.0 and "kl" not in metrics


def _random_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (6, 5)
    lengths = torch.tensor([5, 1, 3, 4, 2, 5])
    old = -torch.rand(shape, generator=g, dtype=torch.float64) * 3
    return {
        "logprobs": (
            old + 0.3 * torch.randn(shape, generator=g, dtype=torch.float64)
        ).requires_grad_(),
        "old_logprobs": old,
        "sampler_logprobs": old + 0.5 * torch.randn(shape, generator=g, dtype=torch.float64),
        "ref_logprobs": old + 0.2 * torch.randn(shape, generator=g, dtype=torch.float64),
        "entropy": torch.rand(shape, generator=g, dtype=torch.float64, requires_grad=True),
        "advantages": torch.randn(6, generator=g, dtype=torch.float64),
        "mask": torch.arange(5)[None, :] < lengths[:, None],
    }


@pytest.mark.parametrize(
    "spec",
    [
        ObjectiveSpec(kl_beta=0.05, entropy_coef=0.01, dual_clip=3.0),
        ObjectiveSpec(policy_loss="gspo", eps_low=3e-4, eps_high=4e-4,
                      aggregation="seq-mean-token-mean", mismatch="mask-sequence", kl_beta=0.1,
                      kl_estimator="k2"),
        ObjectiveSpec(aggregation="seq-mean-token-sum-norm", norm_length=8, mismatch="mask-token"),
    ],
    ids=["ppo-token-mean", "gspo-seq-mean", "dr-grpo-sum-norm"],
)  # fmt: skip
@pytest.mark.parametrize("per_token", [False, True], ids=["sequence-adv", "token-adv"])
def test_micro_batch_invariance_of_the_whole_objective(
    spec: ObjectiveSpec, per_token: bool, device: str
) -> None:
    batch = {
        k: v.detach().to(device).requires_grad_(v.requires_grad) for k, v in _random_batch().items()
    }
    if per_token:  # a different advantage on every token (credit: turn, GAE)
        g = torch.Generator().manual_seed(1)
        batch["advantages"] = torch.randn(6, 5, generator=g, dtype=torch.float64).to(device)
    totals = {"num_tokens": int(batch["mask"].sum()), "num_sequences": 6}
    leaves = [batch["logprobs"], batch["entropy"]]

    whole, _ = policy_objective(spec, **batch, **totals)
    whole_grads = torch.autograd.grad(whole, leaves, allow_unused=True, materialize_grads=True)
    summed = 0.0
    for part in (slice(0, 1), slice(1, 4), slice(4, 6)):
        loss, _ = policy_objective(spec, **{k: v[part] for k, v in batch.items()}, **totals)
        summed = summed + loss
    split_grads = torch.autograd.grad(summed, leaves, allow_unused=True, materialize_grads=True)
    assert summed.item() == pytest.approx(whole.item(), abs=1e-6)
    for split, full in zip(split_grads, whole_grads, strict=True):
        assert torch.allclose(split, full, atol=1e-6, rtol=0)
    assert whole_grads[0].abs().sum() > 0  # the batch really trains


def test_spec_and_call_errors_say_what_to_fix() -> None:
    with pytest.raises(ConfigError, match="did you mean 'ppo_clip'"):
        ObjectiveSpec(policy_loss="ppo-clip")
    with pytest.raises(ConfigError, match="dual_clip must be > 1"):
        ObjectiveSpec(dual_clip=0.5)
    with pytest.raises(ConfigError, match="needs norm_length"):
        ObjectiveSpec(aggregation="seq-mean-token-sum-norm")
    x = torch.zeros(1, 2)
    kwargs = {"logprobs": x, "old_logprobs": x, "advantages": torch.zeros(1), "mask": x + 1}
    with pytest.raises(ConfigError, match="kl_beta > 0 needs ref_logprobs"):
        policy_objective(ObjectiveSpec(kl_beta=0.1), **kwargs, num_tokens=2, num_sequences=1)
    with pytest.raises(ConfigError, match="entropy_coef != 0 needs"):
        policy_objective(ObjectiveSpec(entropy_coef=0.1), **kwargs, num_tokens=2, num_sequences=1)


def test_stale_samples_clip_against_the_proximal_policy_and_reweight_to_the_behaviour_one(
    device: str, assert_close
) -> None:
    """The decoupled PPO objective (AReaL) for data an older policy sampled: the ratio is taken
    to the proximal policy (the trainer's, before this update) and clipped there; the truncated
    importance weight proximal / behaviour corrects for who really sampled."""

    def t(*probs: float) -> torch.Tensor:
        return torch.tensor([[LN(p) for p in probs]], device=device)

    spec = ObjectiveSpec(mismatch="tis", mismatch_cap=3.0)
    logp = t(0.55, 0.3).requires_grad_()
    proximal = t(0.5, 0.5)  # ratios 1.1 (inside [0.8, 1.28]) and 0.6 (below, but A > 0: no clip)
    behaviour = t(0.25, 0.6)  # weights 0.5/0.25 = 2 and 0.5/0.6 = 5/6
    loss, metrics = policy_objective(
        spec, logprobs=logp, old_logprobs=proximal, advantages=torch.tensor([1.0], device=device),
        mask=torch.tensor([[1, 1]], device=device), num_tokens=2, num_sequences=1,
        sampler_logprobs=behaviour,
    )  # fmt: skip
    # token 0: -2 * min(1.1, 1.1); token 1 (A > 0, ratio below 1 - eps): -(5/6) * min(0.6, 0.8)
    assert loss.item() == pytest.approx((-2 * 1.1 - 5 / 6 * 0.6) / 2, abs=1e-6)
    loss.backward()
    # Both inside the unclipped branch: d/dlogp = -w * ratio * A / 2. Clipping against the
    # behaviour policy instead would give token 0 a ratio of 2.2, clipped, and no gradient.
    assert_close(logp.grad, [[-2 * 1.1 / 2, -5 / 6 * 0.6 / 2]])
    assert metrics["ratio_mean"].item() == pytest.approx((1.1 + 0.6) / 2)


def test_with_fresh_samples_the_correction_is_exactly_one(device: str) -> None:
    """At max_staleness 0 the behaviour policy is the proximal one (up to the engine's numerics):
    where they agree, the weights are exactly 1 and the objective is bit-identical to plain PPO."""
    generator = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 5, generator=generator).to(device) - 2
    advantages = torch.randn(3, generator=generator).to(device)
    mask = torch.ones(3, 5, device=device)
    common = {"old_logprobs": logp, "advantages": advantages, "mask": mask}
    trained = [logp.clone().requires_grad_() for _ in range(2)]
    corrected, _ = policy_objective(
        ObjectiveSpec(mismatch="tis"), logprobs=trained[0],
        num_tokens=15, num_sequences=3, sampler_logprobs=logp.clone(), **common,
    )  # fmt: skip
    plain, _ = policy_objective(
        ObjectiveSpec(mismatch="none"),
        logprobs=trained[1],
        num_tokens=15,
        num_sequences=3,
        **common,
    )
    (corrected + plain).backward()
    assert torch.equal(corrected, plain) and torch.equal(trained[0].grad, trained[1].grad)


@pytest.mark.parametrize(
    "spec",
    [
        ObjectiveSpec(kl_beta=0.05, entropy_coef=0.01, dual_clip=3.0),
        ObjectiveSpec(policy_loss="gspo", eps_low=3e-4, eps_high=4e-4,
                      aggregation="seq-mean-token-mean", mismatch="mask-sequence"),
        ObjectiveSpec(aggregation="seq-mean-token-sum-norm", norm_length=8, mismatch="mask-token"),
    ],
    ids=["ppo-token-mean", "gspo-seq-mean", "dr-grpo-sum-norm"],
)  # fmt: skip
def test_per_sequence_advantages_broadcast_per_token_give_bit_identical_loss_and_gradient(
    spec: ObjectiveSpec, device: str
) -> None:
    """Today's (B,) advantages and the same values laid out per target token (B, T), as
    ``collate`` now does, give exactly the same loss, metrics and gradient."""
    batch = {
        k: v.detach().to(device).requires_grad_(v.requires_grad) for k, v in _random_batch().items()
    }
    totals = {"num_tokens": int(batch["mask"].sum()), "num_sequences": 6}
    leaves = [batch["logprobs"], batch["entropy"]]
    sequence = batch["advantages"]
    per_token = torch.zeros(6, 5, dtype=sequence.dtype, device=device)
    per_token[:] = sequence[:, None]
    per_token[~batch["mask"].bool()] = 0.0  # padding holds 0 now, not the sequence's value

    runs = []
    for advantages in (sequence, per_token):
        loss, metrics = policy_objective(spec, **(batch | {"advantages": advantages}), **totals)
        grads = torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True)
        runs.append((loss, metrics, grads))
    (loss_a, metrics_a, grads_a), (loss_b, metrics_b, grads_b) = runs
    assert torch.equal(loss_a, loss_b)
    assert metrics_a.keys() == metrics_b.keys()
    assert all(torch.equal(metrics_a[k], metrics_b[k]) for k in metrics_a)
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))


# -- supervised tokens (demonstrations) --------------------------------------------------------


def _mixed(device: str) -> dict:
    """Row 0: a sampled sequence (RL, advantage 2); row 1: a demonstration (weight 0.5) whose
    sampler logprobs are 0, as a demonstration has none."""
    logp = torch.tensor(
        [[LN(0.5), LN(0.25), 0.0], [LN(0.5), LN(0.125), LN(0.25)]], device=device
    ).requires_grad_()
    return {
        "logprobs": logp,
        "old_logprobs": None,
        "advantages": torch.tensor([[2.0, 2.0, 0.0], [0.0, 0.0, 0.0]], device=device),
        "mask": torch.tensor([[1, 1, 0], [0, 1, 1]], device=device),
        "num_tokens": 4,
        "num_sequences": 2,
        "sampler_logprobs": torch.tensor([[LN(0.5), LN(0.25), 0], [0, 0, 0]], device=device),
        "supervised": torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.5, 0.5]], device=device),
    }


def test_supervised_tokens_learn_by_cross_entropy_by_hand(device: str, assert_close) -> None:
    inputs = _mixed(device)
    loss, metrics = policy_objective(ObjectiveSpec(mismatch="tis"), **inputs)
    # RL tokens at ratio 1 and TIS weight 1: -A each; demonstration tokens: -w * logp.
    rl = -2.0 - 2.0
    demo = 0.5 * -LN(0.125) + 0.5 * -LN(0.25)
    assert loss.item() == pytest.approx((rl + demo) / 4, abs=1e-6)  # token-mean over all 4
    loss.backward()
    assert_close(inputs["logprobs"].grad, [[-0.5, -0.5, 0.0], [0.0, -0.125, -0.125]])
    assert metrics["sft_nll_per_token"].item() == pytest.approx((LN(8) + LN(4)) / 4)
    assert metrics["sft_token_frac"].item() == pytest.approx(0.5)  # their mean: the ratio
    assert metrics["policy_loss"].item() == pytest.approx(-2.0)  # the RL tokens only
    assert metrics["ratio_mean"].item() == pytest.approx(1.0)


def test_the_mismatch_correction_never_sees_a_demonstration_token(device: str) -> None:
    """Masking tokens whose trainer/sampler ratio is far from 1 drops none of the
    demonstration's (their 'sampler' logprob 0 makes ratios of 1/8 and 1/4)."""
    inputs = _mixed(device)
    spec = ObjectiveSpec(mismatch="mask-token", mismatch_low=0.5, mismatch_high=2.0)
    loss, metrics = policy_objective(spec, **inputs)
    assert metrics["mismatch_masked_frac"].item() == 0.0
    demo = 0.5 * -LN(0.125) + 0.5 * -LN(0.25)
    assert loss.item() == pytest.approx((-4.0 + demo) / 4, abs=1e-6)


def test_a_batch_of_demonstrations_alone_is_the_mean_negative_logprob(
    device: str, assert_close
) -> None:
    logp = torch.tensor([[LN(0.5), LN(0.25)], [LN(0.125), 0.0]], device=device)
    logp.requires_grad_()
    mask = torch.tensor([[1, 1], [1, 0]], device=device)
    loss, _ = policy_objective(
        ObjectiveSpec(mismatch="none"), logprobs=logp, old_logprobs=None,
        advantages=torch.zeros(2, device=device), mask=mask, num_tokens=3, num_sequences=2,
        supervised=mask.float(),
    )  # fmt: skip
    assert loss.item() == pytest.approx((LN(2) + LN(4) + LN(8)) / 3)
    loss.backward()
    assert_close(logp.grad, [[-1 / 3, -1 / 3], [-1 / 3, 0.0]])


def test_no_supervised_tokens_computes_exactly_what_it_did_without_them(device: str) -> None:
    inputs = _mixed(device)
    plain = dict(inputs, supervised=None)
    zeros = dict(inputs, supervised=torch.zeros_like(inputs["supervised"]))
    losses, grads, reports = [], [], []
    for case in (plain, zeros):
        logp = inputs["logprobs"].detach().clone().requires_grad_()
        loss, metrics = policy_objective(ObjectiveSpec(), **dict(case, logprobs=logp))
        loss.backward()
        losses.append(loss.detach())
        grads.append(logp.grad)
        reports.append(metrics)
    assert torch.equal(losses[0], losses[1]) and torch.equal(grads[0], grads[1])
    assert "sft_token_frac" not in reports[0] and reports[1]["sft_token_frac"].item() == 0.0
    for name, value in reports[0].items():
        assert torch.equal(value, reports[1][name]), name


def test_the_spec_takes_every_default_from_the_config() -> None:
    """One source: each default of ``ObjectiveSpec`` reads the config's ``algorithm`` section
    (none is written out in the spec), and the trainer's spec of a default config is the default
    spec with the length normaliser."""
    import ast
    import inspect

    from envhub import examples
    from envhub.trainer.algorithms import objective
    from envhub.trainer.config import AlgorithmConfig, load_config
    from envhub.trainer.step import objective_spec

    [spec_class] = ast.parse(inspect.getsource(objective.ObjectiveSpec)).body
    assert isinstance(spec_class, ast.ClassDef)
    defaults = {
        node.target.id: ast.unparse(node.value)  # type: ignore[union-attr,arg-type]
        for node in spec_class.body
        if isinstance(node, ast.AnnAssign)
    }
    assert defaults.pop("norm_length") == "None"  # the rollout's max_tokens, not an algorithm field
    assert len(defaults) == 12
    assert all(value == f"_ALGORITHM.{name}" for name, value in defaults.items()), defaults
    config = load_config(examples.path("quickstart"))
    config = config.model_copy(update={"algorithm": AlgorithmConfig()})
    expected = ObjectiveSpec(norm_length=config.rollout.max_tokens)
    assert objective_spec(config) == expected
