"""Harbor task folders as Hub packages: ``envhub push`` wraps a folder of tasks (no pyproject
needed), gated by the tasks' solution check; the version installs from the local Hub into a
fresh venv, where ``envhub.make("owner/name")`` gives the env back and ``envhub check`` runs the
solutions again."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import ALICE
from hub_server import HubServer
from typer.testing import CliRunner
from venvs import fresh_venv

from envhub.cli.app import app
from envhub.errors import EnvCheckError, VersionConflictError
from envhub.hub import pull, push
from envhub.hub.harbor_package import harbor_tasks_of, wrap_tasks
from envhub.hub.lock import read_lock
from envhub.sandbox import bwrap_problem

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "harbor"
REPO = "alice/terminal-tasks"
needs_sessions = pytest.mark.skipif(
    bwrap_problem() is not None or os.geteuid() != 0,
    reason="the push gate runs the tasks in local sessions: bubblewrap and root",
)


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    """A folder of the example tasks, one with an executable helper, plus a README, a
    secret and a stray file."""
    folder = Path(shutil.copytree(EXAMPLES, tmp_path / "tasks"))
    helper = folder / "fix-median/environment/greet.sh"
    helper.write_text("#!/bin/sh\necho hi\n")
    helper.chmod(0o755)
    (folder / "README.md").write_text("# Terminal tasks\n\nThree small tasks.\n")
    (folder / "hello-file/.env").write_text("HF_TOKEN=hf_secret\n")
    (folder / "notes.txt").write_text("not a task\n")
    return folder


def test_wrapping_a_single_task_folder(tmp_path: Path) -> None:
    source = Path(shutil.copytree(EXAMPLES / "hello-file", tmp_path / "hello-file"))
    wrapped = wrap_tasks(source, tmp_path / "package", "hello", "1.2.0")
    assert (wrapped.module, wrapped.envs) == ("harbor_hello", {"hello": "harbor_hello:Tasks"})
    files = sorted(p.relative_to(wrapped.folder).as_posix() for p in wrapped.folder.rglob("*.*"))
    assert "harbor_hello/tasks/hello-file/task.toml" in files
    assert "harbor_hello/tasks/hello-file/tests/test.sh" in files
    pyproject = (wrapped.folder / "pyproject.toml").read_text()
    assert 'name = "hello"\nversion = "1.2.0"' in pyproject
    assert 'hello = "harbor_hello:Tasks"' in pyproject
    assert (wrapped.folder / "README.md").read_text() == "# hello\n\nHarbor tasks: hello-file.\n"


@needs_sessions
def test_push_install_make_and_check_a_folder_of_tasks(
    hub: HubServer, tasks: Path, tmp_path: Path
) -> None:
    result = push(tasks, REPO, token=ALICE)
    assert (result.repo_id, result.version, result.status) == (REPO, "0.1.0", "published")
    assert ("hello-file/.env", "looks like a secret") in result.skipped
    assert ("notes.txt", "not inside a task folder") in result.skipped
    files = hub.repos[("model", REPO)].commits[result.commit].files
    assert b"hf_secret" not in b"".join(files.values())
    module = "harbor_terminal_tasks"
    assert f"{module}/tasks/fix-median/solution/solve.sh" in files
    manifest = json.loads(files["envhub.json"])
    assert manifest["envs"] == {"terminal-tasks": f"{module}:Tasks"}
    assert manifest["check"]["passed"] is True
    assert [(t["task"], t["solved"], t["unsolved"]) for t in manifest["check"]["harbor_tasks"]] == [
        ("fix-median", 1.0, 0.0),
        ("hello-file", 1.0, 0.0),
        ("log-summary", 1.0, 0.0),
        ("tally-errors", 1.0, 0.0),
    ]
    card = files["README.md"].decode()
    assert "# Terminal tasks" in card and "| hello-file | 1 | 0 | ok |" in card

    # The pulled package is checked as its tasks; the Hub kept no modes, the check restores them.
    pulled = pull(f"{REPO}@0.1.0")
    helper = pulled.folder / module / "tasks/fix-median/environment/greet.sh"
    assert not helper.stat().st_mode & stat.S_IXUSR
    checked = CliRunner().invoke(app, ["check", str(pulled.folder)], env={"COLUMNS": "200"})
    assert checked.exit_code == 0, checked.output
    assert "passed" in checked.output and "log-summary" in checked.output
    assert helper.stat().st_mode & stat.S_IXUSR

    python = fresh_venv(tmp_path / "venv")
    run_env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(python), *args], capture_output=True, text=True, timeout=600, env=run_env
        )

    installed = run("-m", "envhub.cli", "install", f"{REPO}@0.1.0", "--trust", "--offline")
    assert installed.returncode == 0, installed.stderr
    assert f"{REPO} 0.1.0 installed: commit {result.commit}, envs terminal-tasks" in (
        installed.stdout
    )
    assert read_lock("envhub.lock")[REPO].commit == result.commit
    made = run(
        "-c",
        f"import envhub; env = envhub.make('{REPO}@0.1.0'); "
        "print(env.name, env.version, sorted(t.name for t in env.tasks.values()))",
    )
    assert made.stdout.strip() == (
        "terminal-tasks 0.1.0 ['fix-median', 'hello-file', 'log-summary', 'tally-errors']"
    ), made.stderr
    checked = run("-m", "envhub.cli", "check", "terminal-tasks")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "hello-file" in checked.stdout and "passed" in checked.stdout


@needs_sessions
def test_a_changed_folder_needs_a_new_version(hub: HubServer, tasks: Path) -> None:
    first = push(tasks, REPO, token=ALICE)
    assert push(tasks, REPO, token=ALICE).status == "unchanged"
    instruction = tasks / "hello-file/instruction.md"
    instruction.write_text(instruction.read_text() + "\nWrite it with one trailing newline.\n")
    with pytest.raises(VersionConflictError, match="pass a new --version"):
        push(tasks, REPO, token=ALICE)
    second = push(tasks, REPO, token=ALICE, version="0.2.0")
    assert (second.version, second.status) == ("0.2.0", "published")
    assert second.commit != first.commit
    assert hub.repos[("model", REPO)].tags == {"0.1.0": first.commit, "0.2.0": second.commit}


@needs_sessions
def test_a_task_whose_solution_fails_is_not_pushed(hub: HubServer, tasks: Path) -> None:
    (tasks / "hello-file/solution/solve.sh").write_text("echo 'Hello!' > /app/hello.txt\n")
    failed = r"hello-file: with its solution: reward 0; the tests' output ended with"
    with pytest.raises(EnvCheckError, match=failed):
        push(tasks, REPO, token=ALICE)
    assert ("model", REPO) not in hub.repos


def test_a_pyproject_package_is_not_a_harbor_package(tmp_path: Path) -> None:
    assert harbor_tasks_of(tmp_path) is None
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert harbor_tasks_of(tmp_path) is None


def test_push_through_the_cli_without_the_check(hub: HubServer, tasks: Path) -> None:
    runner = CliRunner()
    args = ["push", str(tasks), "--repo", REPO, "--token", ALICE, "--version", "1.0.0"]
    pushed = runner.invoke(app, [*args, "--skip-check"], env={"COLUMNS": "200"})
    assert pushed.exit_code == 0, pushed.output
    commit = hub.repos[("model", REPO)].tags["1.0.0"]
    assert "skipped hello-file/.env: looks like a secret" in pushed.output
    assert "skipped notes.txt: not inside a task folder" in pushed.output
    assert f"{REPO}@1.0.0 published: commit {commit}" in pushed.output
    assert f"install: envhub install {REPO}@1.0.0 --trust" in pushed.output
    files = hub.repos[("model", REPO)].commits[commit].files
    assert json.loads(files["envhub.json"])["check"] == {"skipped": True}
    assert "`envhub check` was skipped" in files["README.md"].decode()
    bad = runner.invoke(app, ["push", str(tasks), "--repo", REPO, "--token", ALICE,
                              "--version", "one", "--skip-check"])  # fmt: skip
    assert "--version 'one' is not a version such as 0.1.0" in str(bad.exception)


def test_a_folder_of_tasks_named_like_an_installed_distribution_is_not_pushed(
    hub: HubServer, tasks: Path
) -> None:
    from importlib import metadata

    with pytest.raises(EnvCheckError) as info:
        push(tasks, "alice/packaging", token=ALICE)
    assert str(info.value) == (
        "not pushed: alice/packaging would shadow what is installed: its distribution name "
        f"'packaging' is that of the installed packaging {metadata.version('packaging')} "
        "(rename [project] name, e.g. to 'alice-packaging') (a Harbor folder's package is "
        "named after its repo: push it with --repo OWNER/ANOTHER-NAME)"
    )
    assert hub.repos == {}
