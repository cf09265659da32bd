"""A Harbor task's limits from task.toml: read and checked, then honoured by a real session
(memory, storage, the agent's timeout as the episode's time limit) or refused/warned about with
the field named."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envhub.errors import EnvLoadError
from envhub.harbor import UnsupportedEnvironment, load_task
from envhub.harbor.check import check_tasks
from envhub.harbor.env import HarborEnv
from envhub.sandbox import LocalSandbox, bwrap_problem

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harbor"
needs_sessions = pytest.mark.skipif(
    bwrap_problem() is not None or os.geteuid() != 0,
    reason="local sessions need bubblewrap and root",
)


def task_with(tmp_path: Path, toml: str) -> Path:
    folder = Path(shutil.copytree(EXAMPLES / "hello-file", tmp_path / "hello-file"))
    (folder / "task.toml").write_text('version = "1.0"\n' + toml)
    return folder


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_every_limit_is_read(tmp_path: Path) -> None:
    folder = task_with(
        tmp_path,
        "[agent]\ntimeout_sec = 90.0\n[verifier]\ntimeout_sec = 15\nenv = { MODE = 'strict' }\n"
        "[solution]\nenv = { HINT = 1 }\n"
        "[environment]\ncpus = 1\nmemory_mb = 300\nstorage_mb = 40\nbuild_timeout_sec = 600.0\n",
    )
    resources = load_task(folder).resources
    assert (resources.agent_timeout, resources.verifier_timeout) == (90.0, 15.0)
    assert (resources.memory_mb, resources.storage_mb, resources.cpus) == (300, 40, 1.0)
    assert (resources.verifier_env, resources.solution_env) == ({"MODE": "strict"}, {"HINT": "1"})
    assert resources.warnings == ()


def test_a_sessions_files_may_be_as_large_as_its_disk(tmp_path: Path) -> None:
    stored = HarborEnv(task_with(tmp_path / "a", "[environment]\nstorage_mb = 40\n"))
    plain = HarborEnv(task_with(tmp_path / "b", ""))
    try:
        limits = stored.limits_for(stored.dataset[0]), plain.limits_for(plain.dataset[0])
    finally:
        stored.close()
        plain.close()
    assert [(x.disk_mb, x.file_size_mb) for x in limits] == [(40, 40), (256, 256)]


def test_harbors_older_size_spellings(tmp_path: Path) -> None:
    folder = task_with(tmp_path, '[environment]\nmemory = "2G"\nstorage = "512M"\n')
    resources = load_task(folder).resources
    assert (resources.memory_mb, resources.storage_mb) == (2048, 512)


def test_no_limits_leaves_the_envs_own(tmp_path: Path) -> None:
    resources = load_task(task_with(tmp_path, "")).resources
    assert (resources.agent_timeout, resources.memory_mb, resources.storage_mb) == (None,) * 3
    assert resources.verifier_timeout == 600.0


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[agent]\ntimeout_sec = 'long'\n", r"\[agent\] timeout_sec must be a positive number"),
        ("[environment]\nmemory_mb = 0\n", r"\[environment\] memory_mb must be a positive"),
        ("[environment]\nstorage = 'lots'\n", r"\[environment\] storage must be a size such as"),
        ("[environment]\ncpus = true\n", r"\[environment\] cpus must be a positive number"),
        ("[verifier]\nenv = 3\n", r"\[verifier\] env must be a table of variables"),
    ],
)
def test_bad_values_name_the_field(tmp_path: Path, toml: str, message: str) -> None:
    with pytest.raises(EnvLoadError, match=r"hello-file/task.toml: " + message):
        load_task(task_with(tmp_path, toml))


def test_a_gpu_task_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedEnvironment, match=r"\[environment\] gpus = 1: .* no GPU"):
        load_task(task_with(tmp_path, "[environment]\ngpus = 1\n"))
    assert load_task(task_with(tmp_path / "b", "[environment]\ngpus = 0\n"))


def test_what_cannot_be_honoured_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    many = (os.cpu_count() or 1) + 1
    toml = f"[environment]\ncpus = {many}\nallow_internet = true\n"
    with caplog.at_level(logging.WARNING, logger="envhub.harbor.resources"):
        resources = load_task(task_with(tmp_path, toml)).resources
    assert [w.split(": ", 1)[1] for w in resources.warnings] == [
        f"[environment] cpus = {many}, but this machine has {many - 1}; the task runs with what "
        "there is",
        "[environment] allow_internet = true, but sandbox sessions have no network; the task "
        "runs offline",
    ]
    assert [r.getMessage() for r in caplog.records] == list(resources.warnings)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[LocalSandbox]:
    with LocalSandbox(base_uid=61580, max_concurrency=2, warm=0) as box:
        yield box


@needs_sessions
def test_the_session_gets_the_tasks_memory_and_storage(tmp_path: Path, sandbox) -> None:
    folder = task_with(tmp_path, "[environment]\nmemory_mb = 100\nstorage_mb = 8\n")
    env = HarborEnv(folder, sandbox=sandbox)
    env.reset(options={"task_index": 0})
    grow = "python3 -c \"b = bytearray(200 << 20); print('allocated')\""
    fill = "head -c 20000000 /dev/zero > big && echo wrote || echo 'disk full'"
    replies = [env.step(call("bash", command=c))[0][0].content for c in (grow, fill)]
    assert "MemoryError" in replies[0] and "allocated" not in replies[0]
    assert "disk full" in replies[1] and "wrote" not in replies[1].split("disk full")[-1]
    small = env.step(call("bash", command="python3 -c \"b = bytearray(20 << 20); print('ok')\""))
    assert "ok" in small[0][0].content
    env.close()


@needs_sessions
def test_the_agents_timeout_ends_the_episode(tmp_path: Path, sandbox) -> None:
    env = HarborEnv(task_with(tmp_path, "[agent]\ntimeout_sec = 1.0\n"), sandbox=sandbox)
    env.reset(options={"task_index": 0})
    observation, reward, terminated, truncated, info = env.step(call("bash", command="sleep 20"))
    assert "[killed: the command ran past its 1 s timeout" in observation[0].content
    assert (reward, terminated, truncated, info["stop_reason"]) == (0.0, False, True, "time_limit")
    env.close()


@needs_sessions
def test_the_solution_runs_with_its_variables(tmp_path: Path, sandbox) -> None:
    folder = task_with(tmp_path, "[solution]\nenv = { GREETING = 'Hello, world!' }\n")
    (folder / "solution/solve.sh").write_text('echo "$GREETING" > /app/hello.txt\n')
    (check,) = check_tasks(folder, sandbox=sandbox)
    assert (check.solved, check.unsolved, check.passed) == (1.0, 0.0, True)


@needs_sessions
def test_the_reference_policy_passes_the_solutions_variables(tmp_path: Path, sandbox) -> None:
    folder = task_with(tmp_path, "[solution]\nenv = { GREETING = 'Hello, world!' }\n")
    (folder / "solution/solve.sh").write_text('echo "$GREETING" > /app/hello.txt\n')
    env = HarborEnv(folder, sandbox=sandbox)
    env.reset(options={"task_index": 0})
    reward = 0.0
    while env.state.stop_reason is None:
        _, reward, *_ = env.step(env.reference_policy(env.state.messages, env.tool_schemas))
    assert reward == 1.0
    env.close()
