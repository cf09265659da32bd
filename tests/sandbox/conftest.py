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
    """Live processes of any uid of a sandbox's pool but those of warm sandboxes (started
    ahead, running no call's code; the pool is shared by sandboxes with the same range)."""
    if isinstance(uids, LocalSandbox):
        pool = [uid for uid in uids.uids.uids if uid not in uids.uids.warm]
    else:
        pool = list(uids)
    return [pid for uid in pool for pid in uid_processes(uid, live=True)]


@pytest.fixture(
    scope="module", params=[(0, False), (2, False), (2, True)], ids=["cold", "warm", "zygote"]
)
def sandbox(request: pytest.FixtureRequest) -> Iterator[LocalSandbox]:
    """The module's sandbox: every run started cold; Python runs taking sandboxes started
    ahead (the second and later of each kind) with their own interpreter; and (as root) Python
    runs forked from a zygote into their sandboxes (:mod:`envhub.sandbox.zygote`)."""
    if bwrap_problem() is not None:
        pytest.skip(f"no bubblewrap here: {bwrap_problem()}")
    warm, zygote = request.param
    with LocalSandbox(
        Limits(wall_time=5, processes=16),
        base_uid=BASE_UID,
        max_concurrency=8,
        warm=warm,
        zygote=zygote,
    ) as box:
        if zygote and not box.zygote:
            pytest.skip("zygotes serve runs only when envhub runs as root")
        yield box
