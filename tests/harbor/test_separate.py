"""Harbor's verifier in a container of its own (``[verifier] environment_mode = "separate"``)
and the agent's background processes, on real Podman: a task whose tests are built from
``tests/Dockerfile`` scores 1 with its solution and 0 without, from its artifacts alone (a
file the solution leaves outside them is not there); without ``tests/Dockerfile`` the tests
run in a fresh container of the task's image; a server ``solve.sh`` starts in the background
answers the tests of a shared-mode task."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from envhub.errors import EnvLoadError
from envhub.harbor import UnsupportedEnvironment, load_task
from envhub.harbor.check import check_tasks
from envhub.harbor.env import HarborEnv
from envhub.harbor.separate import ARTIFACTS_DIR, Artifact, sanitized
from envhub.types import assistant

STAND_IN = "localhost/envhub-base:bookworm"
TOML = textwrap.dedent("""
    version = "1.0"
    artifacts = ["answer.txt", {source = "/app/out", exclude = ["*.tmp"]}]

    [verifier]
    timeout_sec = 60.0
    environment_mode = "separate"
""")
# The tests see the answer and the out/ folder (its *.tmp left behind), the agent's
# /logs/artifacts, a file only their own image has, and not the agent's other files.
TEST_SH = textwrap.dedent("""
    #!/bin/bash
    ok=1
    [ "$(cat /app/answer.txt 2>/dev/null)" = "$(cat /tests/expected.txt)" ] || ok=0
    [ "$(cat /app/out/kept.txt 2>/dev/null)" = kept ] || ok=0
    [ ! -e /app/out/skip.tmp ] || ok=0
    [ "$(cat /logs/artifacts/notes.txt 2>/dev/null)" = notes ] || ok=0
    [ ! -e /app/scratch.txt ] || ok=0
    echo $ok > /logs/verifier/reward.txt
""").lstrip()
SOLVE_SH = textwrap.dedent("""
    #!/bin/bash
    echo 42 > /app/answer.txt
    mkdir -p /app/out /logs/artifacts
    echo kept > /app/out/kept.txt; echo no > /app/out/skip.tmp
    echo notes > /logs/artifacts/notes.txt
    echo scratch > /app/scratch.txt
""").lstrip()
TESTS_DOCKERFILE = "FROM ubuntu:24.04\nCOPY test.sh expected.txt /tests/\n"


def make_task(root: Path, *, tests_image: bool = True) -> Path:
    folder = root / "answer-apart"
    for sub in ("environment", "tests", "solution"):
        (folder / sub).mkdir(parents=True)
    (folder / "task.toml").write_text(TOML)
    (folder / "instruction.md").write_text("Write the answer to /app/answer.txt.\n")
    (folder / "environment/Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (folder / "tests/test.sh").write_text(TEST_SH)
    (folder / "tests/expected.txt").write_text("42\n")
    if tests_image:
        (folder / "tests/Dockerfile").write_text(TESTS_DOCKERFILE)
    (folder / "solution/solve.sh").write_text(SOLVE_SH)
    return folder


def _set_verifier(folder: Path, text: str) -> None:
    (folder / "task.toml").write_text(f'version = "1.0"\n\n[verifier]\n{text}\n')


def test_the_loader_reads_where_the_tests_run(tmp_path: Path) -> None:
    folder = make_task(tmp_path)
    separate = load_task(folder, in_container=True).separate
    assert separate is not None and separate.bundled
    assert (separate.image, separate.dockerfile, separate.workdir) == (
        None, folder / "tests/Dockerfile", "/",
    )  # fmt: skip
    assert separate.artifacts == (
        Artifact(ARTIFACTS_DIR), Artifact("answer.txt"), Artifact("/app/out", ("*.tmp",)),
    )  # fmt: skip
    _set_verifier(folder, '[verifier.environment]\ndocker_image = "grader:1"')  # implies it
    separate = load_task(folder, in_container=True).separate
    assert separate is not None and (separate.image, separate.bundled) == ("grader:1", True)
    _set_verifier(folder, 'environment_mode = "shared"')
    assert load_task(folder, in_container=True).separate is None


def test_what_cannot_run_apart_is_refused_by_name(tmp_path: Path) -> None:
    folder = make_task(tmp_path)
    with pytest.raises(UnsupportedEnvironment, match=r'environment_mode = "separate".*sandbox='):
        load_task(folder)  # bubblewrap starts no second container
    _set_verifier(folder, 'environment_mode = "shared"\n[verifier.environment]\ncpus = 1')
    with pytest.raises(EnvLoadError, match=r'"shared" contradicts \[verifier.environment\]'):
        load_task(folder, in_container=True)
    _set_verifier(folder, 'environment_mode = "apart"')
    with pytest.raises(EnvLoadError, match=r"environment_mode must be one of"):
        load_task(folder, in_container=True)
    _set_verifier(folder, 'environment_mode = "separate"')
    (folder / "tests/docker-compose.yaml").write_text("services: {}\n")
    with pytest.raises(UnsupportedEnvironment, match="a verifier of several containers"):
        load_task(folder, in_container=True)


def test_artifacts_cross_without_links_out_or_devices() -> None:
    import io
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as archive:
        for name, kind, target in [
            ("app/a.txt", tarfile.REGTYPE, ""), ("app/in", tarfile.SYMTYPE, "a.txt"),
            ("app/out", tarfile.SYMTYPE, "/tests/test.sh"), ("app/up", tarfile.SYMTYPE, "../.."),
            ("app/dev", tarfile.CHRTYPE, ""), ("app/esc", tarfile.SYMTYPE, "../tests/x"),
            ("tests/x", tarfile.REGTYPE, ""),
        ]:  # fmt: skip
            member = tarfile.TarInfo(name)
            member.type, member.linkname, member.mode = kind, target, 0o4755
            archive.addfile(member, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    with tarfile.open(fileobj=io.BytesIO(sanitized(raw.getvalue(), ["app"]))) as kept:
        members = {m.name: m for m in kept}
    assert sorted(members) == ["app/a.txt", "app/in"]
    assert members["app/a.txt"].mode == 0o755  # no setuid bit


def play_solution(env: HarborEnv) -> float:
    """The reward of one episode of the env's first task played by its reference solution."""
    messages, _ = env.reset(options={"task_index": 0})
    while True:
        turn = env.reference_policy(messages, env.tool_schemas)
        observation, reward, terminated, truncated, _ = env.step(turn)
        messages = [*messages, assistant(turn), *observation]
        if terminated or truncated:
            return reward


