"""``nccl``: vLLM's NCCL transfer, from the sender's GPU to engines on other GPUs and nodes.

One NCCL group joins the sender (rank 0) and every engine's workers: engine ``i``'s workers take
the ranks after those of engines ``0..i-1`` (:func:`rank_offsets`). The group's rendezvous
listens on the sender's node, at a port free there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from envhub.trainer.weight_sync.plan import SenderSide, Transfer


def trainer_init_info(side: SenderSide) -> Any:
    """Rank 0 opens the rendezvous; the other trainer ranks only gather, and get no group."""
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    if side.rank == 0:
        from envhub.defaults import free_port

        group = {
            "master_address": side.address,
            "master_port": free_port(side.address),
            "world_size": 1 + sum(side.engine_world_sizes()),
        }
    else:
        group = {"master_address": "", "master_port": 0, "world_size": 0}
    return NCCLTrainerInitInfo(
        rank=side.rank, packed=True, packed_buffer_size_bytes=side.bucket_bytes, **group
    )


def engine_init_infos(
    init_info: dict[str, Any], world_sizes: Callable[[], list[int]]
) -> list[dict[str, Any]] | None:
    """Each engine's copy of the trainer's init info, with its own first rank in the group."""
    if "rank_offset" not in init_info:
        return None
    offsets = rank_offsets(int(init_info["rank_offset"]), world_sizes())
    return [{**init_info, "rank_offset": offset} for offset in offsets]


def rank_offsets(first: int, world_sizes: list[int]) -> list[int]:
    """Each engine's first rank in one group whose engines' workers follow each other from
    rank ``first`` (the trainer's ranks come before)."""
    offsets, offset = [], first
    for size in world_sizes:
        offsets.append(offset)
        offset += size
    return offsets


TRANSFER = Transfer(
    name="nccl",
    needs_gpu=True,
    engines_on_driver_host=False,
    driver_device="cuda",
    trainer_init_info=trainer_init_info,
    engine_init_infos=engine_init_infos,
)
