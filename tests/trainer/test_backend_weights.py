"""``TorchBackend.weights``: what a rollout engine loads after each step, in HF checkpoint form."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from safetensors.torch import load_file

from envhub.trainer.backends.torch_backend import TorchBackend
from envhub.trainer.config import validate_config


def _backend(model_dir: Path, **model: object) -> TorchBackend:
    return TorchBackend(
        validate_config(
            {
                "model": {"name": str(model_dir), **model},
                "envs": [{"name": "arithmetic"}],
                "backend": {"device": "cpu"},
            }
        )
    )


def test_full_weights_are_the_checkpoint_tensors_with_tied_ones_once(tiny_model_dir: Path) -> None:
    weights = dict(_backend(tiny_model_dir).weights())

    on_disk = load_file(str(tiny_model_dir / "model.safetensors"))
    assert set(weights) == set(on_disk) - {"lm_head.weight"}  # tied to the embedding
    for name, tensor in weights.items():
        assert torch.equal(tensor, on_disk[name]), name


def test_lora_weights_are_merged_per_tensor_without_touching_the_model(
    tiny_model_dir: Path,
) -> None:
    backend = _backend(
        tiny_model_dir, lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj", "down_proj"]}
    )
    with torch.no_grad():  # LoRA B starts at zero; give the adapters something to merge
        for name, p in backend.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.1)
    before = {n: p.detach().clone() for n, p in backend.model.named_parameters()}

    weights = dict(backend.weights())

    merged = copy.deepcopy(backend.model).merge_and_unload().state_dict()
    assert set(weights) == set(merged) - {"lm_head.weight"}
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, merged[name], rtol=0, atol=1e-6, msg=name)
    q = "model.layers.0.self_attn.q_proj.weight"
    base = before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"]
    assert (weights[q] - base).abs().max() > 1e-3  # the adapter's delta is in it
    assert all(torch.equal(p, before[n]) for n, p in backend.model.named_parameters())
