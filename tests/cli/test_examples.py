"""``envhub examples``: the training configs shipped in the package, listed, printed and copied;
and the wheel carries them, so a pip install (no ``examples/`` folder) can train on them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envhub import examples
from envhub.cli.app import app
from envhub.errors import ConfigError
from envhub.trainer.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [
    "calculator-agent",
    "calculator-tools",
    "calculator-warmstart",
    "gsm8k-1gpu",
    "megatron-8gpu",
    "quickstart",
]
runner = CliRunner()


def table_rows(output: str) -> dict[str, str]:
    """Name -> description of a rich table, joining the lines a narrow terminal folds."""
    rows: dict[str, str] = {}
    name = ""
    for line in output.splitlines():
        if not line.startswith("│"):
            continue
        first, second = (cell.strip() for cell in line.strip("│").split("│"))
        name = first or name
        rows[name] = f"{rows.get(name, '')} {second}".strip()
    return rows


def test_the_examples_folder_is_the_shipped_package() -> None:
    assert examples.names() == SHIPPED == sorted(p.stem for p in ROOT.glob("examples/*.yaml"))
    assert (
        examples.path("quickstart").read_text() == (ROOT / "examples/quickstart.yaml").read_text()
    )
    assert examples.description("quickstart") == (
        "CPU quickstart: SmolLM2-135M-Instruct learns single-digit arithmetic with GRPO, "
        "on a laptop CPU."
    )


def test_envhub_examples_lists_every_shipped_config_with_its_description() -> None:
    result = runner.invoke(app, ["examples"])
    assert result.exit_code == 0, result.output
    assert table_rows(result.output) == {name: examples.description(name) for name in SHIPPED}
    assert result.output.splitlines()[-1].startswith("train on one: envhub train --example NAME;")


def test_envhub_examples_name_prints_the_file_as_it_is() -> None:
    result = runner.invoke(app, ["examples", "gsm8k-1gpu"])
    assert result.exit_code == 0
    assert result.output == (ROOT / "examples" / "gsm8k-1gpu.yaml").read_text()


def test_copy_writes_a_config_to_edit_and_never_overwrites(tmp_path: Path) -> None:
    folder = tmp_path / "configs"
    copied = runner.invoke(app, ["examples", "quickstart", "--copy", str(folder)])
    assert copied.exit_code == 0, copied.output
    target = folder / "quickstart.yaml"
    assert copied.output == f"wrote {target}; train with: envhub train {target}\n"
    assert load_config(target) == load_config(examples.path("quickstart"))
    again = runner.invoke(app, ["examples", "--copy", str(folder)])
    assert isinstance(again.exception, ConfigError)
    assert str(again.exception) == f"not overwriting {target}: remove it or copy elsewhere"
    assert sorted(p.name for p in folder.iterdir()) == ["quickstart.yaml"]  # nothing half-written


def test_copy_without_a_name_writes_them_all(tmp_path: Path) -> None:
    assert runner.invoke(app, ["examples", "--copy", str(tmp_path)]).exit_code == 0
    assert sorted(p.stem for p in tmp_path.iterdir()) == SHIPPED


def test_an_unknown_example_suggests_the_nearest() -> None:
    result = runner.invoke(app, ["examples", "megatron"])
    assert isinstance(result.exception, ConfigError)
    assert str(result.exception) == (
        "no shipped example named 'megatron' (did you mean 'megatron-8gpu'? shipped: "
        "calculator-agent, calculator-tools, calculator-warmstart, gsm8k-1gpu, megatron-8gpu, "
        "quickstart; `envhub examples` describes them)"
    )


def test_the_wheel_ships_the_examples_and_a_pip_install_trains_on_them(tmp_path: Path) -> None:
    pytest.importorskip("setuptools", minversion="77")  # pyproject's build requirement
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    source = tmp_path / "src"  # a copy: building writes build/ and *.egg-info next to the sources
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for folder in set(project["tool"]["setuptools"]["package-dir"].values()):
        shutil.copytree(
            ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(tmp_path / "wheel")],
        cwd=source,
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = sorted(n for n in archive.namelist() if n.startswith("envhub/examples/"))
        agents = sorted(p.name for p in ROOT.glob("examples/agents/*.py"))  # harness programs
        assert agents == ["cli_agent.py", "verifiers_v1_agent.py", "vf_arith_v1.py"]
        assert shipped == ["envhub/examples/__init__.py"] + [
            f"envhub/examples/agents/{name}" for name in agents
        ] + [f"envhub/examples/{name}.yaml" for name in SHIPPED]
        archive.extractall(tmp_path / "site")

    # The unpacked wheel comes first on sys.path (before this checkout's editable install), and
    # the command runs where there is no examples/ folder, as after `pip install envhub`.
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "COLUMNS": "200", "NO_COLOR": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "envhub.cli", "train", "--example", "quickstart", "--dry-run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("steps: 20\nseed: 0\nmodel:\n  name: smollm2-135m\n")
    where = subprocess.run(
        [sys.executable, "-c", "from envhub import examples; print(examples.FOLDER)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.strip() == str(tmp_path / "site" / "envhub" / "examples")
