"""Train backends: where the forward/backward/optimizer step runs (see :class:`TrainBackend`)."""

from envhub.trainer.backends.base import StepResult, TrainBackend

__all__ = ["StepResult", "TrainBackend", "make_backend"]


def make_backend(config):  # noqa: ANN001, ANN201 - config is a TrainConfig; kept import-light
    """Build the backend named by ``config.backend.kind``."""
    if config.backend.kind == "torch":
        from envhub.trainer.backends.torch_backend import TorchBackend

        return TorchBackend(config)
    if config.backend.kind == "megatron":
        from envhub.trainer.megatron.backend import MegatronBackend

        return MegatronBackend(config)
    from envhub.errors import ConfigError

    raise ConfigError(f"unknown backend {config.backend.kind!r}; available: torch, megatron")
