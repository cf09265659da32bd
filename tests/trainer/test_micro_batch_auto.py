"""``backend.micro_batch_tokens: auto``: the largest micro-batch whose activations fit beside the
training state in a GPU's memory, worked out by hand for Qwen2.5 shapes (no GPU needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from envhub.trainer.config import validate_config
from envhub.trainer.estimate import (
    Activations,
    GiB,
    largest_micro_batch,
    micro_batch_tokens,
    training_state_bytes,
)

QWEN_05B = Activations(tokens=4096, layers=24, hidden=896, intermediate=4864, vocab=151936,
                       dtype="bfloat16", recompute=False)  # fmt: skip
QWEN_05B_PARAMS = 494_032_768
QWEN_15B = Activations(tokens=4096, layers=28, hidden=1536, intermediate=8960, vocab=151936,
                       dtype="bfloat16", recompute=False)  # fmt: skip
QWEN_15B_PARAMS = 1_543_714_304


def _config(**backend: object) -> object:
    return validate_config({"envs": [{"name": "arithmetic"}], "backend": backend})


def test_the_training_state_is_18_bytes_per_parameter_and_more_with_a_reference() -> None:
    # float32 master copy 4, bf16 forward copy 2, gradient 4, AdamW moments 8
    assert training_state_bytes(_config(), 1000, 1000) == 18_000
    with_reference = validate_config(
        {"envs": [{"name": "arithmetic"}], "algorithm": {"kl_beta": 0.1}}
    )
    assert training_state_bytes(with_reference, 1000, 1000) == 24_000
    lora = training_state_bytes(_config(), 1000, 10)  # frozen weights: no gradient, no moments
    assert lora == 6000 + 120


@pytest.mark.parametrize(
    ("device_gib", "tokens"),
    [
        # 0.85 x 80 GiB = 73.0e9 bytes; the state 8.89e9; a token 3,101,184 bytes (layers
        # 2 x 24 x (8 x 896 + 4 x 4864) = 1,277,952, logits 151,936 x 4 x 3 = 1,823,232):
        # 16384 tokens are 50.8e9 and fit.
        (80, 16384),
        (141, 16384),  # the largest measured, whatever the memory
        (40, 8192),  # room 27.6e9: 8,902 tokens
        (24, 4096),  # room 13.0e9: 4,196 tokens
        (12, 1024),  # room 2.06e9: 664 tokens, below the smallest; the smallest
    ],
)
def test_a_05b_model_by_device_memory(device_gib: int, tokens: int) -> None:
    state = 18 * QWEN_05B_PARAMS
    assert largest_micro_batch(QWEN_05B, state, device_gib * GiB) == tokens


def test_a_15b_model_on_80_gib_fits_16k_only_with_recomputation() -> None:
    state = 18 * QWEN_15B_PARAMS  # 27.8e9
    # a token: layers 2 x 28 x 48,128 = 2,695,168 + logits 1,823,232: 10,008 tokens fit
    assert largest_micro_batch(QWEN_15B, state, 80 * GiB) == 8192
    # recomputed: layer inputs 2 x 28 x 1536 + one layer 2 x 48,128 = 182,272 per token
    recomputed = Activations(**{**QWEN_15B.__dict__, "recompute": True})
    assert largest_micro_batch(recomputed, state, 80 * GiB) == 16384


def test_a_number_is_kept_and_auto_is_4096_without_a_gpu(tiny_model_dir: Path) -> None:
    assert micro_batch_tokens(_config(micro_batch_tokens=512), 80 * GiB) == 512
    assert micro_batch_tokens(_config(), None) == 4096
    tiny = validate_config(
        {"model": {"name": str(tiny_model_dir)}, "envs": [{"name": "arithmetic"}]}
    )
    assert micro_batch_tokens(tiny, 80 * GiB) == 16384
    assert micro_batch_tokens(tiny, GiB // 100) == 1024
