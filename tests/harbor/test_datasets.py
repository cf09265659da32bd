"""Datasets of tasks: a folder of three tasks (one in the published preamble's shape, one in
the older Terminal-Bench format, one plain) checks in containers with a result per task; the
Terminal-Bench task reads as a Harbor task."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from envhub.harbor import load_task
from envhub.harbor.check import check_tasks
from envhub.harbor.terminal_bench import TEST_SH
from tests.harbor.test_toolchain import STAND_IN, make_task

TASK_YAML = textwrap.dedent("""
    instruction: |-
      Write the contents of /app/words.txt in upper case to /app/upper.txt.
    author_name: envhub tests
    difficulty: easy
    parser_name: pytest
    max_agent_timeout_sec: 120.0
    max_test_timeout_sec: 90.0
    run_tests_in_same_shell: false
""")
COMPOSE = "services:\n  client:\n    build:\n      dockerfile: Dockerfile\n"


def make_tb_task(root: Path) -> Path:
    """A task in the older Terminal-Bench format, its tests run by the shared uv scripts."""
    folder = root / "upper-case"
    (folder / "tests").mkdir(parents=True)
    (folder / "task.yaml").write_text(TASK_YAML)
    (folder / "Dockerfile").write_text("FROM debian:bookworm\nWORKDIR /app\nCOPY words.txt .\n")
    (folder / "words.txt").write_text("hello tea\n")
    (folder / "docker-compose.yaml").write_text(COMPOSE)
    (folder / "run-tests.sh").write_text(
        "#!/bin/bash\nsource $TEST_DIR/setup-uv-pytest.sh\nbash $TEST_DIR/run-uv-pytest.sh\n"
    )
    (folder / "tests/test_outputs.py").write_text(
        "from pathlib import Path\n\n\ndef test_upper():\n"
        '    assert Path("/app/upper.txt").read_text() == "HELLO TEA\\n"\n'
    )
    (folder / "solution.sh").write_text("#!/bin/bash\ntr a-z A-Z < words.txt > upper.txt\n")
    return folder


def make_plain_task(root: Path) -> Path:
    folder = root / "say-hi"
    for sub in ("tests", "solution"):
        (folder / sub).mkdir(parents=True)
    (folder / "instruction.md").write_text("Write hi to /app/hi.txt.\n")
    (folder / "task.toml").write_text('[environment]\ndocker_image = "ubuntu:24.04"\n')
    (folder / "tests/test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        'if [ "$(cat /app/hi.txt)" = hi ]; then r=1; else r=0; fi\n'
        "echo $r > /logs/verifier/reward.txt\n"
    )
    (folder / "solution/solve.sh").write_text("#!/bin/bash\necho hi > /app/hi.txt\n")
    return folder


def test_a_terminal_bench_task_reads_as_a_harbor_task(tmp_path: Path) -> None:
    task = load_task(make_tb_task(tmp_path), in_container=True)
    assert task.instruction.startswith("Write the contents of /app/words.txt")
    assert (task.workdir, task.image, task.context) == ("/app", "debian:bookworm", task.path)
    assert task.tests["test.sh"] == TEST_SH
    assert sorted(task.tests) == [
        "run-tests.sh", "run-uv-pytest.sh", "setup-uv-pytest.sh", "test.sh", "test_outputs.py",
    ]  # fmt: skip
    assert task.solution == {"solve.sh": b"#!/bin/bash\ntr a-z A-Z < words.txt > upper.txt\n"}
    assert (task.resources.agent_timeout, task.verifier_timeout) == (120.0, 90.0)
    assert task.verifier_needs is not None and task.verifier_needs.requirements == (
        "pytest==8.4.1",
    )


@pytest.mark.usefixtures("require_podman")
def test_a_dataset_of_three_tasks_checks_with_a_result_per_task(tmp_path: Path) -> None:
    make_task(tmp_path)
    make_tb_task(tmp_path)
    make_plain_task(tmp_path)
    image_map = {"ubuntu:24.04": STAND_IN, "debian:bookworm": STAND_IN}
    checks = check_tasks(tmp_path, sandbox="podman", image_map=image_map)
    results = [(c.name, c.solved, c.unsolved, c.error) for c in checks]
    assert results == [
        ("count-words", 1.0, 0.0, ""),  # the published preamble passes offline (test_toolchain)
        ("say-hi", 1.0, 0.0, ""),
        ("upper-case", 1.0, 0.0, ""),
    ]
    assert all(STAND_IN in c.image for c in checks)
