"""Warm starts on a tiny random Llama: a supervised step equals a hand-written cross-entropy
update; a run of supervised steps then RL resumes exactly in either stage; without a warm
start or a supervised term the run is plain GRPO, exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from envhub.testing import LetterEnv
from envhub.trainer.config import validate_config
from envhub.trainer.loop import SilentReporter, train

pytestmark = pytest.mark.usefixtures("letter_env")

ANSWERS = ["eeee", "see me", "tree", "bee here"]


@pytest.fixture
def demos(tmp_path: Path) -> Path:
    return _write_demos(tmp_path)


def _write_demos(folder: Path) -> Path:
    path = folder / "demos.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"Write a word ({i})."},
                      {"role": "assistant", "content": answer}]}
        for i, answer in enumerate(ANSWERS)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _config(model_dir: Path, out: Path, demos: Path | None, **parts: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "steps": 2,
        "seed": 5,
        "model": {"name": str(model_dir)},
        "envs": [{"name": LetterEnv.name}],
        "rollout": {"tasks_per_step": 2, "samples_per_task": 2, "max_tokens": 6},
        "algorithm": {"mismatch": "none"},
        "optimizer": {"lr": 1e-3, "grad_clip": 1.0},
        "backend": {"device": "cpu", "micro_batch_tokens": 256},
        "logging": {"output_dir": str(out), "run_name": "run", "plot": False},
        "checkpoint": {"every": 1, "keep_last": 5},
    }
    if demos is not None:
        config["sft"] = {"sources": [{"path": str(demos)}], "steps": 2, "batch_size": 2}
    for key, value in parts.items():
        config[key] = value if not isinstance(value, dict) else config.get(key, {}) | value
    return config


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()


def _hand_written_sft(model_dir: Path, lr: float) -> dict[str, torch.Tensor]:
    """One cross-entropy step on all four demonstrations, written plainly: each conversation
    rendered with the chat template, the loss on the answer and its <|im_end|>, token-mean."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    records = []
    for i, answer in enumerate(ANSWERS):
        prompt = [{"role": "user", "content": f"Write a word ({i})."}]
        before = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        before = list(before["input_ids"] if hasattr(before, "keys") else before)
        trained = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
        records.append((before + trained, [0] * len(before) + [1] * len(trained)))
    total = sum(sum(mask) for _, mask in records)
    for ids, mask in records:
        tokens = torch.tensor([ids])
        logprobs = torch.log_softmax(model(input_ids=tokens).logits[0, :-1].float(), -1)
        picked = logprobs.gather(-1, tokens[0, 1:, None])[:, 0]
        (-(picked * torch.tensor(mask[1:], dtype=torch.float32)).sum() / total).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0).step()
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_a_supervised_step_equals_a_hand_written_cross_entropy_update(
    tiny_model_dir: Path, tmp_path: Path, demos: Path
) -> None:
    config = _config(tiny_model_dir, tmp_path, demos, steps=0)
    config["sft"] |= {"steps": 1, "batch_size": 4, "lr": 5e-3}
    result = train(validate_config(config))
    expected = _hand_written_sft(tiny_model_dir, lr=5e-3)
    trained = _weights(result.final_model)
    for name, value in expected.items():
        # Adam's first step moves each weight by ~lr x sign(grad), so a wrong token would move
        # most of them the other way; where a gradient is as small as Adam's eps, rounding
        # (padding, packing) shifts a few: under 0.1% of them by more than 0.1% of lr
        difference = (trained[name] - value).abs()
        assert difference.mean().item() < 1e-6, name  # 0.02% of lr
        assert (difference > 5e-6).float().mean().item() < 1e-3, name
    (row,) = result.history
    assert row["sft/demonstrations"] == 4.0 and row["sft/epoch"] == 1.0
    assert row["train/lr"] == pytest.approx(5e-3)
    assert row["train/loss"] == pytest.approx(row["train/sft_nll"])
    assert "reward/mean" not in row and "train/clip_frac" not in row


class StopAfter(SilentReporter):
    """Stops the run (as a crash would) once step ``step`` is logged, before its checkpoint."""

    def __init__(self, step: int) -> None:
        self.at = step

    def step(self, step: int, metrics: dict[str, float]) -> None:
        if step == self.at:
            raise KeyboardInterrupt(f"stopped after step {step}")


def _warm_start_then_rl(model_dir: Path, out: Path, demos: Path) -> Any:
    cfg = _config(model_dir, out, demos)
    cfg["sft"] |= {"aux_weight": 0.5, "aux_batch_size": 1}
    return validate_config(cfg)


@pytest.fixture(scope="module")
def straight(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The uninterrupted warm start then RL that each stopped run must equal, run once (the
    tests read it and write nothing to its folder)."""
    import envhub
    from envhub import registry

    folder = tmp_path_factory.mktemp("straight")
    envhub.register(LetterEnv.name, LetterEnv, override=True)  # as ``letter_env`` does
    try:
        return train(_warm_start_then_rl(tiny_model_dir, folder / "a", _write_demos(folder)))
    finally:
        registry._registered.pop(LetterEnv.name, None)


@pytest.mark.parametrize("stop", [1, 3], ids=["in-the-warm-start", "in-rl"])
def test_warm_start_then_rl_resumes_exactly_in_either_stage(
    straight: Any, tiny_model_dir: Path, tmp_path: Path, demos: Path, stop: int
) -> None:
    def config(out: Path) -> Any:
        return _warm_start_then_rl(tiny_model_dir, out, demos)

    rows = straight.history
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all("sft/epoch" in r and "reward/mean" not in r for r in rows[:2])
    assert all(r["batch/demonstrations"] == 1.0 and r["train/sft_nll"] > 0 for r in rows[2:])

    with pytest.raises(KeyboardInterrupt):
        from envhub.trainer import loop

        loop.train(config(tmp_path / "b"), StopAfter(stop))
    resumed = train(config(tmp_path / "b"))
    assert resumed.resumed_from == stop - 1 or (stop == 1 and resumed.resumed_from is None)
    assert [r["step"] for r in resumed.history] == [1, 2, 3, 4]
    expected, got = _weights(straight.final_model), _weights(resumed.final_model)
    for name, value in expected.items():
        assert torch.equal(got[name], value), name
    for before, after in zip(rows, resumed.history, strict=True):
        for key in ("train/loss", "reward/mean", "sft/tokens"):
            assert before.get(key) == after.get(key), (before["step"], key)


def test_without_a_warm_start_or_a_supervised_term_the_run_is_plain_grpo(
    tiny_model_dir: Path, tmp_path: Path, demos: Path
) -> None:
    plain = train(validate_config(_config(tiny_model_dir, tmp_path / "plain", None)))
    mixed_cfg = _config(tiny_model_dir, tmp_path / "mixed", demos)
    mixed_cfg["sft"] |= {"steps": 0, "aux_weight": 0.0}
    mixed = train(validate_config(mixed_cfg))
    expected, got = _weights(plain.final_model), _weights(mixed.final_model)
    assert all(torch.equal(got[name], value) for name, value in expected.items())
    for a, b in zip(plain.history, mixed.history, strict=True):
        assert _untimed(a) == _untimed(b)


def _untimed(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row without what the clock measures."""
    timed = ("time/", "throughput/", "engine/tokens_per_second", "engine/generate_seconds")
    return {k: v for k, v in row.items() if not k.startswith(timed) and "cores" not in k}