def test_tests_apart_score_the_artifacts(require_podman: None, tmp_path: Path) -> None:
    folder = make_task(tmp_path)
    (check,) = check_tasks(folder, sandbox="podman", image_map={"ubuntu:24.04": STAND_IN})
    assert (check.solved, check.unsolved, check.error) == (1.0, 0.0, "")
    assert "; tests apart in localhost/envhub-build:" in check.image
    assert check.image.endswith(f"(from tests/Dockerfile; stand-in {STAND_IN} for ubuntu:24.04)")


def test_without_their_own_image_tests_apart_run_in_the_tasks(
    require_podman: None, tmp_path: Path
) -> None:
    folder = make_task(tmp_path, tests_image=False)  # tests/ copied into a fresh container
    with HarborEnv(folder, sandbox="podman", image_map={"ubuntu:24.04": STAND_IN}) as env:
        assert play_solution(env) == 1.0
        agents, tests = env.image_description(env.dataset[0]).split("; tests apart in ")
        assert agents == tests and agents.endswith(f"stand-in {STAND_IN} for ubuntu:24.04)")


SERVER_TEST = textwrap.dedent("""
    #!/bin/bash
    got=$(python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8123/').read().decode())" 2>/dev/null)
    if [ "$got" = "served" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
""").lstrip()  # noqa: E501 - a shell line
SERVER_SOLVE = textwrap.dedent("""
    #!/bin/bash
    mkdir -p /app/site && printf served > /app/site/index.html
    nohup python3 -m http.server 8123 --bind 127.0.0.1 --directory /app/site >/dev/null 2>&1 &
    for i in $(seq 50); do python3 -c "import socket; socket.create_connection(('127.0.0.1', 8123))" 2>/dev/null && exit 0; sleep 0.1; done
""").lstrip()  # noqa: E501 - a shell line


def test_a_server_the_solution_starts_answers_the_tests(
    require_podman: None, tmp_path: Path
) -> None:
    folder = tmp_path / "serve-site"
    for sub in ("tests", "solution"):
        (folder / sub).mkdir(parents=True)
    (folder / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n')
    (folder / "instruction.md").write_text("Serve 'served' on 127.0.0.1:8123.\n")
    (folder / "tests/test.sh").write_text(SERVER_TEST)
    (folder / "solution/solve.sh").write_text(SERVER_SOLVE)
    with HarborEnv(folder, sandbox="podman") as env:  # 1 only if the server still answers
        assert play_solution(env) == 1.0
