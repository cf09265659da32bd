"""The Ray layer: every part of a run that lives on Ray goes through here.

- :mod:`.ray_runtime`: importing Ray (with the install hint), joining or starting a cluster,
  and reading a failure out of Ray's errors (``death_cause``, ``describe_failure``);
- :mod:`.placement`: :class:`Placement` and :class:`WorkerGroup`, one Ray actor per rank of a
  ``torch.distributed`` job in one placement group (the Megatron backend's trainer ranks);
- :mod:`.run`: the cluster of one training run, sized for what it places there (trainer ranks,
  vLLM engines with ``rollout.vllm.mode: ray``, rollout workers).

Its users: the Megatron backend (``megatron.backend``), vLLM on Ray (``engines.vllm_ray``) and
rollout workers (``rollout_workers``). Its errors (``WorkerError``, ``WorkerDiedError``,
``WorkerGroupClosedError``, ``PlacementError``) live in :mod:`envhub.errors`, with the rest of
the tree. Ray itself is imported only when a function here needs it.
"""

from envhub.trainer.cluster.placement import Placement, WorkerGroup, rank_env
from envhub.trainer.cluster.ray_runtime import (
    death_cause,
    describe_failure,
    import_ray,
    init_ray,
    node_ip,
)

__all__ = [
    "Placement",
    "WorkerGroup",
    "death_cause",
    "describe_failure",
    "import_ray",
    "init_ray",
    "node_ip",
    "rank_env",
]
