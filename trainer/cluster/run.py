"""The Ray cluster of a run: which of its parts live on Ray, and one local cluster sized for
them when no ``cluster.address`` is given.

Parts on Ray: the Megatron backend's trainer ranks (and its critic's, with ``advantage: gae``),
a vLLM engine with ``rollout.vllm.mode: ray`` and rollout workers. Each reserves logical CPUs;
on one machine they take turns on the same cores (rollouts, then the update), so the local
cluster offers what they reserve even when that is more than the machine's core count.
"""

from __future__ import annotations

from envhub.trainer.cluster.ray_runtime import import_ray, init_ray
from envhub.trainer.config import TrainConfig


def ray_cpus(config: TrainConfig) -> int:
    """Logical CPUs the run's parts on Ray reserve (0: nothing runs on Ray)."""
    cpus = 0
    if config.backend.kind == "megatron":
        from envhub.trainer.megatron.backend import plan

        placement, _ = plan(config)
        groups = 2 if config.algorithm.needs_critic else 1  # the critic's ranks, like the policy's
        cpus += groups * placement.world_size * placement.cpus_per_rank
    engine = config.rollout.vllm
    if config.rollout.engine == "vllm" and engine.mode == "ray" and not engine.colocate:
        cpus += engine.engines
    return cpus + config.rollout.workers


def start_ray(config: TrainConfig) -> bool:
    """Connect to ``cluster.address`` or start a local cluster sized by :func:`ray_cpus`, when
    any part of the run lives on Ray; True when this call started it (the run then stops it)."""
    cpus = ray_cpus(config)
    if not cpus:
        return False
    return init_ray(config.cluster.address, num_cpus=cpus)


def stop_ray(started: bool) -> None:
    """Stop the local cluster that :func:`start_ray` started (``started``)."""
    if started:
        import_ray().shutdown()
