"""Reading Harbor task folders: the shipped examples, path mapping, and malformed folders."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from envhub.errors import EnvLoadError
from envhub.harbor import UnsupportedEnvironment, find_task_folders, load_task
from envhub.harbor.dockerfile import host_images, sandbox_python_version
from envhub.harbor.task import rewrite_paths

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harbor"
MAPPING = {"/app": "/sandbox", "/tests": "/tmp/.harbor/tests"}


def copy_task(tmp_path: Path, name: str = "fix-median") -> Path:
    return Path(shutil.copytree(EXAMPLES / name, tmp_path / name))


def set_environment(folder: Path, line: str) -> None:
    """Add ``line`` to the ``[environment]`` section of the task's ``task.toml``."""
    toml = (folder / "task.toml").read_text()
    (folder / "task.toml").write_text(toml.replace("[environment]\n", f"[environment]\n{line}\n"))


def test_the_examples_folder_holds_four_tasks() -> None:
    assert [p.name for p in find_task_folders(EXAMPLES)] == [
        "fix-median",
        "hello-file",
        "log-summary",
        "tally-errors",
    ]
    assert find_task_folders(EXAMPLES / "hello-file") == [EXAMPLES / "hello-file"]


def test_a_task_is_read_as_written() -> None:
    task = load_task(EXAMPLES / "fix-median")
    assert (task.name, task.workdir) == ("fix-median", "/app")
    assert task.instruction.startswith("`/app/stats.py` has a `median(values)` function")
    assert sorted(task.files) == ["stats.py"]
    assert task.files["stats.py"] == (EXAMPLES / "fix-median/environment/stats.py").read_bytes()
    assert sorted(task.tests) == ["test.sh", "test_stats.py"]
    # Paths are mapped only where a session cannot show them (envhub.harbor.layout).
    assert task.tests["test.sh"] == (EXAMPLES / "fix-median/tests/test.sh").read_bytes()
    assert task.verifier_timeout == 60.0
    assert task.env == {"PYTHONDONTWRITEBYTECODE": "1"}
    assert task.metadata["category"] == "debugging"
    assert sorted(task.solution or {}) == ["solve.sh"]


def test_a_folder_copy_lands_under_its_destination() -> None:
    task = load_task(EXAMPLES / "log-summary")
    assert sorted(task.files) == ["logs/access.log"]
    hello = load_task(EXAMPLES / "hello-file")
    assert (hello.files, hello.verifier_timeout) == ({}, 30.0)


def test_paths_are_rewritten_only_where_they_stand_whole() -> None:
    text = "/app /app/x.py /apple ./app /tests/t.sh x/tests '/app'"
    assert rewrite_paths(text, MAPPING) == (
        "/sandbox /sandbox/x.py /apple ./app /tmp/.harbor/tests/t.sh x/tests '/sandbox'"
    )


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: (p / "task.toml").unlink(), r"fix-median/task.toml is missing"),
        (
            lambda p: (p / "task.toml").write_text("[verifier\n"),
            r"fix-median/task.toml is not valid TOML",
        ),
        (lambda p: (p / "instruction.md").unlink(), r"fix-median/instruction.md is missing"),
        (
            lambda p: (p / "instruction.md").write_text("  \n"),
            r"fix-median/instruction.md is empty",
        ),
        (lambda p: shutil.rmtree(p / "tests"), r"fix-median/tests/test.sh is missing"),
        (lambda p: (p / "solution/solve.sh").unlink(), r"fix-median/solution/solve.sh is missing"),
        (
            lambda p: (p / "task.toml").write_text("[verifier]\ntimeout_sec = -1\n"),
            r"fix-median/task.toml: \[verifier\] timeout_sec must be a positive number, got -1",
        ),
        (
            lambda p: (p / "environment/stats.py").unlink(),
            r"fix-median/environment/Dockerfile: COPY stats.py: no such file",
        ),
    ],
)
def test_malformed_folders_name_the_file(tmp_path: Path, damage, message: str) -> None:
    folder = copy_task(tmp_path)
    damage(folder)
    with pytest.raises(EnvLoadError, match=message):
        load_task(folder)


