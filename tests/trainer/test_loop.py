"""Real training steps on a tiny random Llama: the update equals a hand-written GRPO step,
the run's outputs are complete, and a run killed with SIGKILL resumes where it stopped.

The reward of the test env is the share of letters ``e`` in the reply: continuous, so every
group has variance and every step updates the model, even with random weights.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from envhub.rollout.io import iter_trajectories
from envhub.testing import LetterEnv
from envhub.trainer.checkpoint.manifest import LATEST
from envhub.trainer.config import validate_config
from envhub.trainer.loop import train

pytestmark = pytest.mark.usefixtures("letter_env")


def _config(model_dir: Path, out: Path, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "steps": 1,
        "seed": 3,
        "model": {"name": str(model_dir)},
        "envs": [{"name": LetterEnv.name}],
        "rollout": {"tasks_per_step": 2, "samples_per_task": 4, "max_tokens": 8},
        "algorithm": {"mismatch": "none", "dynamic_sampling": True},
        "optimizer": {"lr": 1e-3, "grad_clip": 1.0},
        "backend": {"device": "cpu", "micro_batch_tokens": 64},
        "logging": {"output_dir": str(out), "run_name": "run", "plot": True},
        "checkpoint": {"every": 1, "keep_last": 2},
    }
    for key, value in overrides.items():
        section, _, field = key.partition("__")
        if field:
            config[section][field] = value
        else:
            config[key] = value
    return config


def _grpo_reference_update(
    model_dir: Path, trajectories: list[Any], lr: float, clip: float
) -> dict[str, torch.Tensor]:
    """The same step written plainly: per-sequence forward (no padding, no micro-batches),
    GRPO advantages, token-mean PPO loss at ratio 1, clipping, one AdamW step."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    groups: dict[str, list[float]] = {}
    for t in trajectories:
        groups.setdefault(t.group_id, []).append(t.reward)
    kept = [t for t in trajectories if len(set(groups[t.group_id])) > 1]
    num_tokens = sum(sum(t.loss_mask[1:]) for t in kept)
    for t in kept:
        rewards = torch.tensor(groups[t.group_id], dtype=torch.float64)
        advantage = float((t.reward - rewards.mean()) / (rewards.std() + 1e-6))
        ids = torch.tensor([t.token_ids])
        logits = model(input_ids=ids).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
        mask = torch.tensor(t.loss_mask[1:], dtype=torch.float32)
        ratio = torch.exp(logprobs - logprobs.detach())
        loss = -(advantage * ratio * mask).sum() / num_tokens
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_one_step_equals_a_hand_written_grpo_update(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = validate_config(_config(tiny_model_dir, tmp_path))
    result = train(config)
    run = tmp_path / "run"
    trajectories = list(iter_trajectories(run / "trajectories" / "step-000001.jsonl"))
    assert len(trajectories) == 8 and all(t.token_ids and t.ok for t in trajectories)
    expected = _grpo_reference_update(tiny_model_dir, trajectories, lr=1e-3, clip=1.0)
    trained = AutoModelForCausalLM.from_pretrained(
        result.final_model, dtype=torch.float32
    ).state_dict()
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    changed = 0
    for name, value in expected.items():
        # AdamW's first step moves every weight by ~lr * sign(grad); where a gradient is as small as
        # Adam's eps, float rounding (padding, micro-batching) shifts it a little: allow 1% of lr
        difference = (trained[name] - value).abs()
        assert difference.max().item() < 1e-5, name
        assert difference.mean().item() < 1e-7, name
        changed += not torch.equal(trained[name], initial[name])
    assert changed >= len(expected) - 1  # every weight moved (a rotary buffer may not exist)
    row = result.history[0]
    assert row["step"] == 1
    assert row["batch/kept"] == 8.0 and row["train/micro_batches"] > 1  # 64-token micro-batches
    assert row["reward/mean"] == pytest.approx(sum(t.reward for t in trajectories) / 8)


def test_a_run_leaves_metrics_trajectories_checkpoints_plot_and_an_hf_model(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = validate_config(_config(tiny_model_dir, tmp_path, steps=2, algorithm__mismatch="tis"))
    result = train(config)
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "reward/mean",
        "pass@1",
        "train/loss",
        "train/entropy",
        "train/grad_norm",
        "train/mismatch_kl",
        "time/rollout",
        "time/update",
        "throughput/rollout_tokens_per_s",
    ):
        assert key in rows[0], key
    # the in-process engine samples from the very weights the trainer scores
    assert rows[0]["train/mismatch_abs_logprob_diff_mean"] < 1e-4
    # its batching: 8 episodes of one turn each, in generate calls of at most 64 rows
    assert rows[0]["engine/generated_tokens"] == pytest.approx(
        rows[0]["rollout/completion_tokens"] * 8
    )
    assert rows[0]["engine/generate_calls"] >= 1
    assert rows[0]["engine/mean_batch_size"] * rows[0]["engine/generate_calls"] == pytest.approx(8)
    assert sorted(p.name for p in (run / "trajectories").iterdir()) == [
        "step-000001.jsonl",
        "step-000002.jsonl",
        "trainer",  # the trainer's logprobs of each step's trained tokens
    ]
    trained = [r["step"] for r in rows if r["batch/kept"] > 0]
    assert sorted(p.name for p in (run / "trajectories" / "trainer").iterdir()) == [
        f"step-{step:06d}.jsonl" for step in trained
    ]
    assert sorted(
        p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step-")
    ) == ["step-000001", "step-000002"]
    assert result.plot == run / "reward.png" and result.plot.stat().st_size > 1000
    reloaded = AutoModelForCausalLM.from_pretrained(result.final_model)
    assert reloaded.config.num_hidden_layers == 2
    assert json.loads((run / "config.json").read_text())["steps"] == 2
    manifest = json.loads((run / "manifest.json").read_text())  # what made the run
    assert manifest["env_refs"] == [{"name": LetterEnv.name, "version": "0.0.1", "commit": None}]
    assert [
        (s["engine"], s["model"], s["sampling"]["max_tokens"]) for s in manifest["samplers"]
    ] == [("hf", str(tiny_model_dir), 8)]


def _task_order(run: Path) -> list[list[int]]:
    files = sorted((run / "trajectories").glob("step-*.jsonl"))
    return [[t.task_index for t in iter_trajectories(f)] for f in files]


def _names(pointer: Path, name: str) -> bool:
    try:
        return pointer.read_text(encoding="utf-8").strip() == name
    except OSError:
        return False


def test_a_run_killed_with_sigkill_resumes_with_the_same_data_order(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    straight = validate_config(_config(tiny_model_dir, tmp_path / "a", steps=4))
    train(straight)
    expected_order = _task_order(tmp_path / "a" / "run")

    killed_cfg = _config(tiny_model_dir, tmp_path / "b", steps=4)
    cfg_path = tmp_path / "b.json"
    cfg_path.write_text(json.dumps(killed_cfg))
    script = (
        "import json, sys; from envhub.trainer.config import validate_config; "
        "from envhub.trainer.loop import train;"
        "train(validate_config(json.load(open(sys.argv[1]))))"
    )
    register = (
        "import envhub; from envhub.testing import LetterEnv; "
        "envhub.register(LetterEnv.name, LetterEnv);"
    )
    process = subprocess.Popen([sys.executable, "-c", register + script, str(cfg_path)])
    # A checkpoint is committed when `latest` names it (its folder appears just before): a
    # kill in between resumes, correctly, from the one before (seen once under load in CI).
    pointer = tmp_path / "b" / "run" / "checkpoints" / LATEST
    deadline = time.monotonic() + 300
    while not _names(pointer, "step-000002") and process.poll() is None:
        assert time.monotonic() < deadline, "checkpoint 2 was not committed within 300 s"
        time.sleep(0.05)
    assert process.poll() is None, "the run ended before it could be killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    rows_before = (tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()
    assert 2 <= len(rows_before) < 4

    result = train(validate_config(killed_cfg))
    assert result.resumed_from is not None and result.resumed_from >= 2
    assert [r["step"] for r in result.history] == [1, 2, 3, 4]
    assert _task_order(tmp_path / "b" / "run") == expected_order


def test_a_disk_that_fills_during_a_checkpoint_names_the_folder_and_keeps_the_last_one(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    import resource

    import yaml

    from envhub.trainer.checkpoint import CheckpointManager
    from envhub.trainer.checkpoint.manifest import is_complete

    config = _config(tiny_model_dir, tmp_path, steps=40)
    config["envs"] = [{"name": "envhub.testing:LetterEnv"}]  # a reference the CLI can load
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "envhub.cli", "train", str(path)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root = tmp_path / "run" / "checkpoints"
    deadline = time.monotonic() + 300
    while not _names(root / LATEST, "step-000001") and process.poll() is None:
        assert time.monotonic() < deadline, "checkpoint 1 was not committed within 300 s"
        time.sleep(0.02)
    # The disk is full from now on, for this run: no file of it may grow past 64 KiB (the
    # model's weights are MBs; Python ignores SIGXFSZ, so the write fails with EFBIG).
    resource.prlimit(process.pid, resource.RLIMIT_FSIZE, (65536, 65536))
    _, stderr = process.communicate(timeout=300)
    assert process.returncode != 0
    last = CheckpointManager(root).latest()
    assert last is not None and is_complete(last) and not list(root.glob(".tmp-*"))
    line = stderr.decode()
    assert "could not write checkpoint step-" in line and f" in {root} (" in line
    assert f"the last checkpoint, {last.name}, is intact: free some space" in line, line

    config["steps"] = int(last.name.removeprefix("step-")) + 1
    result = train(validate_config(config))  # space again: the rerun resumes from it
    assert result.resumed_from == config["steps"] - 1


class StopInRollout:
    """A reporter that cancels the run (as Ctrl-C does) once ``episodes`` episodes of step
    ``step`` are in, recording what it saw."""

    def __init__(self, step: int, episodes: int) -> None:
        self.at_step, self.episodes, self.finished, self.task = step, episodes, 0, None

    def start(self, config: Any, info: dict[str, Any]) -> None:
        pass

    def rollout_progress(self, done: int, total: int) -> None:
        if self.finished + 1 == self.at_step and done >= self.episodes and self.task is not None:
            self.task.cancel()
            self.task = None

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.finished = step

    def finish(self, result: Any) -> None:
        pass


def test_a_run_stopped_between_updates_keeps_the_groups_it_rolled_out(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Stopped during step 2's rollout (Ctrl-C), the run saves a checkpoint of step 1 that holds
    the finished groups and the tasks in flight; the rerun trains step 2 on exactly the groups
    an uninterrupted run draws."""
    import asyncio

    from envhub.trainer import loop

    config = validate_config(_config(tiny_model_dir, tmp_path, steps=2))
    stopper = StopInRollout(step=2, episodes=4)

    async def run_until_stopped() -> None:
        stopper.task = asyncio.current_task()
        await loop._train(config, stopper)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(run_until_stopped())
    checkpoint = tmp_path / "run" / "checkpoints" / "step-000001"
    state = json.loads((checkpoint / "trainer_state.json").read_text())["producer"]
    ready = {g["trajectories"][0]["group_id"] for g in state["ready"]}
    flying = {f["job"]["prefix"] + f"g{f['position']}" for f in state["in_flight"]}
    assert ready and not ready & flying and ready | flying == {"s2e0g0", "s2e0g1"}

    result = train(config)
    assert result.resumed_from == 1
    step2 = list(iter_trajectories(tmp_path / "run" / "trajectories" / "step-000002.jsonl"))
    assert sorted({t.group_id for t in step2}) == ["s2e0g0", "s2e0g1"] and len(step2) == 8


def test_kl_in_the_reward_adapts_its_coefficient_and_resumes_it(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    kl = {"type": "adaptive", "coef": 0.1, "target_kl": 0.01, "horizon": 10}
    algorithm = {"mismatch": "none", "dynamic_sampling": False, "kl_in_reward": kl}
    config = validate_config(_config(tiny_model_dir, tmp_path, steps=2, algorithm=algorithm))
    first = train(config).history
    # Step 1: the policy is the reference, KL 0: error -0.2, coef 0.1 * (1 - 0.2 * 8/10).
    assert first[0]["kl_in_reward/kl"] == 0.0 and first[0]["kl_in_reward/coef"] == 0.1
    assert first[1]["kl_in_reward/coef"] == pytest.approx(0.084, abs=1e-12)
    assert first[1]["kl_in_reward/kl"] > 0.0  # the update moved the policy off the reference
    error = max(min(first[1]["kl_in_reward/kl"] / 0.01 - 1, 0.2), -0.2)
    saved = 0.084 * (1 + error * 8 / 10)
    state = json.loads(
        (tmp_path / "run" / "checkpoints" / "step-000002" / "trainer_state.json").read_text()
    )
    assert state["kl_controller"]["coef"] == pytest.approx(saved, abs=1e-12)
    resumed = train(
        validate_config(_config(tiny_model_dir, tmp_path, steps=3, algorithm=algorithm))
    )
    assert resumed.resumed_from == 2
    assert resumed.history[-1]["kl_in_reward/coef"] == pytest.approx(saved, abs=1e-12)


class PhaseRecorder:
    """A reporter that records the phases the run tells it (the CLI's heartbeat reads them)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def start(self, config: Any, info: dict[str, Any]) -> None:
        self.seen.append("start")

    def rollout_progress(self, done: int, total: int) -> None:
        pass

    def phase(self, name: str) -> None:
        self.seen.append(name)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.seen.append(f"row {step}")

    def finish(self, result: Any) -> None:
        self.seen.append("finish")


def test_the_reporter_is_told_each_phase_of_each_step(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = _config(tiny_model_dir, tmp_path, steps=2, logging__plot=False)
    config["eval"] = {"envs": [{"name": LetterEnv.name, "num_tasks": 2}], "every": 2}
    recorder = PhaseRecorder()
    train(validate_config(config), recorder)
    step = ["rollout", "prepare", "prepare", "logprobs", "update", "sync"]
    assert recorder.seen == [
        "start", "eval", "row 0",
        *step, "row 1", "checkpoint",
        *step, "eval", "row 2", "checkpoint",
        "export", "finish",
    ]  # fmt: skip
