"""vLLM started by envhub on a small machine stops spinning soon after a request
(``envhub.inference.vllm_idle``): its processes' CPU time over the next 1.5 s stays near zero,
where vLLM's own 1-second spin takes about a core-second."""

from __future__ import annotations

import os
import time

import httpx
import psutil
import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.model]


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:  # it ended meanwhile
            continue
        total += times.user + times.system
    return total


@pytest.mark.skipif(len(os.sched_getaffinity(0)) > 8, reason="the setting is for small machines")
def test_vllm_goes_idle_right_after_a_request(vllm_server):
    response = httpx.post(
        f"{vllm_server.base_url}/v1/completions",
        json={"model": "smollm2", "prompt": "One, two,", "max_tokens": 8},
        timeout=120,
    )
    response.raise_for_status()
    server = psutil.Process(vllm_server.process.pid)
    processes = [server, *server.children(recursive=True)]
    before = _cpu_seconds(processes)
    time.sleep(1.5)

    assert _cpu_seconds(processes) - before < 0.3
