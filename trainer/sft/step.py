"""One step of the warm start: a batch of demonstrations, one supervised update, a sync.

    demonstrations of the step -> (engine sleeps) -> cross-entropy update -> sync the engine

The update is RL's (:func:`~envhub.trainer.step.run_update`, the same micro-batches, backends
and threads) with an objective whose every token is a demonstration's: the loss is the mean
negative logprob of the assistant turns' tokens over the batch (token-mean). Nothing rolls out,
so the engine gets the new weights only when something samples next: a held-out evaluation,
or the first RL step.
"""

from __future__ import annotations

from envhub.trainer.algorithms import ObjectiveSpec
from envhub.trainer.batch import Batch
from envhub.trainer.step import PhaseTimer, Run, demonstration_samples, run_update

SFT_METRICS = frozenset({"loss", "sft_nll", "entropy", "grad_norm", "lr", "micro_batches"})
"""What a supervised update reports (``train/*``): its loss (the mean negative logprob of the
demonstrations' tokens, also ``sft_nll``), their entropy, the gradient's norm and the learning
rate; the policy loss's metrics say nothing here."""


def supervised_spec() -> ObjectiveSpec:
    """The objective of a warm-start update: token-mean, no KL, no entropy bonus (every token
    is a demonstration's, so the policy loss and its mismatch correction never run)."""
    return ObjectiveSpec(aggregation="token-mean", mismatch="none")


async def sft_step(step: int, run: Run, sync: bool = True) -> dict[str, float]:
    """Supervised step ``step`` (counted from 0) of the run: its metrics (``train/*``,
    ``sft/*``, ``time/*`` and the sync's). ``sync``: send the engine the new weights (the
    loop asks for it when an evaluation or RL comes next; nothing samples in between)."""
    sft, demos = run.config.sft, run.demonstrations
    assert sft is not None and demos is not None, "a supervised step needs sft: demonstrations"
    timer = PhaseTimer(on_enter=run.on_phase)
    with timer("prepare"):
        batch = Batch(demonstration_samples(demos.batch(step, sft.batch_size), 1.0))
    await run.engine.sleep()
    update = await run_update(step, run, batch, timer, supervised_spec(), updates=1)
    synced = {}
    if sync:
        with timer("sync"):
            synced = await run.engine.update_weights(run.backend, version=step + 1) or {}
    metrics = {k: v for k, v in update.items() if k.removeprefix("train/") in SFT_METRICS}
    metrics |= {
        "sft/demonstrations": float(len(batch.samples)),
        "sft/tokens": float(batch.num_tokens),
        "sft/epoch": (step + 1) * sft.batch_size / len(demos),
    }
    return metrics | synced | timer.metrics()
