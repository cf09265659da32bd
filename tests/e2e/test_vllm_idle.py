"""vLLM started by envhub on a small machine stops spinning soon after a request
(``envhub.inference.vllm_idle``): its processes' CPU time over the next 1.5 s stays near zero,
where vLLM's own 1-second spin takes about a core-second."""

from __future__ import annotations

import os
import time

import httpx
import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.model]


def _tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


@pytest.mark.skipif(len(os.sched_getaffinity(0)) > 8, reason="the setting is for small machines")
def test_vllm_goes_idle_right_after_a_request(vllm_server):
    response = httpx.post(
        f"{vllm_server.base_url}/v1/completions",
        json={"model": "smollm2", "prompt": "One, two,", "max_tokens": 8},
        timeout=120,
    )
    response.raise_for_status()
    processes = _tree(vllm_server.process.pid)
    before = _cpu_seconds(processes)
    time.sleep(1.5)

    assert _cpu_seconds(processes) - before < 0.3
