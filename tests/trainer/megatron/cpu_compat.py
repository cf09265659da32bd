"""Test-only: lets megatron-core 0.16 and 0.19 train on a CPU torch over gloo.

megatron-core assumes CUDA in a few places that do not matter to the maths: buffers created
on ``torch.cuda.current_device()`` or ``device="cuda"``, ``.cuda()`` moves, CUDA streams, the
CUDA RNG tracker and the CUDA generator state that activation recomputation saves. Each patch
below redirects one of those to the CPU. Nothing here changes a computation, so a CPU run checks
the same code paths a GPU run takes (minus Transformer Engine and fused kernels, which stay
GPU-only tests).

Load it in every trainer process before Megatron builds anything: the tests point
``ENVHUB_MEGATRON_WORKER_SETUP`` at this file. ``apply()`` is idempotent and refuses other
megatron-core versions (the patched call sites were read in 0.16.1 and again in 0.19.2, where
every one of them is still needed);
``test_cpu_compat.py`` notices when upstream stops needing the main ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

SUPPORTED = ("0.16.", "0.19.")
_applied = False


def _is_cuda(device: Any) -> bool:
    if isinstance(device, int):
        return True  # torch.cuda.current_device() returns an index
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


class CudaToCpu(TorchFunctionMode):
    """Patch 1: a CUDA ``device=`` of any torch call (factories, ``.to``) becomes the CPU."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if (
            getattr(func, "__name__", "") == "to"
            and args
            and _is_cuda(args[1] if len(args) > 1 else None)
        ):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


class _NoStream:
    """Patch 3: ``torch.cuda.Stream`` / ``stream()`` for the overlapped grad reduce."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


def _add_seed(self: Any, name: str, seed: int) -> None:
    """Patch 4: the CUDA RNG tracker records its seeds without a CUDA generator..."""
    if name in self.states_:
        raise Exception(f"cuda rng state {name} already exists")
    self.seeds_.add(seed)
    self.states_[name] = seed


@contextlib.contextmanager
def _no_fork(self: Any, name: str = "") -> Iterator[None]:
    """...and its ``fork`` (dropout regions) runs on the default CPU generator."""
    yield


def _clip_by_total_norm(
    parameters: Any, max_norm: float, total_norm: float, use_decoupled_grad: bool = False
) -> None:
    """Patch 6: megatron's ``clip_grad_by_total_norm_fp32`` (same scaling) without its assert
    that gradients are CUDA tensors."""
    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    coeff = max_norm / (total_norm + 1.0e-6)
    if grads and coeff < 1.0:
        torch._foreach_mul_(grads, coeff)


def _no_cuda_rng_state(*args: Any, **kwargs: Any) -> torch.Tensor:
    """Patch 7: activation recomputation saves and restores the CUDA generator's state around
    each recomputed layer; with no CUDA there is none (the CPU generator's state is saved
    beside it, so recomputed dropout still replays)."""
    return torch.empty(0, dtype=torch.uint8)


_tensor_type = torch.Tensor.type


def _cuda_type_name(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """Patch 8: the distributed optimizer accepts parameters whose ``type()`` names a CUDA
    tensor (``torch.cuda.FloatTensor``); a CPU tensor's name gets the ``cuda.`` it would have
    on a GPU. Only the no-argument call (a type query) changes; conversions do not."""
    name = _tensor_type(self, *args, **kwargs)
    if args or kwargs or not name.startswith("torch.") or name.startswith("torch.cuda."):
        return name
    return "torch.cuda." + name.removeprefix("torch.")


def apply() -> None:
    """Install the patches (once) and enter the device mode for the rest of the process."""
    global _applied
    if _applied:
        return
    import megatron.core
    from megatron.core.optimizer import optimizer as mp_optimizer
    from megatron.core.tensor_parallel import random as mp_random

    version = megatron.core.__version__
    if not version.startswith(SUPPORTED):
        raise RuntimeError(
            f"cpu_compat was written for megatron-core {SUPPORTED}, found {version}: "
            "re-read the patched call sites"
        )
    # Patch 2: as a device argument it means the CPU (also in backward passes, where patch 1's
    # thread-local mode is not active).
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.Stream = _NoStream
    torch.cuda.current_stream = lambda *a, **k: _NoStream()
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()
    torch.cuda.synchronize = lambda *a, **k: None
    torch.Tensor.cuda = lambda self, *a, **k: self  # patch 5: ``.cuda()`` moves stay on the CPU
    torch.nn.Module.cuda = lambda self, *a, **k: self
    torch.Tensor.type = _cuda_type_name
    mp_random.CudaRNGStatesTracker.fork = _no_fork
    mp_random.CudaRNGStatesTracker.add = _add_seed
    mp_optimizer.clip_grad_by_total_norm_fp32 = _clip_by_total_norm
    mp_random._get_cuda_rng_state = _no_cuda_rng_state
    mp_random._set_cuda_rng_state = lambda *a, **k: None
    CudaToCpu().__enter__()
    _applied = True


apply()
