"""Checkpoints on a tiny real Llama: bit-exact round trips and resumes, SIGKILL mid-save,
rotation, corrupt folders, and HF export (plain and LoRA-merged)."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open

from envhub.errors import CheckpointError, ConfigError
from envhub.trainer.checkpoint import (
    CheckpointManager,
    capture_rng,
    export_hf,
    export_hf_weights,
    restore_rng,
)

TEXT = "The capital of France is"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(tiny_model_dir)


def _model(path: Path, **config: Any) -> Any:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **config)
    return model.train()


def _fresh(path: Path, seed: int = 123, **config: Any) -> Any:
    """The same architecture with other random weights, so a load must overwrite everything."""
    torch.manual_seed(seed)
    cfg = transformers.AutoConfig.from_pretrained(path, **config)
    return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).train()


def _optim(model: Any) -> tuple[Any, Any]:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))


def _train_step(model: Any, optimizer: Any, scheduler: Any) -> None:
    """One update whose batch comes from all three generators (and dropout from torch's)."""
    length = random.randint(5, 9)
    rows = int(np.random.randint(1, 3))
    ids = torch.randint(0, model.config.vocab_size, (rows, length))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _draws() -> tuple[list[float], float, list[float]]:
    return torch.rand(3).tolist(), random.random(), np.random.rand(3).tolist()


def _assert_same_params(a: Any, b: Any) -> None:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys()
    assert all(torch.equal(pa[name], pb[name]) for name in pa)


def _assert_same_optimizer(a: Any, b: Any) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys() and len(sa["state"]) > 0
    for index, state in sa["state"].items():
        assert state.keys() == sb["state"][index].keys()
        assert all(torch.equal(state[k], sb["state"][index][k]) for k in state)


def _logits(model: Any, tokenizer: Any) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(tokenizer(TEXT, return_tensors="pt").input_ids).logits


def test_round_trip_is_bit_exact(tmp_path: Path, tiny_model_dir: Path, tokenizer: Any) -> None:
    _seed_all(0)
    model = _model(tiny_model_dir)
    optimizer, scheduler = _optim(model)
    for _ in range(2):
        _train_step(model, optimizer, scheduler)
    state = {"step": 2, "cursors": [3, 0], "metrics": {"reward": 0.1 + 0.2}, "engine": None}
    manager = CheckpointManager(tmp_path / "ckpt")
    path = manager.save(
        2,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        trainer_state=state,
        tokenizer=tokenizer,
    )
    expected_draws = _draws()

    assert path == tmp_path / "ckpt" / "step-000002"
    assert sorted(p.name for p in path.iterdir()) == [
        "COMPLETE",
        "model",
        "optimizer.pt",
        "rng.pt",
        "scheduler.pt",
        "trainer_state.json",
    ]
    served = {p.name for p in (path / "model").iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    } <= served
    assert (tmp_path / "ckpt" / "latest").read_text() == "step-000002\n"
    manifest = json.loads((path / "COMPLETE").read_text())
    assert (
        manifest["step"] == 2
        and manifest["files"]["optimizer.pt"] == (path / "optimizer.pt").stat().st_size
    )

    fresh = _fresh(tiny_model_dir)
    fresh_optimizer, fresh_scheduler = _optim(fresh)
    assert not torch.equal(fresh.model.embed_tokens.weight, model.model.embed_tokens.weight)
    _seed_all(99)
    assert (
        manager.load(path, model=fresh, optimizer=fresh_optimizer, scheduler=fresh_scheduler)
        == state
    )
    assert _draws() == expected_draws
    _assert_same_params(model, fresh)
    assert fresh.lm_head.weight is fresh.model.embed_tokens.weight  # still tied after loading
    _assert_same_optimizer(optimizer, fresh_optimizer)
    assert (
        fresh_scheduler.last_epoch == 2
        and fresh_scheduler.get_last_lr() == scheduler.get_last_lr() == [1e-3]
    )
    # model/ alone is a plain HF folder
    _assert_same_params(model, transformers.AutoModelForCausalLM.from_pretrained(path / "model"))


def test_resume_continues_bit_for_bit(tmp_path: Path, tiny_model_dir: Path) -> None:
    manager = CheckpointManager(tmp_path)
    _seed_all(0)
    a = _model(tiny_model_dir, attention_dropout=0.2)
    a_optimizer, a_scheduler = _optim(a)
    for step in range(1, 5):
        _train_step(a, a_optimizer, a_scheduler)
        if step == 2:
            manager.save(
                step,
                model=a,
                optimizer=a_optimizer,
                scheduler=a_scheduler,
                trainer_state={"step": step},
            )

    def resumed(reseed: int | None) -> Any:
        b = _fresh(tiny_model_dir, attention_dropout=0.2)
        b_optimizer, b_scheduler = _optim(b)
        latest = manager.latest()
        assert latest is not None
        assert manager.load(latest, model=b, optimizer=b_optimizer, scheduler=b_scheduler) == {
            "step": 2
        }
        if reseed is not None:
            _seed_all(reseed)
        for _ in range(2):
            _train_step(b, b_optimizer, b_scheduler)
        return b

    _assert_same_params(a, resumed(None))
    # the noise matters: other draws after the same load give other weights
    other = resumed(reseed=1)
    assert not torch.equal(
        other.model.layers[0].self_attn.q_proj.weight, a.model.layers[0].self_attn.q_proj.weight
    )


_CHILD = """
import sys, time
import torch, transformers
from envhub.trainer.checkpoint import CheckpointManager

model_dir, root, reference = sys.argv[1:]
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
manager = CheckpointManager(root)

def step():
    ids = torch.randint(0, model.config.vocab_size, (1, 6))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()

step()
manager.save(1, model=model, optimizer=optimizer, trainer_state={"step": 1})
torch.save(model.state_dict(), reference)
real_save = torch.save

def slow_save(obj, f, *args, **kwargs):  # writes optimizer.pt, then waits to be killed
    real_save(obj, f, *args, **kwargs)
    print("WRITING", f, flush=True)
    time.sleep(600)

torch.save = slow_save
step()
manager.save(2, model=model, optimizer=optimizer, trainer_state={"step": 2})
"""


@pytest.mark.timeout(120)
def test_sigkill_mid_save_leaves_the_previous_checkpoint(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    root, reference = tmp_path / "ckpt", tmp_path / "reference.pt"
    with open(tmp_path / "child.log", "w") as log:
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(tiny_model_dir), str(root), str(reference)],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("WRITING"), (tmp_path / "child.log").read_text()
        child.send_signal(signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL
        child.stdout.close()
    stale = root / f".tmp-step-000002-{child.pid}"
    assert sorted(p.name for p in root.iterdir()) == [stale.name, "latest", "step-000001"]
    assert {p.name for p in stale.iterdir()} == {"model", "optimizer.pt"}  # killed mid-save

    manager = CheckpointManager(root)
    assert manager.latest() == root / "step-000001"
    model = _fresh(tiny_model_dir)
    optimizer, _ = _optim(model)
    assert manager.load(root / "step-000001", model=model, optimizer=optimizer) == {"step": 1}
    expected = torch.load(reference, weights_only=True)
    assert all(torch.equal(p, expected[name]) for name, p in model.named_parameters())
    with pytest.raises(CheckpointError, match=r"not a complete checkpoint .*delete it"):
        manager.load(stale, model=model)

    manager.save(2, model=model, optimizer=optimizer, trainer_state={"step": 2})
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000001", "step-000002"]


@pytest.fixture
def micro() -> tuple[Any, Any]:
    """A Llama small enough that saving it costs nothing: for the bookkeeping tests."""
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    return model, torch.optim.AdamW(model.parameters())


def _save(manager: CheckpointManager, micro: tuple[Any, Any], step: int) -> Path:
    model, optimizer = micro
    return manager.save(step, model=model, optimizer=optimizer, trainer_state={"step": step})


def test_rotation_keeps_the_newest_and_latest_falls_back(
    tmp_path: Path, micro: tuple[Any, Any]
) -> None:
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in range(1, 5):
        _save(manager, micro, step)
    assert manager.list() == [tmp_path / "step-000003", tmp_path / "step-000004"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000003", "step-000004"]
    assert manager.latest() == tmp_path / "step-000004"

    # the pointer names a deleted checkpoint: the newest complete one wins
    shutil.rmtree(tmp_path / "step-000004")
    assert manager.latest() == tmp_path / "step-000003"
    # higher-numbered folders that are incomplete, or still being written, never count
    (tmp_path / "step-000009" / "model").mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f".tmp-step-000010-{dead.pid}").mkdir()  # left by a save that died
    (tmp_path / "latest").write_text("step-000009\n")
    assert manager.latest() == tmp_path / "step-000003"
    assert manager.list() == [tmp_path / "step-000003"]

    # a run restarted from an older step: its new checkpoint is kept and is the latest
    _save(manager, micro, 2)
    assert manager.list() == [tmp_path / "step-000002", tmp_path / "step-000003"]
    assert manager.latest() == tmp_path / "step-000002"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000002", "step-000003"]
    with pytest.raises(ConfigError, match="keep_last"):
        CheckpointManager(tmp_path, keep_last=0)


def test_saving_a_step_again_replaces_it(tmp_path: Path, micro: tuple[Any, Any]) -> None:
    manager = CheckpointManager(tmp_path, keep_last=3)
    model, optimizer = micro
    manager.save(5, model=model, optimizer=optimizer, trainer_state={"run": "first"})
    manager.save(5, model=model, optimizer=optimizer, trainer_state={"run": "second"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000005"]
    assert manager.load(tmp_path / "step-000005", model=model) == {"run": "second"}


def test_missing_and_corrupt_checkpoints_raise_clear_errors(
    tmp_path: Path, micro: tuple[Any, Any]
) -> None:
    manager = CheckpointManager(tmp_path)
    model, optimizer = micro
    with pytest.raises(ConfigError, match="JSON-serialisable"):
        manager.save(1, model=model, optimizer=optimizer, trainer_state={"t": object()})
    assert list(tmp_path.iterdir()) == []  # refused before writing anything
    assert manager.latest() is None and manager.list() == []
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        manager.load(tmp_path / "step-000001", model=model)
    _save(manager, micro, 1)
    with pytest.raises(
        CheckpointError, match="holds checkpoints; pass one of its step-\\* folders"
    ):
        manager.load(tmp_path, model=model)

    good, bad = tmp_path / "step-000001", _save(manager, micro, 2)
    size = (bad / "optimizer.pt").stat().st_size
    (bad / "optimizer.pt").write_bytes(b"truncated")
    assert manager.latest() == good
    with pytest.raises(
        CheckpointError, match=rf"corrupt: optimizer.pt is 9 bytes, expected {size}; delete it"
    ):
        manager.load(bad, model=model, optimizer=optimizer)
    (bad / "COMPLETE").write_text("{not json")
    with pytest.raises(CheckpointError, match="COMPLETE is unreadable"):
        manager.load(bad, model=model)

    other = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
        )
    )
    with pytest.raises(CheckpointError, match="does not fit this model"):
        manager.load(good, model=other)
    with pytest.raises(CheckpointError, match="saved without an LR scheduler"):
        manager.load(good, model=model, scheduler=_optim(model)[1])


def test_rng_capture_and_restore() -> None:
    state = capture_rng()
    expected = _draws()
    restore_rng(state)
    assert _draws() == expected
    assert set(state) == (
        {"python", "numpy", "torch", "cuda"}
        if torch.cuda.is_available()
        else {"python", "numpy", "torch"}
    )


def test_export_reloads_with_identical_logits(
    tmp_path: Path, tiny_model_dir: Path, tokenizer: Any
) -> None:
    model = _model(tiny_model_dir)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f".tmp-final-{dead.pid}").mkdir()  # left by an export that was killed
    target = export_hf(model, tokenizer, tmp_path / "final")
    assert target == tmp_path / "final"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # no temporary folder left
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(target)
    assert torch.equal(_logits(reloaded, tokenizer), _logits(model, tokenizer))
    assert (
        reloaded.config.tie_word_embeddings
        and reloaded.lm_head.weight is reloaded.model.embed_tokens.weight
    )
    with safe_open(target / "model.safetensors", "pt") as f:
        assert "lm_head.weight" not in set(f.keys())  # stored once, as the embedding
    again = transformers.AutoTokenizer.from_pretrained(target)
    assert (
        again(TEXT).input_ids == tokenizer(TEXT).input_ids
        and again.chat_template == tokenizer.chat_template
    )


def test_bf16_export_leaves_the_live_model_alone(
    tmp_path: Path, tiny_model_dir: Path, tokenizer: Any
) -> None:
    model = _model(tiny_model_dir)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    export_hf(model, tokenizer, tmp_path / "final")
    target = export_hf(
        model, tokenizer, tmp_path / "final", dtype="bfloat16"
    )  # replaces the fp32 one
    assert all(
        p.dtype == torch.float32 and torch.equal(p, before[name])
        for name, p in model.named_parameters()
    )
    assert json.loads((target / "config.json").read_text())["dtype"] == "bfloat16"
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(target, dtype="auto")
    assert (
        reloaded.dtype == torch.bfloat16
        and reloaded.lm_head.weight is reloaded.model.embed_tokens.weight
    )
    assert all(
        torch.equal(p, before[name].to(torch.bfloat16)) for name, p in reloaded.named_parameters()
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


def test_export_refuses_to_replace_a_folder_that_is_not_a_model(
    tmp_path: Path, micro: tuple[Any, Any]
) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a model folder"):
        export_hf(micro[0], None, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_export_of_bare_weights_is_the_source_folder_with_new_tensors(
    tmp_path: Path, tiny_model_dir: Path, tokenizer: Any
) -> None:
    """What the Megatron backend exports: HF-named tensors next to the source's config and
    tokenizer, through the same atomic staging as ``export_hf``."""
    model = _model(tiny_model_dir)
    with torch.no_grad():
        model.model.norm.weight.add_(0.5)
    weights = {name: p.detach() for name, p in model.named_parameters() if name != "lm_head.weight"}
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a model folder"):
        export_hf_weights(weights, tiny_model_dir, tmp_path / "notes")
    target = export_hf_weights(weights, tiny_model_dir, tmp_path / "final")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "final",
        "notes",
    ]  # no temporary folder left
    assert sorted(p.name for p in target.iterdir()) == sorted(
        p.name for p in tiny_model_dir.iterdir()
    )
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(target)
    assert torch.equal(_logits(reloaded, tokenizer), _logits(model, tokenizer))
    assert reloaded.lm_head.weight is reloaded.model.embed_tokens.weight


def _lora(tiny_model_dir: Path, seed: int) -> Any:
    peft = pytest.importorskip("peft")
    torch.manual_seed(seed)
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
    )
    return peft.get_peft_model(_model(tiny_model_dir), config)


def test_lora_checkpoint_round_trip_and_merged_export(
    tmp_path: Path, tiny_model_dir: Path, tokenizer: Any
) -> None:
    peft = pytest.importorskip("peft")
    _seed_all(0)
    model = _lora(tiny_model_dir, seed=0)
    optimizer, scheduler = _optim(model)
    for _ in range(2):
        _train_step(model, optimizer, scheduler)
    manager = CheckpointManager(tmp_path / "ckpt")
    path = manager.save(
        2,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        trainer_state={"step": 2},
        tokenizer=tokenizer,
    )
    files = {p.name for p in (path / "model").iterdir()}
    assert {
        "adapter_config.json",
        "adapter_model.safetensors",
        "tokenizer.json",
    } <= files and "model.safetensors" not in files

    fresh = _lora(tiny_model_dir, seed=1)
    fresh_optimizer, fresh_scheduler = _optim(fresh)
    assert manager.load(
        path, model=fresh, optimizer=fresh_optimizer, scheduler=fresh_scheduler
    ) == {"step": 2}
    _assert_same_params(model, fresh)
    _assert_same_optimizer(optimizer, fresh_optimizer)
    with pytest.raises(CheckpointError, match="holds a LoRA adapter but the model has none"):
        manager.load(path, model=_model(tiny_model_dir))
    # model/ alone rebuilds the policy: its adapter config names the base model
    rebuilt = peft.AutoPeftModelForCausalLM.from_pretrained(path / "model")
    assert torch.equal(_logits(rebuilt, tokenizer), _logits(model, tokenizer))

    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    target = export_hf(model, tokenizer, tmp_path / "merged")
    assert isinstance(model, peft.PeftModel)
    assert all(
        torch.equal(p, before[name]) for name, p in model.named_parameters()
    )  # not merged in place
    merged = transformers.AutoModelForCausalLM.from_pretrained(target)
    assert not any("lora" in name for name in merged.state_dict())
    torch.testing.assert_close(
        _logits(merged, tokenizer), _logits(model, tokenizer), atol=1e-5, rtol=0
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_round_trip_restores_the_cuda_generator(
    tmp_path: Path, micro: tuple[Any, Any]
) -> None:
    model = micro[0].cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 64, (1, 5), device="cuda")
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    manager = CheckpointManager(tmp_path)
    path = manager.save(1, model=model, optimizer=optimizer, trainer_state={})
    expected = torch.rand(3, device="cuda").tolist()
    fresh = transformers.LlamaForCausalLM(model.config).cuda()
    fresh_optimizer = torch.optim.AdamW(fresh.parameters())
    torch.cuda.manual_seed_all(7)
    manager.load(path, model=fresh, optimizer=fresh_optimizer)
    assert torch.rand(3, device="cuda").tolist() == expected
    _assert_same_params(model, fresh)
    _assert_same_optimizer(optimizer, fresh_optimizer)
    assert all(state["exp_avg"].is_cuda for state in fresh_optimizer.state.values())
