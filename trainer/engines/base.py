"""What the training loop needs from a rollout engine beyond generating turns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envhub.inference.base import InferenceEngine

if TYPE_CHECKING:
    from envhub.trainer.backends.base import TrainBackend


@dataclass(frozen=True)
class SamplingState:
    """What a checkpoint keeps of an engine that seeds its own batches: the calls made so far
    (each batch's seed mixes it in), so a resumed run samples as the original did."""

    calls: int

    def to_json(self) -> dict[str, Any]:
        """Plain values."""
        return {"calls": self.calls}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SamplingState:
        """The state :meth:`to_json` wrote."""
        return cls(int(data["calls"]))


class RolloutEngine(InferenceEngine):
    """An :class:`InferenceEngine` the trainer drives step by step. The hooks do nothing by
    default; each engine overrides those that apply to it."""

    weights_version: int = 0
    """Weight updates received so far: the version of the policy the engine samples from
    (stamped on each generation as ``Generation.weight_version``)."""

    async def update_weights(
        self, backend: TrainBackend, version: int | None = None
    ) -> dict[str, float] | None:
        """Make the engine sample from ``backend``'s current weights, which are the policy of
        ``version`` (None: :attr:`weights_version` + 1); return ``sync/*`` metrics."""
        self.weights_version = self.weights_version + 1 if version is None else version
        return None

    async def check_alive(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Raise :class:`~envhub.errors.EngineUnavailableError` if the engine is gone."""

    async def sleep(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Free accelerator memory while the trainer updates (the next sync wakes it)."""

    def reset_stats(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Zero the counters :meth:`stats` reports (the loop does it every step)."""

    def stats(self) -> dict[str, float]:
        """Counters since the last :meth:`reset_stats` (logged as ``engine/*``)."""
        return {}

    def state_dict(self) -> dict[str, Any] | None:
        """Sampling state a checkpoint keeps (None: nothing to keep)."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - an optional hook, empty by default
        """Restore :meth:`state_dict`'s state on resume."""
