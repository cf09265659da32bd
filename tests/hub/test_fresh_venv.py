"""Done-when of the Hub issue, in one test: a package made by ``envhub init`` is pushed, installed
from the Hub into a fresh virtual environment, evaluated there with ``envhub eval``, and the lock
file reinstalls the same commit after a newer version is out.

The fresh venv is created from this interpreter without pip and sees envhub and its dependencies
through a ``.pth`` line pointing at this environment's site-packages, so nothing is downloaded;
the Hub package itself is only in the Hub (the local server) until ``envhub install`` puts it in.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from conftest import ALICE
from hub_server import HubServer
from venvs import fresh_venv

from envhub.hub import push
from envhub.hub.lock import read_lock
from envhub.rollout.io import read_trajectories

REPO = "alice/capital-cities"


def run(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )


def solver(answers: dict[str, str]) -> Any:
    def handle(method: str, path: str, body: Any) -> tuple[int, Any]:
        if path == "/v1/models":
            return 200, {"data": [{"id": "solver"}]}
        if path == "/v1/chat/completions":
            text = f"Answer: {answers[body['messages'][-1]['content']]}"
            return 200, {
                "choices": [
                    {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                ]
            }
        return 404, {"error": {"message": f"no route {path}"}}

    return handle


def test_push_install_in_a_fresh_venv_eval_and_reproduce_from_the_lock(
    hub: HubServer, package: Path, http_server: Any, tmp_path: Path
) -> None:
    published = push(package, token=ALICE)  # every gate, the package's own tests included
    python = fresh_venv(tmp_path / "venv")
    assert run(python, "-c", "import capital_cities").returncode != 0

    installed = run(python, "-m", "envhub.cli", "install", f"{REPO}@0.1.0", "--trust", "--offline")
    assert installed.returncode == 0, installed.stderr
    assert (
        f"alice/capital-cities 0.1.0 installed: commit {published.commit}, envs capital-cities"
        in installed.stdout
    )
    entry = read_lock("envhub.lock")[REPO]
    assert (entry.revision, entry.version, entry.commit, entry.content_hash) == (
        "0.1.0",
        "0.1.0",
        published.commit,
        published.content_hash,
    )

    from capital_cities.env import TASKS  # importable here: the gates loaded the package folder

    server = http_server(solver({t["question"]: t["answer"] for t in TASKS}))
    evaluated = run(
        python,
        "-m",
        "envhub.cli",
        "eval",
        "capital-cities",
        "-u",
        f"{server.url}/v1",
        "-n",
        "3",
        "-r",
        "1",
        "-o",
        "out",
    )
    assert evaluated.returncode == 0, evaluated.stderr
    trajectories = read_trajectories(Path("out/trajectories.jsonl"))
    assert [t.reward for t in trajectories] == [1.0, 1.0, 1.0]
    assert {(t.env.name, t.env.version, t.env.commit) for t in trajectories} == {
        ("capital-cities", "0.1.0", published.commit)
    }

    made = run(
        python,
        "-c",
        f"import envhub; env = envhub.make('{REPO}@0.1.0'); "
        "print(env.name, env.version, type(env).__module__)",
    )
    assert made.stdout.strip() == "capital-cities 0.1.0 capital_cities.env", made.stderr

    pyproject, env_py = package / "pyproject.toml", package / "capital_cities" / "env.py"
    for path in (pyproject, env_py):
        path.write_text(path.read_text().replace('version = "0.1.0"', 'version = "0.2.0"'))
    newer = push(package, token=ALICE, run_tests=False)
    untrusted = run(python, "-c", f"import envhub; envhub.make('{REPO}@0.2.0')")
    assert untrusted.returncode != 0
    assert (
        f"alice/capital-cities@0.2.0 (commit {newer.commit[:12]}) is not installed, "
        "and installing runs its code"
    ) in untrusted.stderr

    lock_before = Path("envhub.lock").read_bytes()
    assert run(python, "-m", "pip", "uninstall", "-y", "-q", "capital-cities").returncode == 0
    reinstalled = run(python, "-m", "envhub.cli", "install", "--trust", "--offline")
    assert reinstalled.returncode == 0, reinstalled.stderr
    assert f"alice/capital-cities 0.1.0 installed: commit {published.commit}" in reinstalled.stdout
    source = run(
        python,
        "-c",
        "from envhub.hub.provenance import install_source; "
        "print(list(install_source('capital-cities')))",
    )
    assert json.loads(source.stdout.replace("'", '"')) == [REPO, published.commit]
    assert Path("envhub.lock").read_bytes() == lock_before
