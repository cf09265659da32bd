"""Regional compilation: one compiled block serves every layer, and micro-batches of many lengths
cost a bounded number of compilations (counted with dynamo's counters; the ``eager`` backend
traces as inductor would without generating code, so the count is the same and quick)."""

from __future__ import annotations

import pytest
import torch

from envhub.trainer.backends.compiled_layers import (
    bucket_length,
    compile_layers,
    compile_seconds,
    compiled_frames,
)

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    ("length", "bucket"),
    [(1, 16), (16, 16), (17, 32), (100, 112), (129, 160), (1000, 1024), (3000, 3072),
     (4097, 5120), (16384, 16384)],
)  # fmt: skip
def test_lengths_round_up_to_an_eighth_of_their_power_of_two(length: int, bucket: int) -> None:
    assert bucket_length(length) == bucket


def _tiny_llama(layers: int = 3) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
        attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def test_many_lengths_compile_a_bounded_number_of_times_and_match_eager() -> None:
    torch._dynamo.reset()
    model, reference = _tiny_llama(), _tiny_llama()
    assert compile_layers(model.get_decoder().layers, backend="eager") == 3
    before = compiled_frames()
    lengths = [5, 23, 40, 57]
    for n in lengths:
        ids = torch.randint(0, 64, (2, bucket_length(n, minimum=8)))
        ours = model(ids, use_cache=False).logits
        expected = reference(ids, use_cache=False).logits
        ours.sum().backward()
        torch.testing.assert_close(ours, expected)
    # The first length compiles the layer's frame; the second one compiles it again with the
    # length as a symbol; every later length, and every other layer, reuses that.
    assert compiled_frames() - before == 2
    assert compile_seconds() > 0
    assert {bucket_length(n, minimum=8) for n in lengths} == {8, 24, 40, 64}
