"""The older Terminal-Bench task format, read as a Harbor task.

A Terminal-Bench task folder holds ``task.yaml`` (its ``instruction``, ``max_agent_timeout_sec``,
``max_test_timeout_sec``), a ``Dockerfile`` (the folder is its build context), a
``docker-compose.yaml`` of one service (read no further; several services are refused),
``run-tests.sh`` (optional), ``tests/`` (``test_outputs.py``...) and ``solution.sh``
(``solution.yaml``, a list of keystrokes, is not read: such a task has no solution here).

It becomes a :class:`~envhub.harbor.task.HarborTask` whose tests are ``tests/``, the task's
``run-tests.sh`` and the two helper scripts Terminal-Bench's harness put beside them
(``setup-uv-pytest.sh``, ``run-uv-pytest.sh``: envhub writes its own, same commands), run by a
``test.sh`` of envhub's as the harness did: in the working folder with ``TEST_DIR=/tests``;
the reward is 1 when ``run-tests.sh`` exits 0 (every test passed), else 0. A task without
``run-tests.sh`` runs ``tests/test_outputs.py`` with pytest, as the harness's default did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from envhub.errors import EnvLoadError
from envhub.harbor.dockerfile import UnsupportedEnvironment
from envhub.harbor.resources import Resources
from envhub.harbor.task import HarborTask, environment_of, files_of, read_tree, verifier_needs

SETUP_UV_PYTEST = b"""#!/bin/bash
# envhub's stand-in for Terminal-Bench's setup-uv-pytest.sh: uv, a project, pytest.
curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh
source $HOME/.local/bin/env
if [ "$PWD" = "/" ]; then
  echo "Error: no working directory (set a WORKDIR in the Dockerfile)" >&2
  exit 1
fi
uv init
uv add pytest==8.4.1
"""
RUN_UV_PYTEST = b"""#!/bin/bash
# envhub's stand-in for Terminal-Bench's run-uv-pytest.sh.
uv run pytest $TEST_DIR/test_outputs.py -rA
"""
DEFAULT_RUN_TESTS = b"""#!/bin/bash
source $TEST_DIR/setup-uv-pytest.sh
bash $TEST_DIR/run-uv-pytest.sh
"""
TEST_SH = b"""#!/bin/bash
# envhub: a Terminal-Bench task's run-tests.sh, run as its harness ran it; 1 when it passes.
export TEST_DIR=/tests
mkdir -p /logs/verifier
bash /tests/run-tests.sh
if [ $? -eq 0 ]; then reward=1; else reward=0; fi
echo $reward > /logs/verifier/reward.txt
"""


def is_tb_task(folder: Path) -> bool:
    """Whether ``folder`` is a Terminal-Bench task (a ``task.yaml`` and no ``task.toml``)."""
    return (folder / "task.yaml").is_file() and not (folder / "task.toml").is_file()


def load_tb_task(folder: Path, *, in_container: bool = False) -> Any:
    """The Terminal-Bench task at ``folder`` as a Harbor task (see the module docstring).

    Raises:
        EnvLoadError: ``task.yaml`` is malformed or has no instruction, or ``tests/`` has a
            ``test.sh`` of its own.
        UnsupportedEnvironment: A compose file of several services, or (see
            :func:`~envhub.harbor.task.load_harbor_task`) an environment that cannot run here.
    """
    meta = _read_yaml(folder / "task.yaml")
    _check_compose(folder)
    tests = read_tree(folder / "tests")
    if "test.sh" in tests:
        raise EnvLoadError(f"{folder / 'tests' / 'test.sh'}: envhub runs run-tests.sh by a "
                           "test.sh of its own; rename the task's")  # fmt: skip
    run_tests = folder / "run-tests.sh"
    tests.update({
        "run-tests.sh": run_tests.read_bytes() if run_tests.is_file() else DEFAULT_RUN_TESTS,
        "setup-uv-pytest.sh": SETUP_UV_PYTEST,
        "run-uv-pytest.sh": RUN_UV_PYTEST,
        "test.sh": TEST_SH,
    })  # fmt: skip
    solution = folder / "solution.sh"
    environment = environment_of(folder, folder, None, in_container)
    files, executables, build = files_of(folder, environment, None)
    return HarborTask(
        path=folder,
        name=folder.name,
        instruction=_instruction(meta, folder / "task.yaml"),
        files=files,
        executables=executables,
        tests=tests,
        solution={"solve.sh": solution.read_bytes()} if solution.is_file() else None,
        workdir=environment.workdir,
        resources=_resources(meta),
        env=environment.env,
        metadata={k: v for k, v in meta.items() if k != "instruction"},
        build=build,
        image=environment.image,
        context=folder,
        verifier_needs=verifier_needs(tests, folder / "tests") if in_container else None,
    )


def _read_yaml(file: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise EnvLoadError(f"{file} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise EnvLoadError(f"{file} must be a mapping with an instruction")
    return data


def _instruction(meta: dict[str, Any], file: Path) -> str:
    """``instruction``, or the ``base`` entry of the older ``descriptions`` list."""
    text = meta.get("instruction")
    if text is None:
        described = {d.get("key"): d.get("description") for d in meta.get("descriptions") or []
                     if isinstance(d, dict)}  # fmt: skip
        text = described.get("base")
    if not isinstance(text, str) or not text.strip():
        raise EnvLoadError(f"{file} has no instruction: write the task's instruction in it")
    return text


def _resources(meta: dict[str, Any]) -> Resources:
    agent = meta.get("max_agent_timeout_sec")
    test = meta.get("max_test_timeout_sec")
    return Resources(
        verifier_timeout=float(test) if test else Resources().verifier_timeout,
        agent_timeout=float(agent) if agent else None,
    )


def _check_compose(folder: Path) -> None:
    for name in ("docker-compose.yaml", "docker-compose.yml"):
        file = folder / name
        if not file.is_file():
            continue
        try:
            services = (yaml.safe_load(file.read_text(encoding="utf-8")) or {}).get("services")
        except yaml.YAMLError as e:
            raise EnvLoadError(f"{file} is not valid YAML: {e}") from None
        if isinstance(services, dict) and len(services) > 1:
            raise UnsupportedEnvironment(
                f"{file}: a task of {len(services)} containers ({', '.join(services)}) cannot "
                "run here; envhub runs a task in one container, built from its Dockerfile"
            )
