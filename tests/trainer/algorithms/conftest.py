"""``device``: run a test on the CPU, and also on CUDA when a GPU is present (marked ``gpu``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

_CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    ],
)


@pytest.fixture(params=["cpu", _CUDA])
def device(request: pytest.FixtureRequest) -> str:
    return request.param


def close(actual: torch.Tensor, expected: list, atol: float = 1e-6) -> None:
    """``actual`` equals the nested list ``expected`` within ``atol`` (NaN never matches)."""
    want = torch.tensor(expected, dtype=actual.dtype, device=actual.device)
    torch.testing.assert_close(actual.detach(), want, atol=atol, rtol=0)


@pytest.fixture
def assert_close():
    """:func:`close`, as a fixture (test modules are not importable in importlib mode)."""
    return close
