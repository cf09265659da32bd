"""A local teacher beside the Megatron backend: the checkpoint in a Ray actor of its own.

The Megatron backend's ranks are Ray actors and the driver holds no model, so a ``local``
teacher cannot live in the driver's process as it does beside the torch backend. Here it is a
:class:`LocalTeacher` inside a Ray actor (:class:`TeacherHost`), placed by the run's cluster:
on GPUs it takes ``distill.teacher.gpus`` of them (a share lets it sit on a GPU with something
else), on CPUs no logical CPU (it scores between sampling and the update, while the ranks wait).
The actor is the driver's: Ray ends it when the run's driver ends, however it ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from envhub.errors import ConfigError, EngineError
from envhub.trainer.cluster.ray_runtime import describe_failure, import_ray
from envhub.trainer.distill.teachers import LocalTeacher


class TeacherHost:
    """Runs in a Ray actor: one :class:`LocalTeacher` on the actor's device (the GPU Ray gave
    it, else the CPU)."""

    def __init__(self, model: str, micro_batch_tokens: int, on_gpu: bool) -> None:
        import ray

        self.node_ip = ray.util.get_node_ip_address()
        self.teacher = LocalTeacher(model, "cuda" if on_gpu else "cpu", micro_batch_tokens)

    def load(self, tokenizer: Any) -> str:
        """Load the checkpoint (refusing another vocabulary); the node it is on."""
        self.teacher.load(tokenizer)
        return self.node_ip

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """:meth:`LocalTeacher.logprobs`, in this actor."""
        return self.teacher.score(sequences)


class RayTeacher:
    """A :class:`LocalTeacher` in a Ray actor (see the module docstring); the same
    :class:`~envhub.trainer.distill.teachers.Teacher` calls.

    Args:
        model: An HF folder, id or alias (resolved in the actor, as ``model.name`` is).
        micro_batch_tokens: Padded tokens per forward pass.
        gpus: The GPUs (or share of one) the actor takes; 0 on a CPU cluster.
    """

    def __init__(self, model: str, micro_batch_tokens: int = 4096, gpus: float = 0.0) -> None:
        self.name = model
        self.micro_batch_tokens = micro_batch_tokens
        self.gpus = gpus
        self.node: str | None = None
        self._actor: Any = None

    def describe(self) -> str:
        """``MODEL (Ray actor on node IP, N GPUs)``."""
        where = f"node {self.node}" if self.node else "not started"
        devices = f", {self.gpus:g} GPU" + ("s" if self.gpus != 1 else "") if self.gpus else ""
        return f"{self.name} (Ray actor on {where}{devices})"

    async def start(self, tokenizer: Any) -> None:
        """Start the actor and load the checkpoint there; refuse another vocabulary."""
        ray = import_ray()
        remote = ray.remote(TeacherHost).options(num_cpus=0, num_gpus=self.gpus, max_restarts=0)
        self._actor = remote.remote(self.name, self.micro_batch_tokens, self.gpus > 0)
        self.node = await self._call(self._actor.load.remote(tokenizer), "load")

    async def logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """The actor's logprobs of each sequence (see :meth:`LocalTeacher.logprobs`)."""
        return await self._call(self._actor.score.remote([list(s) for s in sequences]), "score")

    async def _call(self, ref: Any, what: str) -> Any:
        ray = import_ray()
        try:
            return await ref
        except ray.exceptions.RayError as err:
            cause = getattr(err, "cause", None)
            if isinstance(cause, ConfigError):
                raise ConfigError(str(cause)) from None
            raise EngineError(
                f"the teacher {self.name} (Ray actor) failed to {what}: {describe_failure(err)}"
            ) from None

    async def aclose(self) -> None:
        """End the actor (its memory with it)."""
        if self._actor is not None:
            import_ray().kill(self._actor, no_restart=True)
            self._actor = None
