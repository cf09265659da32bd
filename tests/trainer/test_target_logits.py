"""The torch backend runs the vocabulary head only where the loss looks: its logprobs, entropies
and gradients there equal the whole model's, and every other place is 0."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from envhub.trainer.algorithms import selective_log_softmax, token_entropy
from envhub.trainer.backends.torch_backend import TorchBackend, target_logits
from envhub.trainer.batch import Batch, Sample, micro_batches
from envhub.trainer.config import validate_config


def _backend(model_dir: Path, **model: object) -> TorchBackend:
    config = {
        "model": {"name": str(model_dir), **model},
        "envs": [{"name": "arithmetic"}],
        "backend": {"device": "cpu"},
        "rollout": {"temperature": 0.7},
    }
    return TorchBackend(validate_config(config))


def _micro_batch():
    generator = torch.Generator().manual_seed(3)
    masks = [[0, 0, 0, 1, 1, 1, 0, 0, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1]]
    samples = [
        Sample(torch.randint(0, 400, (len(m),), generator=generator).tolist(), m, [0.0] * len(m),
               1.0, i)
        for i, m in enumerate(masks)
    ]  # fmt: skip
    (mb,) = micro_batches(Batch(samples), 1024, pad_id=0)
    return mb


def _whole_model(backend: TorchBackend, mb) -> tuple[torch.Tensor, torch.Tensor]:
    logits = backend.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
    logits = logits[:, :-1].float() / 0.7
    return selective_log_softmax(logits, mb.input_ids[:, 1:]), token_entropy(logits)


@pytest.mark.parametrize("lora", [False, True])
def test_kept_places_equal_the_whole_model_and_the_rest_is_zero(
    tiny_model_dir: Path, lora: bool
) -> None:
    extra = {"lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj"]}} if lora else {}
    backend = _backend(tiny_model_dir, **extra)
    mb = _micro_batch()
    keep = mb.loss_mask > 0
    assert target_logits(backend.model, mb)[1] is not None  # a Llama: the head runs on N places

    logprobs, entropy = backend._token_logprobs(backend.model, mb, with_entropy=True)
    (logprobs * mb.loss_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in backend.model.named_parameters() if p.grad is not None}
    backend.model.zero_grad()
    full_logprobs, full_entropy = _whole_model(backend, mb)
    (full_logprobs * mb.loss_mask).sum().backward()

    torch.testing.assert_close(logprobs[keep], full_logprobs[keep], rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy[keep], full_entropy[keep], rtol=0, atol=1e-5)
    assert torch.equal(logprobs[~keep], torch.zeros(int((~keep).sum())))
    assert torch.equal(entropy[~keep], torch.zeros(int((~keep).sum())))
    assert grads  # LoRA: only the adapters
    for name, p in backend.model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-4, msg=name)


def test_a_model_with_a_post_processed_head_scores_every_place(tiny_model_dir: Path) -> None:
    backend = _backend(tiny_model_dir)
    backend.model.config.model_type = "gemma2"  # soft-caps its logits after the head
    mb = _micro_batch()
    logits, keep = target_logits(backend.model, mb)
    assert keep is None and logits.shape[:2] == mb.loss_mask.shape
    logprobs, _ = backend._token_logprobs(backend.model, mb)  # packed: nothing past an end
    real = mb.attention_mask[:, 1:] > 0
    torch.testing.assert_close(
        logprobs[real], _whole_model(backend, mb)[0][real], rtol=0, atol=1e-5
    )


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_a_padded_batch_scores_as_the_whole_model_with_any_attention(
    tiny_model_dir: Path, attention: str
) -> None:
    # SDPA gets its boolean 4-D mask built by envhub; eager adds its mask to the scores, so it
    # gets the 2-D mask and builds its own (a boolean mask added would attend to padding)
    backend = _backend(tiny_model_dir, attn_implementation=attention)
    assert not backend.packed
    mb = _micro_batch()
    assert not bool(mb.attention_mask.all())  # rows of 10, 5 and 7 tokens: padded
    keep = mb.loss_mask > 0
    logprobs, _ = backend._token_logprobs(backend.model, mb)
    whole, _ = _whole_model(backend, mb)
    torch.testing.assert_close(logprobs[keep], whole[keep], rtol=0, atol=1e-5)
