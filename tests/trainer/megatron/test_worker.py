"""The Megatron worker on the CPU over gloo (real megatron-core and mbridge, 2 processes):
the HF -> Megatron -> HF round trip, and a training step under TP=2, PP=2 and DP=2 that
matches the torch backend on the same tiny model and batch."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

pytest.importorskip("megatron.core")
pytest.importorskip("mbridge")

from safetensors.torch import load_file  # noqa: E402

from envhub.trainer.algorithms import ObjectiveSpec  # noqa: E402
from envhub.trainer.backends.torch_backend import TorchBackend  # noqa: E402
from envhub.trainer.config import validate_config  # noqa: E402

HERE = Path(__file__).resolve().parent
COMPAT = HERE / "cpu_compat.py"


def _load_rank_main() -> ModuleType:
    """The rank script as a module (its batch and settings are the test's too)."""
    spec = importlib.util.spec_from_file_location("megatron_rank_main", HERE / "rank_main.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rank_main = _load_rank_main()


def run_ranks(
    run_torchrun: Callable[..., None],
    model_dir: Path,
    out: Path,
    *,
    world: int,
    tp: int,
    pp: int,
    setup: Path | None = COMPAT,
    recompute: bool = False,
    distributed_optimizer: bool = False,
    bfloat16: bool = False,
    engine_urls: list[str] = (),
    compiled: bool = False,
) -> list[dict]:
    """``rank_main.py`` under torchrun (``setup``: the CPU compatibility; ``None`` on GPUs;
    ``recompute``: activation recomputation; ``distributed_optimizer``: megatron-core's, which
    GPUs take anyway; ``bfloat16``: parameters in bf16, not float32; ``engine_urls``:
    weight-transfer engines to sync to); each rank's record, in rank order."""
    env = {rank_main.ENGINES_ENV: ",".join(engine_urls)} if engine_urls else {}
    flags = ["recompute"] * recompute + ["distributed-optimizer"] * distributed_optimizer
    flags += ["bfloat16"] * bfloat16 + ["compiled"] * compiled
    args = [str(model_dir), str(out), str(tp), str(pp), *flags]
    run_torchrun("rank_main.py", args, world=world, setup=setup, env=env)
    return [torch.load(out / f"rank-{r}.pt") for r in range(world)]


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> dict:
    """The torch backend on the same batch: logprobs, then two updates."""
    optimizer = {k: v for k, v in rank_main.OPTIMIZER.items() if k != "total_updates"}
    config = validate_config({
        "model": {"name": str(tiny_model_dir)}, "envs": [{"name": "arithmetic"}],
        "backend": {"device": "cpu"}, "steps": 4,
        "rollout": {"temperature": rank_main.TEMPERATURE}, "optimizer": optimizer,
    })  # fmt: skip
    backend = TorchBackend(config)
    b = rank_main.batch()
    mbs = rank_main.packed(b)
    logprobs = backend.logprobs(mbs)
    metrics = [
        backend.update(
            mbs,
            ObjectiveSpec(),
            old_logprobs=None,
            ref_logprobs=None,
            num_tokens=b.num_tokens,
            num_sequences=b.num_sequences,
        ).metrics
        for _ in range(2)
    ]
    return {
        "mbs": mbs,
        "logprobs": logprobs,
        "metrics": metrics,
        "weights": dict(backend.weights()),
        "num_parameters": backend.num_parameters(),
    }


LAYOUTS = {"tp2": (2, 1, False, False), "pp2": (1, 2, True, False), "dp2": (1, 1, False, True)}
"""tp, pp, activation recomputation and the distributed optimizer: the pipeline layout
recomputes, the data-parallel one shards its optimizer state (the GPU default) over the two
replicas; each gives the same update."""


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def layout_run(
    request: pytest.FixtureRequest,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    shm_engines,
    run_torchrun: Callable[..., None],
) -> tuple[list[dict], list]:
    """Each layout's ranks, and the two engines they synced their trained weights to."""
    tp, pp, recompute, distributed_optimizer = LAYOUTS[request.param]
    engines = shm_engines(2)
    urls = [url for url, _ in engines]
    records = run_ranks(
        run_torchrun,
        tiny_model_dir,
        tmp_path_factory.mktemp(request.param),
        world=2,
        tp=tp,
        pp=pp,
        recompute=recompute,
        distributed_optimizer=distributed_optimizer,
        engine_urls=urls,
    )
    return records, [engine for _, engine in engines]


@pytest.fixture(scope="module")
def ranks(layout_run: tuple[list[dict], list]) -> list[dict]:
    return layout_run[0]


def test_layout_of_the_ranks(ranks: list[dict]) -> None:
    infos = [r["info"] for r in ranks]
    pipeline = max(i["pp"] for i in infos) == 1
    assert [r["recompute"] for r in ranks] == [
        "full" if pipeline else None
    ] * 2  # the pipeline layout recomputes
    assert [i["rank"] for i in infos] == [0, 1]
    tp = max(i["tp"] for i in infos) + 1
    pp = max(i["pp"] for i in infos) + 1
    dp = max(i["dp"] for i in infos) + 1
    assert tp * pp * dp == 2
    sharded = "DistributedOptimizer" if dp == 2 else "FP32Optimizer"
    assert [r["optimizer"] for r in ranks] == [sharded] * 2
    assert [r["parameter_dtypes"] for r in ranks] == [["torch.float32"]] * 2
    assert sum(i["output"] for i in infos) == 1  # one rank reports the update


def test_round_trip_gives_the_checkpoint_back_exactly(
    ranks: list[dict], tiny_model_dir: Path, reference: dict
) -> None:
    exported = ranks[0]["weights_before"]
    on_disk = load_file(str(tiny_model_dir / "model.safetensors"))
    assert set(exported) == set(on_disk) - {
        "lm_head.weight"
    }  # tied: the embedding once, as HF saves it
    for name, tensor in exported.items():
        assert torch.equal(tensor, on_disk[name]), name
    assert all(r["weights_before"] is None for r in ranks[1:])
    assert {r["num_parameters"] for r in ranks} == {reference["num_parameters"]}


def test_logprobs_match_the_hf_model(ranks: list[dict], reference: dict) -> None:
    merged: dict[int, torch.Tensor] = {}
    for r in ranks:
        merged |= r["logprobs"] or {}
    assert sorted(merged) == list(range(len(reference["mbs"])))
    for k, mb in enumerate(reference["mbs"]):
        mask = (
            mb.loss_mask.bool()
        )  # pads differ: HF masks them, megatron's causal attention does not
        torch.testing.assert_close(
            merged[k][mask], reference["logprobs"][k][mask], atol=1e-5, rtol=0
        )


def test_two_updates_match_the_torch_backend(ranks: list[dict], reference: dict) -> None:
    reports = [r["metrics"] for r in ranks if r["metrics"][0] is not None]
    assert len(reports) == 1
    for ours, theirs in zip(reports[0], reference["metrics"], strict=True):
        for name in (
            "loss",
            "policy_loss",
            "entropy",
            "grad_norm",
            "lr",
            "clip_frac",
            "mismatch_kl",
            "ratio_mean",
            "sft_nll_per_token",  # the demonstration's tokens (rank_main.DEMONSTRATION)
            "sft_token_frac",
        ):
            assert ours[name] == pytest.approx(theirs[name], rel=1e-4, abs=1e-7), name
    assert reports[0][0]["grad_norm"] > 0.2  # the clip (0.2) was active: clipping is compared too
    after = ranks[0]["weights_after"]
    before = ranks[0]["weights_before"]
    for name, tensor in reference["weights"].items():
        ours, theirs = after[name] - before[name], tensor - before[name]
        # Adam divides by sqrt(v): a gradient of ~0 turns fp32 summation-order noise into a
        # visible step, so elements may differ by ~1% of lr; the update as a whole agrees.
        assert (ours - theirs).abs().max() < 0.02 * rank_main.OPTIMIZER["lr"], name
        assert (ours - theirs).norm() < 2e-3 * theirs.norm(), name
        assert theirs.abs().max() > 0.5 * rank_main.OPTIMIZER["lr"], name  # every tensor moved


def test_a_checkpoint_resumes_to_the_same_update(ranks: list[dict]) -> None:
    """Megatron's distributed checkpoint (model and optimizer shards) saved after the first
    update, loaded after the second: repeating the second gives the same weights and metrics."""
    for r in ranks:
        assert r["metrics_resumed"] == r["metrics"][1]
    resumed, after = ranks[0]["weights_resumed"], ranks[0]["weights_after"]
    assert set(resumed) == set(after)
    for name, tensor in after.items():
        assert torch.equal(resumed[name], tensor), name


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
            ],
        ),
    ],
)
def test_a_bfloat16_model_resumes_under_the_distributed_optimizer(
    device: str, tiny_model_dir: Path, tmp_path: Path, run_torchrun: Callable[..., None]
) -> None:
    """What a GPU run without Transformer Engine holds: bf16 parameters throughout (the local
    spec's norms too) with float32 master weights in megatron-core's distributed optimizer,
    which runs torch's Adam there. Its checkpoint gives the same next update (bit for bit on the
    CPU; on a GPU within what flash attention's backward may vary); before the fixes in
    ``torch_adam.py`` and ``bridge.build_model`` it failed to save, then to load, then resumed
    to an update 0.65x the right one."""
    (rank,) = run_ranks(
        run_torchrun, tiny_model_dir, tmp_path, world=1, tp=1, pp=1,
        setup=COMPAT if device == "cpu" else None, distributed_optimizer=True, bfloat16=True,
    )  # fmt: skip
    assert rank["optimizer"] == "DistributedOptimizer"
    assert rank["parameter_dtypes"] == ["torch.bfloat16"]
    before, after, resumed = (
        rank[k] for k in ("weights_before", "weights_after", "weights_resumed")
    )
    if device == "cpu":
        assert rank["metrics_resumed"] == rank["metrics"][1]
        for name, tensor in after.items():
            assert torch.equal(resumed[name], tensor), name
        return
    for name in ("loss", "grad_norm"):
        assert rank["metrics_resumed"][name] == pytest.approx(rank["metrics"][1][name], rel=1e-3)
    # Two updates' worth of change, the second one resumed ("<=": bf16 norm weights of 1 may
    # round a whole step away and not move at all).
    for name, tensor in after.items():
        moved, moved_resumed = (t.double() - before[name].double() for t in (tensor, resumed[name]))
        assert (moved_resumed - moved).norm() <= 0.05 * moved.norm(), name


