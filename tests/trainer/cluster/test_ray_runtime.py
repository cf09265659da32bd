"""The local Ray cluster envhub starts for a run (trainer/cluster/ray_runtime.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_PROBE = """
import json, os
import ray
from envhub.trainer.cluster.ray_runtime import init_ray

assert init_ray(num_cpus=1)
niceness = ray.get(ray.remote(lambda: os.getpriority(os.PRIO_PROCESS, 0)).remote())
ray.shutdown()
print(json.dumps({"driver": os.getpriority(os.PRIO_PROCESS, 0), "worker": niceness}))
"""


def test_a_local_clusters_workers_run_at_the_drivers_priority() -> None:
    # Ray's default (nice 15) left a run's ranks and engines starved on a shared machine.
    env = {k: v for k, v in os.environ.items() if k != "RAY_worker_niceness"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["worker"] == seen["driver"]
