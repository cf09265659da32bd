"""An agent package (``envhub init --template agent``: a harness env around an ``openai``-SDK
agent of its own) goes the whole Hub way: pushed through every gate (its own tests, the
contract, the audit), installed from the Hub into a fresh venv, evaluated there, the agent's
model calls answered by an OpenAI-protocol server."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from conftest import ALICE
from hub_server import HubServer
from venvs import fresh_venv

from envhub.hub import push
from envhub.rollout.io import read_trajectories
from envhub.scaffold import create_package

REPO = "alice/shop-agent"


def shopkeeper(prices: dict[str, int]) -> Any:
    """A model server that answers a basket question with its total at once (no tool call)."""

    def handle(method: str, path: str, body: Any) -> tuple[int, Any]:
        if path == "/v1/models":
            return 200, {"data": [{"id": "shopkeeper"}]}
        question = next(m["content"] for m in body["messages"] if m["role"] == "user")
        items = re.findall("|".join(prices), question)
        text = f"Answer: {sum(prices[item] for item in items)}"
        message = {"role": "assistant", "content": text}
        return 200, {"choices": [{"message": message, "finish_reason": "stop"}]}

    return handle


def test_an_agent_package_is_pushed_installed_and_evaluated_from_the_hub(
    hub: HubServer, http_server: Any, tmp_path: Path, unload: list[str]
) -> None:
    unload.append("shop_agent")
    package = create_package("shop-agent", "agent", tmp_path / "src")
    published = push(package, token=ALICE)  # every gate, the package's own tests included
    python = fresh_venv(tmp_path / "venv")
    installed = subprocess.run(
        [str(python), "-m", "envhub.cli", "install", f"{REPO}@0.1.0", "--trust", "--offline"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    assert f"{REPO} 0.1.0 installed: commit {published.commit}, envs shop-agent" in (
        installed.stdout
    )

    from shop_agent.agent import PRICES  # importable here: the gates loaded the package folder

    server = http_server(shopkeeper(PRICES))
    evaluated = subprocess.run(
        [str(python), "-m", "envhub.cli", "eval", "shop-agent", "-u", f"{server.url}/v1",
         "-n", "5", "-r", "1", "-o", "out"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr
    trajectories = read_trajectories(Path("out/trajectories.jsonl"))
    assert [t.reward for t in trajectories] == [1.0] * 5
    assert {(t.env.name, t.env.commit) for t in trajectories} == {("shop-agent", published.commit)}
    assert all(t.outcome == "ok" and len(t.turns) == 1 for t in trajectories)
