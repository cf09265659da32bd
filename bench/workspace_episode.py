"""A repo-repair episode, phase by phase, against the same work done bare on the host.

Each episode: ``reset`` (a session opened on the task's prepared workspace), a ``view`` of the
buggy module, a ``str_replace`` that fixes it, a ``bash`` call (``python3 -m pytest -q``), then
the final answer, whose step runs the verifier (the suite restored, isolated pytest, its JUnit
report read) and closes the session. The baseline does the same on the host without a sandbox:
copy the project into a fresh folder, read the file, write the fix, run pytest twice
(``subprocess.run`` of the same ``python3`` and pytest the sandbox runs). p50 of each phase,
in milliseconds.

Needs root and bubblewrap (as local sessions do).

    .venv/bin/python bench/workspace_episode.py [--episodes 12]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from envhub.checks.pytest_bundle import SYSTEM_PATH
from envhub.envs.repo_repair import RepoRepairEnv
from envhub.workspace_env import default_command_env


def call(name: str, **arguments: object) -> str:
    """A tool call as a model writes it (Hermes format)."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def timed(action) -> float:
    """Milliseconds ``action()`` took."""
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


def episode(env: RepoRepairEnv, index: int) -> dict[str, float]:
    """Milliseconds of each phase of one episode that fixes the task."""
    project = RepoRepairEnv.project(env.dataset[index])
    (plant,) = project.plants
    phases = {"reset (session opens)": timed(lambda: env.reset(options={"task_index": index}))}
    phases["view"] = timed(lambda: env.step(call("view", path=plant.path)))
    fix = call("str_replace", path=plant.path, old_str=plant.buggy, new_str=plant.correct)
    phases["str_replace"] = timed(lambda: env.step(fix))
    phases["bash: pytest"] = timed(lambda: env.step(call("bash", command="python3 -m pytest -q")))
    phases["end: verifier + close"] = timed(lambda: env.step("Fixed."))
    assert env.state.reward_components["verifier"] == 1.0
    return phases


def bare(index: int, env: RepoRepairEnv) -> dict[str, float]:
    """The same work on the host, no sandbox: a copy, a read, a write, pytest twice."""
    project = RepoRepairEnv.project(env.dataset[index])
    (plant,) = project.plants
    folder = Path(tempfile.mkdtemp(prefix="bench-repo-"))

    def copy() -> None:
        for path, text in project.files.items():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_text(text)

    python = shutil.which("python3", path=SYSTEM_PATH)  # the one sandboxed commands find
    pytest = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    variables = {**os.environ, **default_command_env()}  # the sandbox's python3 and pytest

    def run() -> None:
        subprocess.run(pytest, cwd=folder, env=variables, capture_output=True, check=False)

    target = folder / plant.path
    phases = {"reset (session opens)": timed(copy)}
    phases["view"] = timed(target.read_text)
    phases["str_replace"] = timed(
        lambda: target.write_text(target.read_text().replace(plant.buggy, plant.correct))
    )
    phases["bash: pytest"] = timed(run)
    phases["end: verifier + close"] = timed(run)
    shutil.rmtree(folder)
    return phases


def main() -> None:
    """Print p50 per phase, episodes in the sandbox against bare host work."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=12)
    args = parser.parse_args()
    env = RepoRepairEnv(difficulties=(1, 2), seeds=tuple(range(args.episodes)))
    indices = [i for i in range(len(env.dataset)) if len(env.project(env.dataset[i]).plants) == 1]
    indices = indices[: args.episodes]
    episode(env, indices[0])  # warm up: the pytest bundle, the sandbox's first start
    ours = [episode(env, i) for i in indices]
    theirs = [bare(i, env) for i in indices]
    env.close()
    print(f"repo-repair episodes: {len(indices)}, p50 ms per phase")
    print(f"{'phase':24} {'session':>9} {'bare host':>10}")
    for phase in ours[0]:
        a = statistics.median(p[phase] for p in ours)
        b = statistics.median(p[phase] for p in theirs)
        print(f"{phase:24} {a:9.1f} {b:10.1f}")
    total = statistics.median(sum(p.values()) for p in ours)
    base = statistics.median(sum(p.values()) for p in theirs)
    print(f"{'episode':24} {total:9.1f} {base:10.1f}")


if __name__ == "__main__":
    main()
