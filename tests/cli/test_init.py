"""``envhub init``: through typer's runner for what it writes and prints, and through the real
``envhub`` script for errors (``main()`` turns them into one red line and exit code 1)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envhub.cli.app import app
from envhub.cli.init import init_command
from envhub.errors import ConfigError
from envhub.scaffold import TEMPLATES, module_name, template_files

ENVHUB = Path(sys.executable).with_name("envhub")
runner = CliRunner()


def envhub_script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # A wide terminal: the test is about the message being one line, not about wrapping.
    env = {**os.environ, "COLUMNS": "300", "NO_COLOR": "1"}
    return subprocess.run(
        [str(ENVHUB), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("template", TEMPLATES)
def test_init_creates_a_package_that_passes_envhub_check(tmp_path, monkeypatch, unload, template):
    name = f"cli-{template}"
    unload.append(module_name(name))
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["init", name, "--template", template])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"Created {name} from the {template} template in {tmp_path / name}"
    files = template_files(name, template)  # (tests/test_scaffold.py checks the list)
    assert lines[1 : 1 + len(files)] == [f"  {f}" for f in files]
    assert [line.split("  #")[0].strip() for line in lines[2 + len(files) :]] == [
        "Next steps",
        f"cd {name}",
        "envhub check .",
        "pytest",
        "pip install -e .",
        f"envhub eval {name} -m MODEL -u URL",
    ]

    checked = runner.invoke(app, ["check", name])
    assert checked.exit_code == 0, checked.output
    assert f"{name}: passed" in checked.output


def test_existing_folder_needs_force(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert runner.invoke(app, ["init", "my-env"]).exit_code == 0
    refused = runner.invoke(app, ["init", "my-env", "-t", "multi-turn"])
    assert refused.exit_code == 1
    assert isinstance(refused.exception, ConfigError)
    forced = runner.invoke(app, ["init", "my-env", "-t", "multi-turn", "--force"])
    assert forced.exit_code == 0, forced.output
    assert "class MyEnv(MultiTurnEnv):" in (tmp_path / "my-env" / "my_env" / "env.py").read_text()


def test_every_example_in_the_help_works(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    examples = init_command.__doc__.split("Examples:")[1].strip().splitlines()
    assert len(examples) == 3
    for example in examples:
        program, *args = shlex.split(example)
        result = runner.invoke(app, args)
        assert (program, result.exit_code) == ("envhub", 0), result.output
    assert "  cd envs/stock-lookup" in result.output.splitlines()  # --dir ./envs, the last example
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.glob("**/pyproject.toml")) == [
        "envs/stock-lookup/pyproject.toml",
        "guess-my-number/pyproject.toml",
        "my-env/pyproject.toml",
    ]


def test_help_lists_every_template_and_ends_with_examples():
    result = runner.invoke(app, ["init", "--help"])
    assert result.exit_code == 0
    assert " | ".join(TEMPLATES) in result.output
    assert "Examples:" in result.output
    assert "envhub init guess-my-number --template multi-turn" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["init", "My_Env"],
            "error: invalid env name 'My_Env': use lowercase letters, digits and hyphens, "
            "starting with a letter; try 'my-env'",
        ),
        (
            ["init", "my-env", "--template", "tol"],
            "error: unknown template 'tol'. Did you mean 'tool'? "
            f"Templates: {', '.join(TEMPLATES)}",
        ),
    ],
    ids=["bad-name", "unknown-template"],
)
def test_errors_are_one_line_and_exit_code_1(tmp_path, args, message):
    result = envhub_script(*args, cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", message + "\n")
    assert list(tmp_path.iterdir()) == []


def test_existing_folder_error_through_the_script(tmp_path):
    (tmp_path / "my-env").mkdir()
    (tmp_path / "my-env" / "notes.txt").write_text("mine")
    result = envhub_script("init", "my-env", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: {tmp_path / 'my-env'} already exists and is not empty; "
        "choose another name or folder, or use --force (force=True) to write into it"
    ]
    assert os.listdir(tmp_path / "my-env") == ["notes.txt"]


def test_error_text_that_looks_like_markup_is_printed_as_is(tmp_path):
    # Messages quote other programs' text; gloo's "[/path/pair.cc:537]" once crashed the printer.
    result = envhub_script("init", "[/x]", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("error: invalid env name '[/x]': use lowercase letters")
