"""How ``rollout.vllm`` resolves into engine settings (no vLLM needed)."""

from __future__ import annotations

import pytest

from envhub.errors import ConfigError
from envhub.trainer.config import validate_config
from envhub.trainer.engines.vllm import resolve_settings
from envhub.trainer.engines.vllm_transport import serve_args
from envhub.trainer.weight_sync.transfers import choose as choose_backend
from envhub.trainer.weight_sync.verify import checked_statistic, default_tolerance


def _config(**vllm: object) -> object:
    return validate_config(
        {"envs": [{"name": "arithmetic"}], "seed": 9, "rollout": {"engine": "vllm", "vllm": vllm}}
    )


@pytest.mark.parametrize(
    ("requested", "on_gpu", "shares_gpu", "expected"),
    [
        ("auto", False, False, "envhub_shm"),
        ("auto", False, True, "envhub_shm"),
        ("auto", True, True, "ipc"),
        ("auto", True, False, "nccl"),
        ("envhub_shm", True, False, "envhub_shm"),
        ("nccl", True, True, "nccl"),
    ],
)
def test_auto_picks_the_transfer_backend_by_device_and_placement(
    requested: str, on_gpu: bool, shares_gpu: bool, expected: str
) -> None:
    assert choose_backend(requested, on_gpu=on_gpu, shares_gpu=shares_gpu) == expected


@pytest.mark.parametrize("backend", ["nccl", "ipc"])
def test_gpu_only_backends_are_refused_on_the_cpu(backend: str) -> None:
    with pytest.raises(ConfigError, match="needs CUDA GPUs; on the CPU use envhub_shm"):
        choose_backend(backend, on_gpu=False, shares_gpu=False)


def test_cpu_settings_run_float32_without_sleep_and_serve_with_training_flags() -> None:
    settings = resolve_settings(_config(), "/models/m", on_gpu=False)

    assert (settings.dtype, settings.sleep, settings.weight_transfer, settings.seed) == (
        "float32",
        False,
        "envhub_shm",
        9,
    )
    assert settings.max_model_len == 4096  # no config.json there: vLLM's default context
    assert serve_args(settings) == [
        "--dtype", "float32",
        "--weight-transfer-config", '{"backend": "envhub_shm"}',
        "--logprobs-mode", "processed_logprobs",
        "--enforce-eager",  # start 3x faster on the CPU
    ]  # fmt: skip
    assert default_tolerance(settings.dtype) == 1e-3


@pytest.mark.parametrize(
    ("trainer", "engine", "on_gpu", "expected"),
    [
        ("auto", "auto", False, "float32"),
        ("float32", "auto", False, "float32"),
        ("bfloat16", "auto", False, "bfloat16"),  # the trainer autocasts: the engine follows
        ("float16", "auto", False, "float16"),
        ("bfloat16", "float32", False, "float32"),  # asked for: kept
        ("float32", "auto", True, "bfloat16"),
    ],
)
def test_an_auto_engine_computes_in_the_trainers_precision(
    trainer: str, engine: str, on_gpu: bool, expected: str
) -> None:
    config = validate_config(
        {
            "envs": [{"name": "arithmetic"}],
            "model": {"dtype": trainer},
            "rollout": {"engine": "vllm", "vllm": {"dtype": engine}},
        }
    )

    settings = resolve_settings(config, "/m", on_gpu=on_gpu)

    assert settings.dtype == expected
    assert default_tolerance(settings.dtype) == (1e-3 if expected == "float32" else 0.2)
    assert checked_statistic(settings.dtype) == ("max" if expected == "float32" else "mean")


def test_gpu_inprocess_settings_sleep_between_rollouts_and_use_bf16() -> None:
    settings = resolve_settings(
        _config(mode="inprocess", gpu_memory_utilization=0.3), "/models/m", on_gpu=True
    )

    assert (settings.dtype, settings.sleep, settings.weight_transfer, settings.enforce_eager) == (
        "bfloat16",
        True,
        "ipc",
        False,
    )
    assert (default_tolerance(settings.dtype), checked_statistic(settings.dtype)) == (0.2, "mean")
    assert serve_args(settings)[-3:] == ["--gpu-memory-utilization", "0.3", "--enable-sleep-mode"]


def test_an_engine_on_ray_shares_the_gpu_only_when_colocated() -> None:
    def megatron(**vllm: object) -> object:
        return validate_config({
            "envs": [{"name": "arithmetic"}], "backend": {"kind": "megatron"},
            "rollout": {"engine": "vllm", "vllm": {"mode": "ray", **vllm}},
        })  # fmt: skip

    colocated = resolve_settings(megatron(colocate=True), "/m", on_gpu=True)
    assert (colocated.weight_transfer, colocated.sleep) == (
        "ipc",
        True,
    )  # NCCL cannot join two ranks on one GPU
    split = resolve_settings(megatron(tensor_parallel=2), "/m", on_gpu=True)
    assert (split.weight_transfer, split.sleep) == ("nccl", False)
    assert serve_args(split)[-2:] == ["--tensor-parallel-size", "2"]
    assert resolve_settings(megatron(), "/m", on_gpu=False).weight_transfer == "envhub_shm"


def test_a_gpu_server_sleeps_only_when_asked() -> None:
    assert resolve_settings(_config(), "/m", on_gpu=True).sleep is False
    assert resolve_settings(_config(sleep="on"), "/m", on_gpu=True).sleep is True


def test_unknown_vllm_keys_and_bad_values_fail_before_anything_starts() -> None:
    from envhub.trainer.config import load_config

    with pytest.raises(ConfigError, match="did you mean 'bucket_mb'"):
        load_config(None, ["envs=[{name: arithmetic}]", "rollout.vllm.bucket_mbs=3"])
    with pytest.raises(ConfigError, match="rollout.vllm.mode"):
        validate_config(
            {"envs": [{"name": "arithmetic"}], "rollout": {"vllm": {"mode": "colocated"}}}
        )


def test_a_started_server_gets_dev_mode_and_ipc_handles_only_when_ipc_is_used() -> None:
    from envhub.trainer.engines.vllm_transport import server_env

    cpu = resolve_settings(_config(kv_cache_gb=1.5), "/m", on_gpu=False)
    ipc = resolve_settings(_config(weight_transfer="ipc"), "/m", on_gpu=True)

    assert server_env(cpu) == {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1.5"}
    assert server_env(ipc)["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
