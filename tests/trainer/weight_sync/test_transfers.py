"""The transfers envhub knows, found by their module names, and where each one can send from."""

from __future__ import annotations

import subprocess
import sys

import pytest

from envhub.errors import ConfigError
from envhub.trainer.weight_sync import TransferPlan, transfers
from envhub.trainer.weight_sync.ranks import relay_reason
from envhub.trainer.weight_sync.transfers.nccl import rank_offsets


def test_the_transfers_are_the_modules_of_the_package() -> None:
    assert transfers.names() == ["envhub_shm", "ipc", "nccl"]
    assert [transfers.get(name).name for name in transfers.names()] == ["envhub_shm", "ipc", "nccl"]
    assert [transfers.get(name).needs_gpu for name in transfers.names()] == [False, True, True]
    assert transfers.get("ipc").server_env == {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}


def test_an_unknown_transfer_names_the_nearest_and_the_others() -> None:
    with pytest.raises(
        ConfigError,
        match=(
            r"^unknown weight transfer 'ncl' \(did you mean 'nccl'\?\); "
            r"available: auto, envhub_shm, ipc, nccl$"
        ),
    ):
        transfers.get("ncl")


def test_choosing_a_transfer_loads_neither_torch_nor_vllm() -> None:
    probe = (
        "import sys; from envhub.trainer.weight_sync import transfers; "
        "print(transfers.choose('nccl', on_gpu=True, shares_gpu=False), "
        "[transfers.get(n).name for n in transfers.names()], "
        "[m for m in ('torch', 'vllm') if m in sys.modules])"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "nccl ['envhub_shm', 'ipc', 'nccl'] []"


def test_nccl_gives_each_engine_the_ranks_after_the_previous_ones() -> None:
    assert rank_offsets(1, [2, 3, 1]) == [1, 3, 6]
    nccl = transfers.get("nccl")
    assert nccl.engine_init_infos({"rank_offset": 1, "world_size": 6}, lambda: [2, 3]) == [
        {"rank_offset": 1, "world_size": 6}, {"rank_offset": 3, "world_size": 6},
    ]  # fmt: skip
    assert (
        nccl.engine_init_infos({"world_size": 0}, lambda: [2, 3]) is None
    )  # no ranks: the same for all


@pytest.mark.parametrize(
    ("transfer", "urls", "rank0", "why"),
    [
        (
            "nccl",
            ["http://10.0.0.3:8000"],
            "10.0.0.2",
            None,
        ),  # NCCL to an engine on Ray: from any node
        ("envhub_shm", ["http://127.0.0.1:8000"], "10.0.0.1", None),  # all on the driver's node
        ("ipc", ["http://10.0.0.1:8000"], "10.0.0.1", None),
        ("nccl", [], "10.0.0.1", "the engine runs inside the driver's process"),
        (
            "nccl",
            ["http://127.0.0.1:8000"],
            "10.0.0.2",
            "the vLLM server listens on the driver's loopback address "
            "and rank 0 is on node 10.0.0.2",
        ),
        (
            "envhub_shm",
            ["http://10.0.0.1:8000"],
            "10.0.0.2",
            "envhub_shm shares memory on the engines' node (10.0.0.1) "
            "and rank 0 is on node 10.0.0.2",
        ),
    ],
)
def test_rank_0_sends_itself_unless_it_cannot_reach_the_engines(
    transfer: str, urls: list[str], rank0: str, why: str | None
) -> None:
    plan = TransferPlan(transfer, bucket_bytes=1 << 20, dtype="bfloat16", urls=tuple(urls))
    assert relay_reason(plan, rank0, driver_node="10.0.0.1") == why
