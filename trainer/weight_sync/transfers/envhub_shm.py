"""``envhub_shm``: one shared-memory file on the engines' host (any CPU or GPU machine).

The bytes go through a file in ``/dev/shm`` that the trainer writes a bucket at a time and each
vLLM worker maps and loads (see :mod:`envhub.trainer.weight_sync.shm_backend`, the vLLM side
that vLLM loads as a plugin). The sender must share the engines' host.
"""

from __future__ import annotations

from typing import Any

from envhub.trainer.weight_sync.plan import SenderSide, Transfer


def trainer_init_info(side: SenderSide) -> Any:
    """The trainer side: the bucket size (the shared file's place is chosen on first send)."""
    from envhub.trainer.weight_sync.shm_backend import ShmTrainerInitInfo

    return ShmTrainerInitInfo(rank=side.rank, bucket_bytes=side.bucket_bytes)


TRANSFER = Transfer(
    name="envhub_shm",
    needs_gpu=False,
    engines_on_driver_host=True,
    driver_device=None,
    trainer_init_info=trainer_init_info,
)
