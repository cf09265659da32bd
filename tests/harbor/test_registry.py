"""Harbor registry files: a dataset of a registry file is one env (envhub.make, envhub check with
a row per task, envhub eval with a row per task), its paths resolved against the file's folder;
a dataset must be chosen when there are several, and tasks in git repositories are refused with
the commands that clone them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import envhub
from envhub.cli.app import app
from envhub.errors import ConfigError, EnvLoadError, EnvNotFoundError
from envhub.harbor.registry import read_dataset, split_reference
from envhub.loader import is_task_path
from envhub.sandbox import bwrap_problem

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harbor"
needs_bwrap = pytest.mark.skipif(
    bwrap_problem() is not None or os.geteuid() != 0,
    reason="local sessions need bubblewrap and root",
)
runner = CliRunner()


def task(name: str, path: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "git_url": None, "git_commit_id": None, "path": path, **more}


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    """Two datasets of our example tasks, copied under tasks/, the file one folder up."""
    for name in ("hello-file", "fix-median"):
        shutil.copytree(EXAMPLES / name, tmp_path / "tasks" / name)
    file = tmp_path / "registry.json"
    datasets = [
        {"name": "greet", "version": "1.0", "description": "one task",
         "tasks": [task("hello-file", "tasks/hello-file")]},
        {"name": "mixed", "version": "2.0", "description": "two tasks", "metrics": [],
         "tasks": [task("hello-file", "tasks/hello-file"), task("fix-median", "tasks/fix-median")]},
    ]  # fmt: skip
    file.write_text(json.dumps(datasets, indent=2))
    return file


def names(env: Any) -> list[str]:
    return [t.name for t in env.tasks.values()]


def test_a_dataset_of_a_registry_file_is_one_env(registry: Path, monkeypatch) -> None:
    monkeypatch.chdir(registry.parent.parent)  # paths are the file's, not the working folder's
    with envhub.make(f"{registry}:mixed@2.0") as env:
        assert names(env) == ["hello-file", "fix-median"]  # the file's order
        assert [Path(key) for key in env.tasks] == [
            (registry.parent / "tasks" / n).resolve() for n in ("hello-file", "fix-median")
        ]
    with envhub.make(f"{registry}:greet") as env:  # the name alone: its only version
        assert names(env) == ["hello-file"]
    assert is_task_path(str(registry)) and is_task_path(f"{registry}:greet@1.0")
    assert split_reference(f"{registry}:greet@1.0") == (registry, "greet@1.0")
    assert split_reference("greet.json:x") is None  # no such file
    dataset = read_dataset(f"{registry}:greet@1.0")
    assert (dataset.label, dataset.description) == ("greet@1.0", "one task")


def test_the_dataset_is_chosen_when_there_are_several(registry: Path) -> None:
    with pytest.raises(ConfigError) as error:
        envhub.make(str(registry))
    assert str(error.value) == (
        f"{registry} holds 2 datasets; choose one: {registry}:greet@1.0, {registry}:mixed@2.0"
    )
    with pytest.raises(EnvNotFoundError) as missing:
        envhub.make(f"{registry}:mixed@1.0")
    assert f"{registry} has no dataset mixed@1.0 (it has greet@1.0, mixed@2.0)" in str(
        missing.value
    )
    assert "did you mean mixed@2.0?" in str(missing.value)
    data = json.loads(registry.read_text())
    registry.write_text(json.dumps([data[1], {**data[1], "version": "3.0"}]))
    with pytest.raises(ConfigError, match=r"has 2 versions of mixed; choose one: .*:mixed@2.0, "):
        envhub.make(f"{registry}:mixed")
    registry.write_text(json.dumps(data[:1]))
    with envhub.make(str(registry)) as env:  # the only dataset needs no name
        assert names(env) == ["hello-file"]


def test_tasks_in_git_repositories_are_refused_with_the_clone(tmp_path: Path) -> None:
    url = "https://github.com/example/tasks.git"
    file = tmp_path / "registry.json"
    remote = [task(n, f"tasks/{n}", git_url=url, git_commit_id="abc123") for n in ("a", "b")]
    file.write_text(json.dumps([{"name": "d", "version": "1", "tasks": remote}]))
    with pytest.raises(EnvLoadError) as error:
        envhub.make(str(file))
    assert str(error.value) == (
        f"{file}: task a of d@1 is in a git repository ({url}) (and 1 more), and envhub "
        f"fetches nothing when it runs. Clone it first: `git clone {url} tasks && git -C tasks "
        "checkout abc123`, then name its folder (tasks/tasks/a), or write a registry file whose "
        "task paths point into the clone, without git_url"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "is not valid JSON"),
        ('{"name": "d"}', "is no Harbor registry: it must be a JSON list of datasets"),
        ('[{"name": "d", "version": "1"}]', "dataset 0 must be an object with a list of tasks"),
        ('[{"name": "d", "tasks": []}]', "dataset 0 has no version (a string)"),
        ('[{"name": "d", "version": "1", "tasks": []}]', "dataset d@1 has no tasks"),
        ('[{"name": "d", "version": "1", "tasks": [{"name": "x"}]}]', "task 0 of d@1 must be"),
        (
            '[{"name": "d", "version": "1", "tasks": [{"name": "x", "path": "nowhere"}]}]',
            "task x of d@1 is at {root}/nowhere, which is no task folder",
        ),
    ],
)
def test_a_malformed_registry_is_refused_naming_what_is_wrong(
    tmp_path: Path, content: str, message: str
) -> None:
    file = tmp_path / "registry.json"
    file.write_text(content)
    with pytest.raises(EnvLoadError) as error:
        envhub.make(str(file))
    assert str(error.value).startswith(f"{file}")
    assert message.format(root=tmp_path) in str(error.value)


@needs_bwrap
def test_envhub_check_runs_each_task_of_a_dataset(registry: Path) -> None:
    result = runner.invoke(app, ["check", f"{registry}:mixed@2.0"])
    assert result.exit_code == 0, result.output
    assert f"{registry}:mixed@2.0: passed" in result.output.replace("\n", "")
    assert "│ hello-file │ 1             │ 0       │ ok     │" in result.output
    assert "│ fix-median │ 1             │ 0       │ ok     │" in result.output
