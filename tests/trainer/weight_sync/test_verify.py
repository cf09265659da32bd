"""``Verifier.check``: which difference the tolerance bounds, which engine counts, the error."""

from __future__ import annotations

import asyncio

import pytest

from envhub.errors import WeightSyncError
from envhub.trainer.weight_sync.verify import Verifier

TRAINER = [-1.0, -2.0, -3.0, -4.0]


class Tokenizer:
    """Tokenises any text as one id per word (the verifier pads to ``tokens``)."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": list(range(len(text.split())))}


class Engine:
    """Scores the fixed sequence with given logprobs."""

    def __init__(self, logprobs: list[float]) -> None:
        self.logprobs = logprobs

    async def prompt_logprobs(self, ids: list[int]) -> list[float]:
        return self.logprobs


def check(verifier: Verifier, *engines: list[float]) -> dict[str, float]:
    return asyncio.run(verifier.check([Engine(e) for e in engines], TRAINER, version=3))


def test_a_16_bit_engine_is_held_to_the_mean_difference() -> None:
    """One token off by 0.6 (rounding on an unlikely token): the mean, 0.15, passes 0.2."""
    verifier = Verifier(Tokenizer(), tolerance=0.2, tokens=5, statistic="mean")
    metrics = check(verifier, [-1.6, -2.0, -3.0, -4.0])
    assert metrics == pytest.approx({"sync/logprob_diff_max": 0.6, "sync/logprob_diff_mean": 0.15})


def test_a_mean_difference_above_the_tolerance_stops_the_run() -> None:
    verifier = Verifier(Tokenizer(), tolerance=0.2, tokens=5, statistic="mean")
    with pytest.raises(WeightSyncError) as caught:
        check(verifier, [-1.3, -2.3, -3.3, -4.3])
    assert "by up to 0.3 (mean 0.3)" in str(caught.value)
    assert "the tolerance on the mean difference is 0.2" in str(caught.value)


def test_a_float32_engine_is_held_to_the_largest_difference() -> None:
    verifier = Verifier(Tokenizer(), tolerance=1e-3, tokens=5)
    with pytest.raises(WeightSyncError, match="tolerance on the largest difference is 0.001"):
        check(verifier, [-1.0, -2.0, -3.0, -4.002])
    assert check(verifier, [-1.0, -2.0, -3.0, -4.0005])["sync/logprob_diff_max"] == pytest.approx(
        5e-4
    )


def test_the_engine_worst_by_the_checked_difference_counts() -> None:
    """Engine 0 has the larger single gap, engine 1 the larger mean: with the mean checked,
    engine 1's numbers are reported and named in the error."""
    verifier = Verifier(Tokenizer(), tolerance=0.2, tokens=5, statistic="mean")
    spiky, shifted = [-1.7, -2.0, -3.0, -4.0], [-1.25, -2.25, -3.25, -4.25]
    with pytest.raises(WeightSyncError, match=r"\(engine 1 of 2\) .* by up to 0.25 \(mean 0.25\)"):
        check(verifier, spiky, shifted)


def test_an_unknown_statistic_is_refused() -> None:
    with pytest.raises(ValueError, match="max or mean"):
        Verifier(Tokenizer(), statistic="median")
