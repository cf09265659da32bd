"""Fixtures of the sandbox tests: one local sandbox per module (its uid pool is process-wide),
and a check that no run left a process behind."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from envhub.sandbox import Limits, LocalSandbox, bwrap_problem
from envhub.sandbox._process import uid_processes

BASE_UID = 61000

requires_bwrap = pytest.mark.skipif(
    bwrap_problem() is not None, reason=f"no bubblewrap here: {bwrap_problem()}"
)


def live_sandbox_processes(uids: LocalSandbox | Sequence[int]) -> list[int]:
    """Live processes of any uid of a sandbox's pool."""
    pool = uids.uids.uids if isinstance(uids, LocalSandbox) else uids
    return [pid for uid in pool for pid in uid_processes(uid, live=True)]


@pytest.fixture(scope="module")
def sandbox() -> Iterator[LocalSandbox]:
    if bwrap_problem() is not None:
        pytest.skip(f"no bubblewrap here: {bwrap_problem()}")
    with LocalSandbox(
        Limits(wall_time=5, processes=16), base_uid=BASE_UID, max_concurrency=8
    ) as box:
        yield box
