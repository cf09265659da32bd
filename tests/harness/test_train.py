"""A harness env trains like any env: ``envhub.trainer.loop.train`` on the torch backend, with a
tiny random model, a two-call ``openai``-SDK program, and a history rewrite on every episode."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envhub.harness import HarnessEnv
from envhub.rewards.rubric import Rubric, reward
from envhub.rollout.io import iter_trajectories
from envhub.state import State
from envhub.testing import letter_e_share

pytest.importorskip("openai")
pytest.importorskip("torch")


async def two_call_agent(client: Any, prompt: str) -> str:
    """Asks, then asks again with only its own summary: two segments per episode."""
    first = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": prompt}]
    )
    text = first.choices[0].message.content or ""
    second = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": f"{prompt} Earlier you said: {text}"}]
    )
    return second.choices[0].message.content or ""


@reward
def letter_e(state: State) -> float:
    """The share of e's in what the program returned (a reward a random model varies on)."""
    return letter_e_share(str(state.data.get("result") or ""))


class LettersAgentEnv(HarnessEnv):
    name = "harness-letters"

    def __init__(self, **kwargs: Any) -> None:
        tasks = [{"question": f"Write a word with many e's ({i})."} for i in range(4)]
        super().__init__(two_call_agent, tasks, rubric=Rubric([letter_e]), **kwargs)


@pytest.fixture
def letters_agent() -> Iterator[str]:
    import envhub
    from envhub import registry

    envhub.register(LettersAgentEnv.name, LettersAgentEnv, override=True)
    yield LettersAgentEnv.name
    registry._registered.pop(LettersAgentEnv.name, None)


def test_two_training_steps_on_a_harness_env(
    letters_agent: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from envhub.trainer.config import validate_config
    from envhub.trainer.loop import train

    config = validate_config(
        {
            "steps": 2,
            "seed": 3,
            "model": {"name": str(tiny_model_dir)},
            "envs": [{"name": letters_agent}],
            "rollout": {"tasks_per_step": 2, "samples_per_task": 4, "max_tokens": 8},
            "algorithm": {"mismatch": "none", "dynamic_sampling": True},
            "optimizer": {"lr": 1e-3},
            "backend": {"device": "cpu", "micro_batch_tokens": 512},
            "logging": {"output_dir": str(tmp_path), "run_name": "run", "plot": False},
            "eval": None,
        }
    )
    result = train(config)
    assert [row["step"] for row in result.history] == [1, 2]
    files = sorted((result.run_dir / "trajectories").glob("step-*.jsonl"))
    trajectories = [t for f in files for t in iter_trajectories(f)]
    assert len(trajectories) == 16
    assert {t.outcome for t in trajectories} == {"ok"}
    for traj in trajectories:
        # Two calls, the second a rewrite: one earlier segment and the last one, each with its
        # own prompt and exactly the sampled turn in the loss.
        assert traj.metrics["prefix_breaks"] == 1 and len(traj.segments) == 1
        (turn0, turn1) = traj.turns
        assert sum(traj.segments[0].loss_mask) == turn0.completion_tokens
        assert sum(traj.loss_mask) == turn1.completion_tokens
    for row in result.history:
        if row["batch/kept"] > 0:  # kept episodes bring both their segments
            assert row["batch/kept"] % 2 == 0 and row["batch/segments_skipped"] == 0
    assert any(row["batch/kept"] > 0 for row in result.history)


@pytest.mark.vllm
@pytest.mark.usefixtures("require_vllm")
@pytest.mark.parametrize("max_staleness", [0, 1])
def test_a_harness_env_trains_on_vllm_synchronously_and_asynchronously(
    letters_agent: str,
    tiny_model_dir: Path,
    training_vllm_server: str,
    tmp_path: Path,
    max_staleness: int,
) -> None:
    from envhub.trainer.config import validate_config
    from envhub.trainer.loop import train

    config = validate_config(
        {
            "steps": 2,
            "seed": 5,
            "model": {"name": str(tiny_model_dir)},
            "envs": [{"name": letters_agent}],
            "rollout": {
                "engine": "vllm", "tasks_per_step": 2, "samples_per_task": 4, "max_tokens": 8,
                "vllm": {"kv_cache_gb": 1, "url": training_vllm_server},
                "max_staleness": max_staleness,
            },
            "optimizer": {"lr": 1e-3},
            "backend": {"device": "cpu", "micro_batch_tokens": 512},
            "logging": {"output_dir": str(tmp_path), "run_name": "run", "plot": False},
            "eval": None,
        }
    )  # fmt: skip
    result = train(config)
    assert [row["step"] for row in result.history] == [1, 2]
    files = sorted((result.run_dir / "trajectories").glob("step-*.jsonl"))
    trajectories = [t for f in files for t in iter_trajectories(f)]
    assert len(trajectories) == 16 and {t.outcome for t in trajectories} == {"ok"}
    for traj in trajectories:
        assert len(traj.segments) == 1 and traj.sampler is not None
        assert traj.sampler.engine == "vllm"
        # vLLM's logprobs ride along with the sampled tokens, in both segments
        for mask, logprobs in (
            (traj.segments[0].loss_mask, traj.segments[0].sampler_logprobs),
            (traj.loss_mask, traj.sampler_logprobs),
        ):
            sampled = [lp for m, lp in zip(mask, logprobs, strict=True) if m]
            assert sampled and all(lp <= 0.0 for lp in sampled) and any(lp < 0 for lp in sampled)
    for row in result.history:
        assert row["sync/logprob_diff_max"] < 1e-4  # every weight sync verified
        assert row["rollout/errors"] == 0.0
        if max_staleness:  # groups within the bound, each counted at its staleness
            assert row["async/staleness_max"] <= 1
            assert row["async/staleness_0"] + row["async/staleness_1"] == 8.0
