"""Loading a task folder in either format it is published in: Harbor's (``task.toml``) or
Terminal-Bench's older one (``task.yaml``, read as a Harbor task by
:mod:`~envhub.harbor.terminal_bench`)."""

from __future__ import annotations

from pathlib import Path

from envhub.harbor.task import HarborTask, load_harbor_task
from envhub.harbor.terminal_bench import load_tb_task


def load_task(path: str | Path, *, in_container: bool = False) -> HarborTask:
    """Read and check the task folder at ``path`` in whichever format it is (see
    :func:`~envhub.harbor.task.load_harbor_task` for ``in_container`` and what is refused).

    Raises:
        EnvLoadError: A required file is missing or malformed (the message names it).
        UnsupportedEnvironment: The task's environment cannot run here.
    """
    folder = Path(path)
    if not (folder / "task.toml").is_file() and (folder / "task.yaml").is_file():
        return load_tb_task(folder, in_container=in_container)
    return load_harbor_task(folder, in_container=in_container)
