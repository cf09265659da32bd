"""A vLLM plugin that lets vLLM's processes go idle sooner after a request, on small CPU machines.

vLLM's worker waits for the next step on a shared-memory queue by spinning (``sched_yield`` in a
loop) for one second after each read before it sleeps on a socket. On a machine whose few cores
vLLM shares with the trainer, that second is taken from the trainer's update after every
rollout: measured on 2 cores, the worker burnt ~1.8 CPU-seconds at the start of each update.
``envhub`` sets ``ENVHUB_VLLM_BUSY_LOOP_S`` for the vLLM servers it starts on small CPU machines
(:func:`envhub.inference.vllm_server.cpu_defaults`); this plugin (``vllm.general_plugins``
entry point, loaded in each vLLM process) makes it the spin's default length. Unset, vLLM is
left as it is.
"""

from __future__ import annotations

import logging
import os

ENV = "ENVHUB_VLLM_BUSY_LOOP_S"
"""Seconds vLLM's queue readers spin after a read before they sleep (vLLM's default: 1)."""

log = logging.getLogger(__name__)


def register() -> None:
    """The ``vllm.general_plugins`` hook: apply ``ENVHUB_VLLM_BUSY_LOOP_S`` when it is set."""
    value = os.environ.get(ENV)
    if not value:
        return
    try:
        seconds = float(value)
    except ValueError:
        log.warning("%s=%r is not a number of seconds; vLLM's default is kept", ENV, value)
        return
    from vllm.distributed.device_communicators import shm_broadcast

    init = getattr(getattr(shm_broadcast, "SpinCondition", None), "__init__", None)
    defaults = getattr(init, "__defaults__", None)
    if not (isinstance(defaults, tuple) and len(defaults) == 1):
        log.warning("this vLLM has no SpinCondition(busy_loop_s=...); %s is ignored", ENV)
        return
    init.__defaults__ = (seconds,)
