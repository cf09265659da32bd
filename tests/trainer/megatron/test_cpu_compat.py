"""The CPU compatibility module is still needed: megatron-core's own code fails these on a CPU
torch without it (the CUDA RNG tracker and the generator state that activation recomputation
saves assert CUDA; grad clipping asserts CUDA gradients).
When one of these starts passing, upstream fixed that call site: drop the matching patch."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("megatron.core")

CHECKS = {
    "patch 4, RNG tracker": (
        "from megatron.core.tensor_parallel.random import CudaRNGStatesTracker\n"
        "CudaRNGStatesTracker().add('x', 1)"
    ),
    "patch 7, recomputation's RNG state": (
        "from megatron.core.tensor_parallel.random import _get_cuda_rng_state\n"
        "_get_cuda_rng_state()"
    ),
    "patch 6, grad clipping": (
        "import torch\n"
        "from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32\n"
        "p = torch.nn.Parameter(torch.ones(2)); p.grad = torch.ones(2)\n"
        "clip_grad_by_total_norm_fp32([p], 1.0, 10.0)"
    ),
}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_megatron_still_assumes_cuda_here(name: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", CHECKS[name]], capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0, f"{name}: megatron-core no longer needs it on a CPU"
    assert "AssertionError" in result.stderr.splitlines()[-1], result.stderr[-2000:]
