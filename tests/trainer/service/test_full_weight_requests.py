"""A service started with ``full_weights``: a model the SDK creates with its public call (which
always asks for LoRA) trains every weight, as SDK loops on the Megatron backend need; the
tiny Llama on the torch backend here (the Megatron path: test_megatron.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

tinker = pytest.importorskip("tinker")
torch = pytest.importorskip("torch")

from tests.trainer.service.serving import Running, datums  # noqa: E402

EXAMPLES = [([1, 504, 3458, 314], [216, 28, 30, 2]), ([1, 1145, 91, 7], [3458, 3458, 2])]


@pytest.fixture(scope="module")
def service(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    running = Running(tmp_path_factory.mktemp("serve-trainer-full"),
                      models=(f"tiny={tiny_model_dir}",), full_weights=True)  # fmt: skip
    yield running
    running.stop()


def test_a_lora_request_trains_every_weight(service: Running, tiny_model_dir: Path) -> None:
    from safetensors.torch import load_file

    training = service.client().create_lora_training_client(base_model="tiny", rank=4).result()
    info = training.get_info()
    assert info.is_lora is False and info.lora_rank is None
    training.forward_backward(datums(EXAMPLES), "cross_entropy").result()
    training.optim_step(tinker.types.AdamParams(learning_rate=1e-3)).result()
    path = training.save_weights_for_sampler("v1").result().path
    folder = service.settings.state_dir / path.removeprefix("tinker://")
    assert (folder / "config.json").is_file() and not (folder / "adapter").exists()
    saved = load_file(str(folder / "model.safetensors"))
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    changed = {name for name in start if not torch.equal(saved[name], start[name])}
    # every trained matrix moved: attention, MLP and the embeddings, none of them a LoRA's
    assert "model.embed_tokens.weight" in changed
    assert {n for n in start if n.endswith(("q_proj.weight", "down_proj.weight"))} <= changed
