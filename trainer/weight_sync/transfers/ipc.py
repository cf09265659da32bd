"""``ipc``: vLLM's CUDA IPC transfer, to an engine on the trainer's GPU (colocated).

The trainer packs each bucket on its GPU and hands vLLM the buffer's IPC handle. Over HTTP
those handles are pickled (as vLLM's own HTTP client does), so a server started for it must
allow that; the trainer is its only client, on a trusted address. The engine shares the
sender's GPU because it is placed there (in process, or colocated in trainer rank 0's bundle).
"""

from __future__ import annotations

from typing import Any

from envhub.trainer.weight_sync.plan import SenderSide, Transfer


def trainer_init_info(side: SenderSide) -> Any:
    """Packed buckets of ``bucket_bytes`` on the GPU."""
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

    return IPCTrainerInitInfo(
        rank=side.rank, packed=True, packed_buffer_size_bytes=side.bucket_bytes
    )


TRANSFER = Transfer(
    name="ipc",
    needs_gpu=True,
    engines_on_driver_host=False,
    driver_device="cuda",
    trainer_init_info=trainer_init_info,
    server_env={"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"},
)