def test_the_working_folder_comes_from_task_toml_or_the_dockerfile(tmp_path: Path) -> None:
    hello = Path(shutil.copytree(EXAMPLES / "hello-file", tmp_path / "hello"))
    assert load_task(hello).workdir == "/app"  # neither sets one: Harbor's usual
    toml = (hello / "task.toml").read_text()
    (hello / "task.toml").write_text(toml + '\n[environment]\nworkdir = "/workspace/"\n')
    assert load_task(hello).workdir == "/workspace"
    if "debian:12" not in host_images():
        return
    folder = copy_task(tmp_path)
    set_environment(folder, 'workdir = "/app"')
    assert load_task(folder).workdir == "/app"  # the Dockerfile's WORKDIR agrees
    (folder / "environment/Dockerfile").write_text("FROM debian:12\nCOPY stats.py stats.py\n")
    task = load_task(folder)  # no WORKDIR: copies land in task.toml's
    assert (task.workdir, sorted(task.files)) == ("/app", ["stats.py"])


@pytest.mark.parametrize(
    ("environment", "error", "message"),
    [
        (
            'workdir = "/srv"',
            UnsupportedEnvironment,
            r"task.toml: \[environment\] workdir = '/srv', but .*/Dockerfile works in /app: only "
            r"one working folder is kept here; make them agree",
        ),
        (
            'workdir = "app"',
            EnvLoadError,
            r"task.toml: \[environment\] workdir must be an absolute path, got 'app'",
        ),
        ("workdir = 3", EnvLoadError, r"workdir must be an absolute path, got 3"),
    ],
)
def test_a_working_folder_that_cannot_be_kept_is_refused(
    tmp_path: Path, environment: str, error: type[Exception], message: str
) -> None:
    if "debian:12" not in host_images():
        pytest.skip("the host is not Debian 12")
    folder = copy_task(tmp_path)
    (folder / "environment/Dockerfile").write_text("FROM debian:12\nWORKDIR /app\n")
    set_environment(folder, environment)
    with pytest.raises(error, match=message):
        load_task(folder)


def test_a_folder_without_tasks_says_so(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    with pytest.raises(EnvLoadError, match="has no task.toml, and none of its subfolders"):
        find_task_folders(tmp_path)


@pytest.mark.parametrize(
    ("dockerfile", "message"),
    [
        ("FROM ubuntu:24.04\n", r"Dockerfile:1: the image 'ubuntu:24.04' cannot be built here"),
        (
            "FROM debian:bookworm\nRUN apt-get install -y envhub-absent-package\n",
            r"Dockerfile:2: RUN apt-get install -y envhub-absent-package: apt-get install needs "
            r"envhub-absent-package \(not installed on this machine\)",
        ),
        (
            "FROM debian:12\nWORKDIR /app\nCOPY stats.py stats.py\nWORKDIR /srv\n",
            r"Dockerfile:3: .* needs a copy to /app/stats.py, outside the working folder /srv",
        ),
        (
            "FROM debian:12 AS build\nFROM debian:12\n",
            r"Dockerfile:2: the image 'debian:12' needs a multi-stage build",
        ),
        (
            "FROM debian:12\nWORKDIR /app\nCOPY stats.py /opt/stats.py\n",
            r"Dockerfile:3: .* needs a copy to /opt/stats.py, outside the working folder",
        ),
    ],
)
def test_environments_that_need_a_build_are_refused_naming_the_image(
    tmp_path: Path, dockerfile: str, message: str
) -> None:
    if "debian:12" not in host_images():
        pytest.skip("the host is not Debian 12")
    folder = copy_task(tmp_path)
    (folder / "environment/Dockerfile").write_text(dockerfile)
    with pytest.raises(UnsupportedEnvironment, match=message):
        load_task(folder)


def test_the_host_images_follow_os_release_and_the_sandbox_python() -> None:
    images = host_images()
    if "debian:12" in images:
        assert {"debian:bookworm", "debian:bookworm-slim", "debian:12-slim"} <= images
    version = sandbox_python_version()
    assert version is not None and f"python:{version}-slim" in images


def test_a_compose_task_is_refused(tmp_path: Path) -> None:
    folder = copy_task(tmp_path)
    (folder / "environment/docker-compose.yaml").write_text("services: {}\n")
    with pytest.raises(UnsupportedEnvironment, match=r"docker-compose.yaml: a task of several"):
        load_task(folder)
