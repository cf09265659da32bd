"""Which teacher a run's ``distill.teacher`` makes, beside which backend.

Apart from :mod:`~envhub.trainer.distill.teachers` because one choice is the Ray actor of
:mod:`~envhub.trainer.distill.ray_teacher`, which hosts a :class:`LocalTeacher` itself.
"""

from __future__ import annotations

from typing import Any

from envhub.trainer.distill.config import TeacherConfig
from envhub.trainer.distill.ray_teacher import RayTeacher
from envhub.trainer.distill.teachers import LocalTeacher, PolicyTeacher, ServerTeacher, Teacher


def make_teacher(config: TeacherConfig, backend: Any) -> Teacher:
    """The teacher ``config`` describes, beside ``backend`` (the policy's): a ``local`` one in
    this process beside the torch backend, in a Ray actor of its own beside the Megatron
    backend's ranks (:class:`~envhub.trainer.distill.ray_teacher.RayTeacher`)."""
    if config.kind == "server":
        assert config.url is not None
        return ServerTeacher(
            config.url, config.model, config.api_key, config.max_concurrency, config.timeout
        )
    if config.kind == "local":
        assert config.model is not None
        budget = getattr(getattr(backend, "config", None), "backend", None)
        tokens = getattr(budget, "micro_batch_tokens", 4096)
        if getattr(backend, "group", None) is not None:  # the policy's ranks are Ray actors
            on_gpu = getattr(backend.device, "type", "cpu") == "cuda"
            return RayTeacher(config.model, tokens, config.gpus if on_gpu else 0.0)
        return LocalTeacher(config.model, backend.device, tokens)
    return PolicyTeacher(backend)
