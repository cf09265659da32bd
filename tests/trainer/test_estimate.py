"""The dry run's size and memory estimate: a critic adds its weights, gradients and AdamW."""

from __future__ import annotations

from pathlib import Path

from envhub.trainer.config import validate_config
from envhub.trainer.estimate import GiB, estimate


def _gib(text: str) -> float:
    return float(text.split(" GiB")[0])


def test_a_critic_adds_a_copy_of_the_weights_with_its_gradients_and_adamw(
    tiny_model_dir: Path,
) -> None:
    base = {"model": {"name": str(tiny_model_dir)}, "envs": [{"name": "arithmetic"}]}
    plain = estimate(validate_config(base))
    gae = {"advantage": "gae", "dynamic_sampling": False}
    with_critic = estimate(validate_config(base | {"algorithm": gae}))
    assert "critic (weights, gradients, AdamW)" not in plain
    params = float(plain["parameters"].split("M")[0]) * 1e6
    critic = _gib(with_critic["critic (weights, gradients, AdamW)"])
    assert abs(critic - params * 16 / GiB) < 0.01
    added = _gib(with_critic["total (rough)"]) - _gib(plain["total (rough)"])
    assert abs(added - critic) < 0.01
