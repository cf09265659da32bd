"""A run's manifest: the distinct envs and samplers its trajectories record, kept across steps."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from envhub.env import SingleTurnEnv
from envhub.inference.base import SamplingParams
from envhub.rollout.manifest import manifest, update_manifest
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ScriptedEngine, replay

TASKS = [{"question": "q", "answer": "a"}]


class One(SingleTurnEnv):
    name = "manifest-one"
    version = "1.0.0"


class Two(One):
    name = "manifest-two"


def rollouts(env: type, temperature: float) -> list:
    runner = RolloutRunner(
        ScriptedEngine(replay("a")),
        lambda: env(TASKS),
        sampling=SamplingParams(temperature=temperature, max_tokens=8),
    )
    return asyncio.run(runner.run([0], 2))


SAMPLING = {"top_p": 1.0, "top_k": None, "max_tokens": 8, "stop": [], "seed": None,
            "logprobs": True}  # fmt: skip


def sampler(temperature: float) -> dict:
    return {"engine": "scripted", "mode": None, "model": "replay.<locals>.policy", "version": None,
            "sampling": {"temperature": temperature, **SAMPLING},
            "chat_template_sha256": None}  # fmt: skip


def test_the_manifest_lists_each_env_and_sampler_once_in_order(tmp_path: Path) -> None:
    step1 = rollouts(One, 1.0)
    assert manifest(step1) == {
        "env_refs": [{"name": "manifest-one", "version": "1.0.0", "commit": None}],
        "samplers": [sampler(1.0)],
    }
    path = tmp_path / "run" / "manifest.json"
    update_manifest(path, step1)
    update_manifest(path, rollouts(Two, 0.5) + rollouts(One, 1.0))
    assert json.loads(path.read_text()) == {
        "env_refs": [
            {"name": "manifest-one", "version": "1.0.0", "commit": None},
            {"name": "manifest-two", "version": "1.0.0", "commit": None},
        ],
        "samplers": [sampler(1.0), sampler(0.5)],
    }
