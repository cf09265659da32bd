"""Harbor task folders (the terminal-bench successor's format) as envhub envs.

    env = envhub.make("path/to/task")        # one task folder, or a folder of task folders

:mod:`~envhub.harbor.task` reads a folder, :mod:`~envhub.harbor.dockerfile` decides whether its
environment runs here (:mod:`~envhub.harbor.build_check` and :mod:`~envhub.harbor.installs` for
its ``RUN`` steps), :mod:`~envhub.harbor.build` runs those steps once per task to prepare its
workspace, :mod:`~envhub.harbor.layout` says where its paths (``/app``, ``/tests``...) are in a
session, :mod:`~envhub.harbor.env` is the env (:class:`HarborEnv`), :mod:`~envhub.harbor.verifier`
runs a task's tests and reads their reward (in a container of their own:
:mod:`~envhub.harbor.separate`), :mod:`~envhub.harbor.check` the solution check (``envhub check``).
"""

from envhub.harbor.dockerfile import UnsupportedEnvironment
from envhub.harbor.loading import load_task
from envhub.harbor.task import HarborTask, find_task_folders, is_task_folder

__all__ = [
    "HarborTask",
    "UnsupportedEnvironment",
    "find_task_folders",
    "is_task_folder",
    "load_task",
]
