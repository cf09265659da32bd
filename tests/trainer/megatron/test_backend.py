"""The Megatron backend's planning and config checks: what fails before any rank starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from envhub.errors import ConfigError
from envhub.trainer.config import validate_config
from envhub.trainer.megatron.backend import check_layout, plan, worker_spec
from envhub.trainer.megatron.rank_setup import SETUP_ENV


def _config(**parts: object) -> object:
    base = {
        "envs": [{"name": "arithmetic"}],
        "backend": {"kind": "megatron"},
        "rollout": {"engine": "vllm"},
    }
    return validate_config(base | parts)


def test_megatron_needs_vllm_rollouts_and_full_weights() -> None:
    with pytest.raises(
        ConfigError, match="backend.kind=megatron generates with vLLM: set rollout.engine=vllm"
    ):
        _config(rollout={"engine": "hf"})
    with pytest.raises(
        ConfigError, match=r"the Megatron backend trains all weights: remove model.lora"
    ):
        _config(model={"lora": {"rank": 4}})


@pytest.mark.parametrize(
    ("megatron", "cluster", "world", "layout"),
    [
        (
            {"tensor_parallel": 2, "pipeline_parallel": 2},
            {"nodes": 2, "gpus_per_node": 8},
            16,
            (2, 2, 4),
        ),
        ({"tensor_parallel": 8}, {"gpus_per_node": 8}, 8, (8, 1, 1)),
        ({}, {"gpus_per_node": 4}, 4, (1, 1, 4)),
    ],
)
def test_data_parallel_fills_the_gpus(
    megatron: dict, cluster: dict, world: int, layout: tuple
) -> None:
    placement, got = plan(
        _config(
            backend={"kind": "megatron", "megatron": megatron},
            cluster={"address": "auto", **cluster},
        )
    )
    assert (placement.world_size, placement.gpus_per_node, got) == (
        world,
        cluster["gpus_per_node"],
        layout,
    )


def test_splits_that_do_not_fit_the_gpus_fail_with_the_numbers() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^8 GPUs cannot hold tensor_parallel x pipeline_parallel = 3 ranks evenly$",
    ):
        plan(
            _config(
                backend={"kind": "megatron", "megatron": {"tensor_parallel": 3}},
                cluster={"gpus_per_node": 8},
            )
        )
    with pytest.raises(
        ConfigError,
        match=(
            r"^tp x pp x dp = 4 but the cluster has 8 GPUs \(1 x 8\); "
            r"fix backend.megatron.data_parallel$"
        ),
    ):
        plan(
            _config(
                backend={
                    "kind": "megatron",
                    "megatron": {"tensor_parallel": 2, "data_parallel": 2},
                },
                cluster={"gpus_per_node": 8},
            )
        )


def test_cpu_ranks_are_refused_outside_the_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SETUP_ENV, raising=False)
    with pytest.raises(
        ConfigError,
        match=(
            r"^backend.kind=megatron needs CUDA GPUs "
            r"\(none found here; for a Ray cluster set cluster.gpus_per_node\); "
            r"on a CPU use backend.kind=torch$"
        ),
    ):
        plan(_config(cluster={"gpus_per_node": 0}))
    monkeypatch.setenv(SETUP_ENV, "/some/setup.py")
    placement, layout = plan(
        _config(
            backend={"kind": "megatron", "megatron": {"pipeline_parallel": 2}},
            cluster={"gpus_per_node": 0},
        )
    )
    assert (placement.world_size, placement.gpus_per_node, layout) == (2, 0, (1, 2, 1))


def test_layout_must_divide_heads_and_layers(tiny_model_dir: Path) -> None:
    check_layout(
        str(tiny_model_dir), 2, 2
    )  # 2 heads, 1 key/value head (replicated under TP=2), 2 layers
    with pytest.raises(
        ConfigError,
        match=(
            r"^backend.megatron.tensor_parallel=4 must divide the model's "
            r"2 attention and 1 key/value heads$"
        ),
    ):
        check_layout(str(tiny_model_dir), 4, 1)
    with pytest.raises(
        ConfigError,
        match=r"^backend.megatron.pipeline_parallel=3 must divide the model's 2 layers$",
    ):
        check_layout(str(tiny_model_dir), 1, 3)


def test_worker_spec_carries_the_run_settings() -> None:
    config = _config(
        steps=10, seed=3, rollout={"engine": "vllm", "temperature": 0.6},
        algorithm={"updates_per_step": 2, "kl_beta": 0.01, "entropy_coef": 0.001},
        optimizer={"lr": 2e-6, "weight_decay": 0.1, "grad_clip": 0.5, "schedule": "cosine",
                   "warmup_steps": 3},
        backend={"kind": "megatron", "megatron": {"tensor_parallel": 2}},
        model={"gradient_checkpointing": True},
    )  # fmt: skip
    placement, _ = plan(
        config.model_copy(
            update={"cluster": config.cluster.model_copy(update={"gpus_per_node": 2})}
        )
    )
    spec = worker_spec(config, "/models/m", placement)
    assert (
        spec.tensor_parallel,
        spec.pipeline_parallel,
        spec.dtype,
        spec.seed,
        spec.temperature,
    ) == (2, 1, "bfloat16", 3, 0.6)
    assert (
        spec.lr,
        spec.weight_decay,
        spec.grad_clip,
        spec.schedule,
        spec.warmup_steps,
        spec.total_updates,
    ) == (2e-6, 0.1, 0.5, "cosine", 3, 20)
    assert (spec.entropy_coef, spec.reference, spec.recompute) == (0.001, True, True)


def test_dry_run_estimate_splits_the_state_over_the_ranks(tiny_model_dir: Path) -> None:
    from envhub.trainer.estimate import estimate

    config = _config(
        model={"name": str(tiny_model_dir)},
        backend={"kind": "megatron", "megatron": {"pipeline_parallel": 2}},
    )
    # 6,587,008 parameters x (4 weight + 12 AdamW bytes) / 2 stages, plus one micro-batch of
    # 4096 tokens: logits 4096 x 49152 x 12 B and, in bfloat16, 2 layers x (8 x hidden 128 +
    # 4 x MLP 256) values per token.
    expected = (6_587_008 * 16 / 2 + 4096 * 49152 * 12 + 4096 * 2 * (8 * 128 + 4 * 256) * 2) / 2**30
    assert estimate(config)["per Megatron rank"] == f"{expected:.2f} GiB (tp=1, pp=2; vLLM apart)"


def test_a_split_vllm_engine_on_ray_leaves_the_trainer_the_other_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    monkeypatch.setattr(
        torch.cuda, "device_count", lambda: 4
    )  # a 4-GPU node, as far as planning goes
    split = _config(rollout={"engine": "vllm", "vllm": {"mode": "ray", "tensor_parallel": 1}})
    placement, layout = plan(split)
    assert (placement.world_size, placement.gpus_per_node, placement.gpu_share, layout) == (
        3,
        3,
        1.0,
        (1, 1, 3),
    )
    two_engines = _config(rollout={"engine": "vllm", "vllm": {"mode": "ray", "engines": 2}})
    assert plan(two_engines)[1] == (1, 1, 2)
    colocated = _config(rollout={"engine": "vllm", "vllm": {"mode": "ray", "colocate": True}})
    placement, layout = plan(colocated)
    assert (placement.world_size, placement.gpus_per_node, placement.gpu_share, layout) == (
        4,
        4,
        0.5,
        (1, 1, 4),
    )
    with pytest.raises(
        ConfigError,
        match=(
            r"^the vLLM engines' own bundles take 4 of this node's 4 GPUs, "
            r"leaving none for the trainer: set rollout.vllm.colocate=true"
        ),
    ):
        plan(_config(rollout={"engine": "vllm", "vllm": {"mode": "ray", "tensor_parallel": 4}}))


def test_vllm_placement_settings_that_contradict_each_other_are_refused() -> None:
    with pytest.raises(
        ConfigError,
        match=(
            r"rollout.vllm.colocate places the engine with the Megatron ranks on Ray: "
            r"set rollout.vllm.mode=ray"
        ),
    ):
        _config(rollout={"engine": "vllm", "vllm": {"colocate": True}})
    with pytest.raises(
        ConfigError, match=r"rollout.vllm.tensor_parallel must be 1 \(or drop colocate\)"
    ):
        _config(
            rollout={
                "engine": "vllm",
                "vllm": {"mode": "ray", "colocate": True, "tensor_parallel": 2},
            }
        )
    with pytest.raises(
        ConfigError, match=r"several vLLM engines are placed by Ray, each in a bundle of its own"
    ):
        _config(rollout={"engine": "vllm", "vllm": {"mode": "ray", "colocate": True, "engines": 2}})
    with pytest.raises(
        ConfigError, match=r"several vLLM engines are placed by Ray, each in a bundle of its own"
    ):
        _config(rollout={"engine": "vllm", "vllm": {"engines": 2}})
    with pytest.raises(
        ConfigError,
        match=r"rollout.vllm.url names a running server: it needs rollout.vllm.mode=server",
    ):
        _config(rollout={"engine": "vllm", "vllm": {"mode": "ray", "url": "http://127.0.0.1:8000"}})


def test_a_critic_takes_the_other_half_of_the_gpus_with_the_same_layout() -> None:
    gae = {"advantage": "gae", "dynamic_sampling": False}
    placement, layout = plan(
        _config(
            backend={"kind": "megatron", "megatron": {"tensor_parallel": 2}},
            cluster={"address": "auto", "nodes": 2, "gpus_per_node": 8},
            algorithm=gae,
        )
    )
    # 16 GPUs: 8 for the policy's ranks (tp 2 x dp 4), 8 for the critic's, 4 per node each.
    assert (placement.world_size, placement.gpus_per_node, layout) == (8, 4, (2, 1, 4))
    with pytest.raises(ConfigError, match="3 per node do not halve"):
        plan(_config(cluster={"address": "auto", "gpus_per_node": 3}, algorithm=gae))


def test_the_local_ray_cluster_holds_the_critics_ranks_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from envhub.trainer.cluster.run import ray_cpus

    monkeypatch.setenv(SETUP_ENV, "cpu_compat.py")  # CPU ranks, as the tests run them
    megatron = {"kind": "megatron", "megatron": {"pipeline_parallel": 2}}
    assert ray_cpus(_config(backend=megatron)) == 2
    gae = {"advantage": "gae", "dynamic_sampling": False}
    assert ray_cpus(_config(backend=megatron, algorithm=gae)) == 4
