"""Ray itself: importing it with an install hint, joining or starting a cluster, and reading
what went wrong from the errors it raises."""

from __future__ import annotations

import os
import re
from typing import Any

from envhub.errors import MissingDependencyError


def import_ray() -> Any:
    """The ``ray`` module, or an error naming the extra that installs it."""
    try:
        import ray
    except ImportError as e:
        raise MissingDependencyError.for_extra("ray", "megatron") from e
    return ray


def init_ray(address: str | None = None, *, num_cpus: int = 0, num_gpus: int | None = None) -> bool:
    """Connect to the Ray cluster at ``address``, or start a local one.

    A local cluster gets at least ``num_cpus`` logical CPUs (the machine's count if larger) and
    ``num_gpus`` GPUs (None: those Ray finds). Nothing happens if this process already
    initialised Ray.

    A local cluster's CPUs are scheduling units: parts that take turns on the same cores (the
    trainer ranks, a vLLM engine, rollout workers) each reserve one, so a run asks for what its
    parts need rather than for what the machine has. Its workers run at the driver's priority
    (:data:`LOCAL_SYSTEM_CONFIG`).

    Returns:
        True when this call initialised Ray (the caller then shuts it down).
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    if address is not None:
        ray.init(address=address, log_to_driver=True)
    else:
        cpus = max(num_cpus, os.cpu_count() or 1)
        ray.init(
            num_cpus=cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            log_to_driver=True,
            _system_config=LOCAL_SYSTEM_CONFIG,
        )
    return True


LOCAL_SYSTEM_CONFIG = {"worker_niceness": 0}
"""Settings of a local cluster that envhub starts for one run. Ray starts its workers at nice
15 so that its own daemons stay responsive on a busy node; in a run's local cluster the workers
(trainer ranks, vLLM engines, rollout workers) are the run itself. At nice 15 they yielded to
every other process on a shared machine: with two busy loops on 2 cores the Megatron e2e test
ran past 15 minutes, where it takes under 3 idle."""


def node_ip() -> str:
    """This process's node address, as Ray names nodes."""
    return import_ray().util.get_node_ip_address()


def death_cause(err: Exception) -> str:
    """The useful part of Ray's actor-death message (the full text stays chained)."""
    text = str(getattr(err, "error_msg", None) or err)
    pattern = r"Worker exit type: (\S+) Worker exit detail: (.*?)(?: Some common causes|$)"
    found = re.search(pattern, text, re.S)
    if found:
        return f"{found.group(1)}: {found.group(2).strip()}"
    return text.strip().splitlines()[0] if text.strip() else type(err).__name__


def describe_failure(err: Exception) -> str:
    """What went wrong in an actor, from the Ray error that reported it."""
    ray = import_ray()
    if isinstance(err, ray.exceptions.RayActorError):
        return f"died ({death_cause(err)})"
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException) and not isinstance(cause, ray.exceptions.RayError):
        return f"{type(cause).__name__}: {cause}"
    first = (str(cause or err).strip().splitlines() or [""])[0]
    if "No module named" in first:
        first += (
            "; Ray's workers cannot import the worker class: install its package on every node, "
            "or call ray.cloudpickle.register_pickle_by_value(its module) before starting the group"
        )
    return f"{type(cause or err).__name__}: {first}"