def test_the_reference_model_stays_the_initial_policy(ranks: list[dict]) -> None:
    for r in ranks:
        if r["logprobs"] is None:
            assert r["reference_logprobs"] is None
            continue
        assert sorted(r["reference_logprobs"]) == sorted(r["logprobs"])
        for k, before in r["logprobs"].items():  # TP all-reduces may sum in another order: ~1e-7
            torch.testing.assert_close(r["reference_logprobs"][k], before, atol=1e-5, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("compiled", [False, True])
def test_one_gpu_rank_matches_the_torch_backend(
    tiny_model_dir: Path,
    tmp_path: Path,
    reference: dict,
    run_torchrun: Callable[..., None],
    compiled: bool,
) -> None:
    """The GPU path: NCCL, megatron-core's distributed optimizer, no compatibility module;
    ``compiled``: the fused logprobs and the compiled layers (backend.compile) too."""
    (rank,) = run_ranks(
        run_torchrun, tiny_model_dir, tmp_path, world=1, tp=1, pp=1, setup=None,
        compiled=compiled,
    )  # fmt: skip
    for k, mb in enumerate(reference["mbs"]):
        mask = mb.loss_mask.bool()
        torch.testing.assert_close(
            rank["logprobs"][k][mask], reference["logprobs"][k][mask], atol=1e-4, rtol=0
        )
    for ours, theirs in zip(rank["metrics"], reference["metrics"], strict=True):
        for name in ("loss", "grad_norm", "entropy"):
            assert ours[name] == pytest.approx(theirs[name], rel=1e-3, abs=1e-6), name
    assert rank["metrics_resumed"] == rank["metrics"][1]


def test_weights_stream_in_buckets_of_whole_tensors(ranks: list[dict]) -> None:
    """What the vLLM sync reads: the weights after training, about 1 MB at a time, on rank 0."""
    buckets = ranks[0]["weight_buckets"]
    streamed = [pair for bucket in buckets for pair in bucket]
    after = ranks[0]["weights_after"]
    assert [name for name, _ in streamed] == list(after)
    for name, tensor in streamed:
        assert torch.equal(tensor, after[name]), name
    # The 25 MB embedding alone, then the 1.2 MB of layers in two buckets: a bucket is closed by
    # the tensor that takes it past 1 MB.
    assert [len(b) for b in buckets][:1] == [1] and len(buckets) == 3
    assert all(sum(t.numel() * t.element_size() for _, t in b[:-1]) < 1 << 20 for b in buckets)
    for r in ranks[1:]:
        assert r["weight_buckets"] == [None] * len(buckets)


def test_rank_0_sends_the_trained_weights_straight_to_every_engine(
    layout_run: tuple[list[dict], list],
) -> None:
    """The Megatron sync path: every rank gathers, rank 0 alone drives both engines over
    HTTP (one init, then start / a bucket per call / finish for each sync), and each engine
    reads the trained weights, bit for bit, in buckets of whole layers."""
    ranks, engines = layout_run
    after = ranks[0]["weights_after"]
    assert ranks[0]["sender"]["rank"] == 0 and [r["sender"] for r in ranks[1:]] == [None]
    buckets, nbytes = ranks[0]["sent"][0]
    assert ranks[0]["sent"] == [(buckets, nbytes)] * 2 and [r["sent"] for r in ranks[1:]] == [
        [None, None]
    ]
    one_sync = ["start_weight_update"] + ["update_weights"] * buckets + ["finish_weight_update"]
    for engine in engines:
        assert engine.calls == ["init_weight_transfer_engine"] + one_sync * 2
        assert set(engine.received) == set(after)
        for name, tensor in after.items():
            assert torch.equal(engine.received[name], tensor), name
        # A bucket holds whole layers: embedding alone (25 MB), then each decoder layer and the
        # final norm.
        first = engine.buckets[: len(engine.buckets) // 2]
        layers = [
            {n.split(".")[2] for n in bucket if n.startswith("model.layers.")} for bucket in first
        ]
        assert first[0] == ["model.embed_tokens.weight"] and all(len(s) <= 1 for s in layers)
    assert nbytes == sum(
        -(-t.numel() * 4 // 64) * 64 for t in after.values()
    )  # float32, each tensor 64-byte aligned
    assert not ranks[0]["shared_file_left"]
