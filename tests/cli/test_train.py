"""``envhub train`` on the command line: dry runs, overrides, one-line errors, a real short run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envhub.cli.app import app
from envhub.errors import ConfigError

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
ENVHUB = Path(sys.executable).with_name("envhub")
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
runner = CliRunner()
HEARTBEAT = re.compile(r"step [12]/2: [a-z' -]+( \d+/\d+ episodes)?, \d+ s")


def envhub(*args: str, cwd: Path = ROOT, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [str(ENVHUB), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_dry_run_prints_the_resolved_config_and_an_estimate() -> None:
    result = envhub(
        "train",
        "examples/quickstart.yaml",
        "--dry-run",
        "optimizer.lr=2e-6",
        "rollout.samples_per_task=4",
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "lr: 2.0e-06" in out and "samples_per_task: 4" in out
    assert "134.5M (134.5M trainable)" in out  # SmolLM2-135M, counted on the meta device
    assert "32 (8 tasks x 4 samples)" in out
    assert "total (rough)" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["examples/quickstart.yaml", "optimizer.lrr=1", "--dry-run"],
            "error: unknown config key 'optimizer.lrr' (did you mean 'lr'?)",
        ),
        (["examples/nope.yaml", "--dry-run"], "error: config file not found: examples/nope.yaml"),
        (
            ["examples/quickstart.yaml", "envs.0.name=arithmetc"],
            "error: envs.0.name: no env named 'arithmetc'",
        ),
    ],
)
def test_bad_configs_fail_with_one_line_before_any_work(
    args: list[str], message: str, tmp_path: Path
) -> None:
    result = envhub("train", *args, f"logging.output_dir={tmp_path}")
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_yaml_typo_is_one_line_naming_the_key_and_the_nearest_valid_one(tmp_path: Path) -> None:
    config = tmp_path / "typo.yaml"
    config.write_text(QUICKSTART.read_text().replace("tasks_per_step:", "task_per_step:"))
    result = envhub("train", str(config), "--dry-run")
    assert result.returncode == 1
    assert result.stderr == (
        "error: unknown config key 'rollout.task_per_step' (did you mean 'tasks_per_step'?)\n"
    )


@pytest.mark.parametrize(
    ("typo", "override", "message"),
    [
        (
            ("tasks_per_step:", "task_per_step:"),
            "rollout.task_per_step=8",
            "unknown config key 'rollout.task_per_step' (did you mean 'tasks_per_step'?)",
        ),
        (
            ("\nrollout:", "\nrolout:"),
            "rolout.tasks_per_step=8",
            "unknown config key 'rolout' (did you mean 'rollout'?)",
        ),
        (
            ("\nalgorithm:\n", "\nalgorithm:\n  overlong: {filtr: true}\n"),
            "algorithm.overlong.filtr=true",
            "unknown config key 'algorithm.overlong.filtr' (did you mean 'filter'?)",
        ),
        (
            ("  - name: arithmetic", "  - nme: arithmetic"),
            "envs.0.nme=arithmetic",
            "unknown config key 'envs.0.nme' (did you mean 'name'?)",
        ),
    ],
    ids=["nested", "top-level", "depth-3", "list-item"],
)
def test_a_typo_reads_the_same_in_the_yaml_file_and_as_an_override(
    typo: tuple[str, str], override: str, message: str, tmp_path: Path
) -> None:
    text = QUICKSTART.read_text()
    assert typo[0] in text
    config = tmp_path / "typo.yaml"
    config.write_text(text.replace(typo[0], typo[1], 1))
    in_yaml = runner.invoke(app, ["train", str(config), "--dry-run"])
    as_override = runner.invoke(app, ["train", str(QUICKSTART), override, "--dry-run"])
    for result in (in_yaml, as_override):
        assert isinstance(result.exception, ConfigError)
        assert str(result.exception) == message


def test_a_missing_config_names_envhub_examples_and_the_nearest_shipped_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # like a pip install: no examples/ folder here
    missing = runner.invoke(app, ["train", "missing.yaml"])
    assert str(missing.exception) == (
        "config file not found: missing.yaml; `envhub examples` lists the shipped configs "
        "(train on one with `envhub train --example NAME`, or copy one with "
        "`envhub examples NAME --copy DIR`)"
    )
    readme_path = runner.invoke(app, ["train", "examples/quickstart.yaml"])
    assert str(readme_path.exception) == (
        "config file not found: examples/quickstart.yaml (did you mean the shipped example "
        "'quickstart'? train on it with `envhub train --example quickstart`; "
        "`envhub examples` lists them all)"
    )
    assert "the shipped example 'gsm8k-1gpu'?" in str(
        runner.invoke(app, ["train", "gsm8k-gpu.yaml"]).exception
    )


def test_example_option_resolves_the_same_config_as_the_file() -> None:
    from_file = runner.invoke(app, ["train", str(QUICKSTART), "steps=3", "--dry-run"])
    shipped = runner.invoke(app, ["train", "--example", "quickstart", "steps=3", "--dry-run"])
    assert from_file.exit_code == 0 and shipped.exit_code == 0, shipped.output
    assert shipped.output == from_file.output
    assert shipped.output.startswith("steps: 3\nseed: 0\nmodel:\n  name: smollm2-135m\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--example", "quickstrt"],
            "no shipped example named 'quickstrt' (did you mean 'quickstart'? shipped: "
            "calculator-agent, calculator-tools, calculator-warmstart, gsm8k-1gpu, megatron-8gpu, "
            "quickstart; "
            "`envhub examples` describes them)",
        ),
        (
            ["mine.yaml", "--example", "quickstart"],
            "give a config file (mine.yaml) or --example quickstart, not both",
        ),
        (
            [],
            "give a config file, or --example NAME for one shipped with envhub "
            "(`envhub examples` lists them)",
        ),
    ],
)
def test_example_option_errors(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["train", *args, "--dry-run"])
    assert isinstance(result.exception, ConfigError)
    assert str(result.exception) == message


def test_a_short_real_run_prints_a_row_per_step_and_saves_everything(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    result = envhub(
        "train",
        "examples/quickstart.yaml",
        f"model.name={tiny_model_dir}",
        "steps=2",
        "rollout.tasks_per_step=2",
        "rollout.samples_per_task=2",
        "rollout.max_tokens=6",
        f"logging.output_dir={tmp_path}",
        "logging.run_name=cli",
        "backend.device=cpu",
        "logging.heartbeat_seconds=0.02",
    )
    assert result.returncode == 0, result.stderr
    starts = ("0/2", "1/2", "2/2")  # 0: the quickstart's held-out eval before the first step
    rows = [line for line in result.stdout.splitlines() if line.strip().startswith(starts)]
    assert len(rows) == 3
    # Not a terminal (a pipe): no progress bar, so a heartbeat line whenever 0.02 s go silent.
    beats = [line for line in result.stdout.splitlines() if re.match(r"step \d", line)]
    assert beats and [b for b in beats if not HEARTBEAT.fullmatch(b)] == []
    assert any(line.startswith("step 1/2: rolling out") for line in beats), beats
    assert "reward" in result.stdout and "done: reward" in result.stdout
    assert "held-out: reward" in result.stdout
    run = tmp_path / "cli"
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [0, 1, 2]
    assert ["eval/two-digit/reward" in r for r in logged] == [True, False, True]
    assert (run / "final" / "config.json").exists() and (
        run / "final" / "model.safetensors"
    ).exists()


@pytest.mark.parametrize(
    ("width", "dropped"),
    [
        (200, []),
        (100, ["clip", "mismatch", "|g|"]),
        (80, ["±", "kl", "clip", "mismatch", "|g|", "sync s"]),
    ],
)
def test_the_step_row_fits_the_terminal_dropping_minor_columns_first(
    width: int, dropped: list[str]
) -> None:
    from rich.console import Console

    from envhub.cli.train_view import COLUMNS, columns_for, step_row

    columns = columns_for(width, steps=20)
    assert [c[1] for c in COLUMNS if c not in columns] == dropped
    console = Console(width=width, record=True)
    console.print(
        step_row(3, 20, {"reward/mean": 0.25, "time/step": 31.5}, header=True, columns=columns)
    )
    header, row = console.export_text().splitlines()
    assert len(header) <= width and "…" not in header + row
    assert row.split()[:2] == ["3/20", "0.250"] and row.split()[-1] == "31.5"


def test_a_run_with_a_critic_shows_its_explained_variance_after_the_loss() -> None:
    from rich.console import Console

    from envhub.cli.train_view import columns_for, step_row

    columns = columns_for(200, steps=20, critic=True)
    titles = [c[1] for c in columns]
    assert titles[titles.index("loss") + 1 : titles.index("loss") + 3] == ["ev", "v loss"]
    narrow = columns_for(80, steps=20, critic=True)
    assert "ev" in [c[1] for c in narrow]  # priority 1, as the loss
    assert sum(c[3] + 1 for c in narrow) + len("20/20") <= 80
    console = Console(width=200, record=True)
    metrics = {"train/loss": -0.01, "critic/explained_variance": 0.4211, "critic/value_loss": 0.05}
    console.print(step_row(2, 20, metrics, header=True, columns=columns))
    header, row = console.export_text().splitlines()
    assert header.split()[6:9] == ["loss", "ev", "v"]
    assert row.split()[6:9] == ["-0.0100", "+0.42", "0.0500"]


def test_the_run_summary_says_what_token_drift_is_and_what_to_do() -> None:
    from envhub.cli.eval import TOKEN_DRIFT_HINT
    from envhub.cli.train_view import drift_summary

    history = [
        {"step": 0, "eval/reward": 0.5},
        {"step": 1, "rollout/token_drift": 0.0},
        {"step": 2, "rollout/token_drift": 1.0},
        {"step": 3, "rollout/token_drift": 2.0},
    ]
    assert drift_summary(history) == f"token drift: 3 episodes (steps 2, 3): {TOKEN_DRIFT_HINT}"
    assert drift_summary(history[:3]) == f"token drift: 1 episode (step 2): {TOKEN_DRIFT_HINT}"
    assert drift_summary(history[:2]) is None
    assert "envhub check ENV --model MODEL" in TOKEN_DRIFT_HINT


def test_the_header_shows_the_core_split_and_when_async_cannot_gain(monkeypatch) -> None:
    from rich.console import Console

    from envhub.cli import train_view
    from envhub.trainer.config import load_config

    console = Console(width=200, record=True)
    monkeypatch.setattr(train_view, "console", console)
    overrides = ["rollout.engine=vllm", "rollout.max_staleness=1", "logging.heartbeat_seconds=null"]
    config = load_config(QUICKSTART, overrides)
    assert config.logging.heartbeat_seconds is None  # no heartbeat thread to stop
    info = {
        "run_dir": "/runs/q",
        "parameters": 134.5e6,
        "device": "cpu",
        "cores": "engine 1 / trainer 1 (async, 2 cores; from the machine, fixed before vLLM "
        "starts; the trainer takes 2 while the engine idles)",
        "advice": "async cannot gain here: vLLM and the trainer share one core, so overlapping "
        "them saves nothing; set rollout.max_staleness: 0",
    }
    train_view.RichReporter().start(config, info)

    lines = console.export_text().splitlines()
    assert lines[2:] == [
        "cores: engine 1 / trainer 1 (async, 2 cores; from the machine, fixed before vLLM "
        "starts; the trainer takes 2 while the engine idles)",
        "async cannot gain here: vLLM and the trainer share one core, so overlapping them "
        "saves nothing; set rollout.max_staleness: 0",
    ]
    console = Console(width=200, record=True)
    monkeypatch.setattr(train_view, "console", console)
    train_view.RichReporter().start(
        config, {k: info[k] for k in ("run_dir", "parameters", "device")}
    )
    assert not any(
        line.startswith(("cores:", "async")) for line in console.export_text().splitlines()
    )


def test_a_warm_start_shows_both_stages_from_the_dry_run_to_the_summary(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(
        json.dumps({"messages": [{"role": "user", "content": f"What is {i} + 1?"},
                                 {"role": "assistant", "content": f"\\boxed{{{i + 1}}}"}]}) + "\n"
        for i in range(4)
    ))  # fmt: skip
    sft = f"sft={{sources: [{{path: {demos}}}], steps: 2, batch_size: 2, lr: 1.0e-4}}"
    common = [
        "examples/quickstart.yaml", f"model.name={tiny_model_dir}", "steps=1", sft,
        "rollout.tasks_per_step=2", "rollout.samples_per_task=2", "rollout.max_tokens=6",
        f"logging.output_dir={tmp_path}", "logging.run_name=cli", "backend.device=cpu",
        "eval.envs.0.num_tasks=2",
    ]  # fmt: skip
    dry = envhub("train", *common, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "2 supervised steps (2 demonstrations each, lr 0.0001; from" in " ".join(
        dry.stdout.split()
    )
    result = envhub("train", *common)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "2 supervised steps, then 1 step x 2 tasks x 2 samples" in out
    assert "warm start: 4 demonstrations (" in out and "kept 4 of 4" in out
    rows = [line.split() for line in out.splitlines() if re.match(r"\s*[0-3]/3 ", line)]
    assert [(row[0], row[1]) for row in rows] == [
        ("0/3", "-"),
        ("1/3", "0.50"),
        ("2/3", "1.00"),
        ("3/3", "-"),
    ]  # fmt: skip: the epoch column, in the supervised steps only
    assert re.search(
        r"warm start: demonstrations' loss \d+\.\d+ \(step 1\) -> \d+\.\d+ \(step 2\)", out
    )
