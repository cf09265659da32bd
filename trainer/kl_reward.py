"""KL in the reward, in the step: between scoring and the advantages.

    score -> [policy + reference logprobs -> per-token KL penalty -> controller update]
          -> estimate_advantages -> select -> update

The penalty needs each sampled token's logprob under the policy that sampled it and under the
reference model before any advantage exists, so the trainer scores every usable trajectory
twice (``backend.logprobs``, a forward pass each, no gradient) right after ``score``. The
policy's logprobs are the trainer's, not the sampler's, so engine rounding does not leak into
the reward (as verl, which uses ``old_log_prob``). The penalty rides on
:attr:`Scored.kl_penalty`; :func:`~envhub.trainer.batch.estimate_advantages` takes it off the
rewards. The controller then adapts its coefficient to the KL measured on these sequences (the
coefficient used is the one before the update, as in Ziegler et al.).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from envhub.trainer.algorithms import (
    KLController,
    kl_token_rewards,
    make_kl_controller,
    measured_kl,
)
from envhub.trainer.backends.base import TrainBackend
from envhub.trainer.batch import Batch, Sample
from envhub.trainer.config import TrainConfig
from envhub.trainer.scoring import Scored


def kl_controller(config: TrainConfig) -> KLController | None:
    """The controller of ``algorithm.kl_in_reward``'s coefficient; ``None`` when it is off."""
    spec = config.algorithm.kl_in_reward
    if spec is None:
        return None
    return make_kl_controller(spec.type, spec.coef, spec.target_kl, spec.horizon)


def charge_kl(
    scored: Scored, backend: TrainBackend, controller: KLController, estimator: str = "k1"
) -> tuple[Scored, dict[str, float]]:
    """``scored`` with the KL penalty of each usable trajectory's tokens, and the metrics
    ``kl_in_reward/kl`` (measured) and ``kl_in_reward/coef`` (used this step); updates
    ``controller``.

    Args:
        scored: The step's rewards and groups (:func:`~envhub.trainer.batch.score`).
        backend: Scores the sequences under the policy and the reference model.
        controller: Holds the coefficient; adapted to the measured KL.
        estimator: ``k1``, ``k2`` or ``k3``.
    """
    coef = controller.coef
    if not scored.usable:
        return scored, {"kl_in_reward/coef": coef}
    samples = []
    for k, i in enumerate(scored.usable):
        t = scored.trajectories[i]
        assert t.token_ids is not None and t.loss_mask is not None
        ids, mask = list(t.token_ids), list(t.loss_mask)
        samples.append(Sample(ids, mask, [0.0] * len(ids), 0.0, k))
    batches = backend.micro_batches(Batch(samples))
    policy = backend.logprobs(batches)
    reference = backend.logprobs(batches, reference=True)
    penalty: list[torch.Tensor] = [torch.zeros(0)] * len(samples)
    sequence_kl = torch.zeros(len(samples), dtype=torch.float64)
    for mb, lp, ref in zip(batches, policy, reference, strict=True):
        rewards, kl = kl_token_rewards(lp, ref, mb.loss_mask, coef, estimator)
        for row, index in enumerate(mb.samples):
            n = len(samples[index])
            tokens = torch.zeros(n, dtype=torch.float64)
            tokens[1:] = -rewards[row, : n - 1].double()  # target t scores token t + 1
            penalty[index] = tokens
            sequence_kl[index] = kl[row].double()
    current = measured_kl(sequence_kl)
    controller.update(current, n_steps=len(samples))
    return replace(scored, kl_penalty=penalty), {
        "kl_in_reward/kl": current,
        "kl_in_reward/coef": coef,
    }
