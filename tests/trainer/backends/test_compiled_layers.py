"""Regional compilation: one compiled block serves every layer, and packed rows of many lengths
and layouts cost a bounded number of compilations (counted with dynamo's counters; the
``eager`` backend traces as inductor would without generating code: the same count, quickly)."""

from __future__ import annotations

import itertools

import pytest
import torch

from envhub.trainer.backends import packed_attention
from envhub.trainer.backends.compiled_layers import (
    bucket_granule,
    bucket_length,
    compile_layers,
    compile_seconds,
    compiled_frames,
)
from envhub.trainer.batch import Batch, Sample, micro_batches

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    ("length", "bucket"),
    [(1, 16), (16, 16), (17, 32), (100, 112), (129, 160), (1000, 1024), (3000, 3072),
     (4097, 5120), (16384, 16384)],
)  # fmt: skip
def test_lengths_round_up_to_an_eighth_of_their_power_of_two(length: int, bucket: int) -> None:
    assert bucket_length(length) == bucket


def test_a_row_padded_to_a_multiple_of_its_granule_is_its_bucket() -> None:
    # What the Megatron worker does: Packing's multiple set to the bucket's granule.
    for length in range(1, 5000, 7):
        granule = bucket_granule(length)
        assert -(-length // granule) * granule == bucket_length(length), length


def _tiny_llama(layers: int = 3) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.set_attn_implementation(packed_attention.register())
    return model


def _row(lengths: list[int]) -> packed_attention.PackedRow:
    """A packed row of sequences of ``lengths`` (no shared prompts), padded to its bucket."""
    g = torch.Generator().manual_seed(sum(lengths))
    samples = [
        Sample(torch.randint(0, 64, (n,), generator=g).tolist(), [0] + [1] * (n - 1), [0.0] * n,
               1.0, i)
        for i, n in enumerate(lengths)
    ]  # fmt: skip
    (mb,) = micro_batches(Batch(samples), 1024, pad_id=0, packed=True)
    row = packed_attention.PackedRow.of(mb, share_prompts=False)
    return row.padded_to(bucket_length(row.input_ids.shape[1], minimum=8))


def test_packed_rows_of_many_layouts_compile_a_bounded_number_of_times() -> None:
    torch._dynamo.reset()
    model, reference = _tiny_llama(), _tiny_llama()
    assert compile_layers(model.get_decoder().layers, backend="eager") == 3
    layouts = [[5], [3, 9, 4], [7, 2, 11, 6], [20, 13], [9, 9, 9, 9, 9, 9]]
    frames = [compiled_frames()]
    for lengths in layouts:
        inputs = _row(lengths).model_inputs() | {"attention_mask": packed_attention.NO_MASK}
        ours = model(**inputs, use_cache=False).logits
        ours.sum().backward()
        torch.testing.assert_close(ours, reference(**inputs, use_cache=False).logits)
        frames.append(compiled_frames())
    # The layer's frames (split where the packed attention runs uncompiled) compile for the
    # first row's length, again with the length as a symbol for the second; the other rows,
    # whatever their segments, and the other layers reuse them.
    assert [b - a for a, b in itertools.pairwise(frames)] == [6, 6, 0, 0, 0]
    assert compile_seconds() > 0
