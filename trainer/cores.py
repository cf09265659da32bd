"""Which CPU cores vLLM's engine and the trainer use when they share a machine's cores.

A synchronous run (``rollout.max_staleness: 0``) takes turns: vLLM generates on every core, then
torch updates on every core, so nothing changes for it. An asynchronous run overlaps the two,
and when both still assume the whole machine their threads fight over it: measured on 2 cores,
the update slowed by more than the generation's own CPU time. There :func:`choose_split` gives
each side its own cores: vLLM's compute threads are bound to the last ``engine`` cores
(``VLLM_CPU_OMP_THREADS_BIND``, fixed when vLLM starts), torch updates with the rest (its
thread count), and rollout workers run on the engine's side. During the update, whenever vLLM
has no request to work on (the rollout is done, or its episodes wait on tools), torch takes
every core (:class:`ThreadBalancer`).

The split comes from the machine (``os.sched_getaffinity``) and, where a resumed run's earlier
synchronous steps measured them, the phase times (:class:`PhaseTimes`): the rollout's wall
time, the update's, and the generation's CPU time. The same times bound what overlapping can
gain (:func:`overlap_gain`, :func:`overlap_bound`), and the run's header says when that is too
little to pay (:func:`async_advice`). GPU placements, external servers, Ray-placed engines and the
Megatron backend are left as they are.

Light on purpose: no torch, no vLLM (the CLI and the config import it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
"""vLLM's CPU build binds one compute thread to each core this lists (comma-separated)."""

MIN_GAIN = 1.05
"""Below this best case of the async/sync speed-up, the header recommends
``max_staleness: 0`` (measured async runs fell short of it: a smaller gain is lost)."""


def machine_cores() -> tuple[int, ...]:
    """The cores this process may run on (its affinity), else ``0..cpu_count-1``."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class PhaseTimes:
    """One synchronous step's phases, in seconds (means over the steps measured).

    Attributes:
        rollout: Wall time of the rollout (the trainer's wait for its groups).
        update: Wall time of the trainer's work after it: update, logprobs, values, critic.
        sync: Wall time of the weight sync.
        generation_cpu: CPU time the engine's processes spent, in core-seconds.
    """

    rollout: float
    update: float
    sync: float
    generation_cpu: float

    def generation(self, cores: int) -> float:
        """The generation's CPU time in machine-seconds: what it takes from ``cores`` cores
        that it would keep busy together (the note's ``G``)."""
        return self.generation_cpu / max(cores, 1)

    def work(self, cores: int) -> float:
        """All the CPU work of a step in machine-seconds (the note's ``W``): update + sync +
        generation. An overlapped step cannot take less."""
        return self.update + self.sync + self.generation(cores)

    @classmethod
    def from_history(cls, rows: Iterable[Mapping[str, Any]]) -> PhaseTimes | None:
        """Means over the synchronous steps among ``rows`` (metric rows as ``metrics.jsonl``
        holds them) that measured the engine's CPU time; None when there is none."""
        sync_rows = [
            r
            for r in rows
            if "engine/cpu_s" in r and "time/rollout" in r and "async/staleness_mean" not in r
        ]
        if not sync_rows:
            return None

        def mean(*keys: str) -> float:
            return sum(sum(r.get(k, 0.0) for k in keys) for r in sync_rows) / len(sync_rows)

        return cls(
            rollout=mean("time/rollout"),
            update=mean("time/logprobs", "time/update", "time/values", "time/critic"),
            sync=mean("time/sync"),
            generation_cpu=mean("engine/cpu_s"),
        )


def overlap_bound(phases: PhaseTimes, cores: int) -> float:
    """At most how much faster an overlapped (async) step is than the synchronous one, when
    the engine and the trainer share ``cores`` cores: ``2 - G/W``. A step takes at least the
    rollout's wall time ``R`` and at least all the CPU work ``W``, so the gain is at most
    ``(R + update + sync) / max(R, W)``, which is largest, ``2 - G/W``, when ``R = W``."""
    work = phases.work(cores)
    return 2.0 - phases.generation(cores) / work if work > 0 else 1.0


def overlap_gain(phases: PhaseTimes, cores: int) -> float:
    """The gain perfect overlap gives these phases: ``(R + update + sync) / max(R, W)``
    (at most :func:`overlap_bound`)."""
    longest = max(phases.rollout, phases.work(cores))
    return (phases.rollout + phases.update + phases.sync) / longest if longest > 0 else 1.0


def split_step(phases: PhaseTimes, cores: int, engine: int) -> float:
    """The predicted wall time of an overlapped step with ``engine`` of ``cores`` cores for
    vLLM and the rest for the trainer: the longer of the rollout (its generation slowed to
    ``engine`` cores, what it waits on unchanged) and the update and sync (on the rest).
    Assumes both sides scale linearly with cores, which flatters neither."""
    trainer = cores - engine
    generation = phases.generation(cores)
    rollout = phases.rollout - generation + generation * cores / engine
    return max(rollout, (phases.update + phases.sync) * cores / trainer)


def engine_share(cores: int, phases: PhaseTimes | None = None) -> int:
    """How many of ``cores`` cores vLLM's engine gets in an async run: the count whose
    predicted step (:func:`split_step`) is shortest when phases were measured (ties: fewer),
    else half, rounded down; at least one, and one left for the trainer."""
    if cores < 2:
        return cores
    if phases is None:
        return max(1, cores // 2)
    return min(range(1, cores), key=lambda e: (split_step(phases, cores, e), e))


@dataclass(frozen=True)
class CoreSplit:
    """How the engine and the trainer share this machine's cores (see the module docstring).

    Attributes:
        cores: The cores this process may use.
        engine: Cores vLLM's compute threads bind to; None keeps the engine's default
            (``envhub.inference.vllm_server.cpu_defaults``).
        trainer_threads: torch's threads for the update while the engine works; None leaves
            them as they are (``backend.threads``, or torch's choice).
        idle_threads: torch's threads for the update while the engine idles (every core,
            unless ``backend.threads`` fixed them).
        mode: ``sync`` (nothing changes), ``async`` (a split), ``shared`` (async, but one core
            or a binding the user set), or ``placed`` (GPU, Ray or an external server: not ours).
        source: Where the engine's share came from, for the header.
    """

    cores: tuple[int, ...]
    engine: tuple[int, ...] | None = None
    trainer_threads: int | None = None
    idle_threads: int | None = None
    mode: str = "sync"
    source: str = ""

    @property
    def splits(self) -> bool:
        """Whether this split changes anything (the engine's binding or torch's threads)."""
        return self.engine is not None or self.trainer_threads is not None

    def engine_env(self) -> dict[str, str]:
        """The environment that binds vLLM's compute threads (empty: the engine's default)."""
        return {BIND_ENV: ",".join(map(str, self.engine))} if self.engine is not None else {}

    def update_threads(self, engine_busy: bool) -> int | None:
        """torch's threads for what the update runs next: the trainer's share while the
        engine works, every core while it idles, None when unchanged."""
        if self.trainer_threads is None:
            return None
        return self.trainer_threads if engine_busy else (self.idle_threads or len(self.cores))

    def describe(self) -> str | None:
        """The run header's line, or None where nothing was chosen (GPU and other placements,
        synchronous runs left as they were)."""
        n = len(self.cores)
        if self.mode == "async":
            engine = len(self.engine or ())
            trainer = self.trainer_threads or n - engine
            idle = self.idle_threads or n
            more = f"; the trainer takes {idle} while the engine idles" if idle != trainer else ""
            return f"engine {engine} / trainer {trainer} (async, {n} cores; {self.source}{more})"
        if self.mode == "shared":
            return f"engine and trainer share {n} core{'s' * (n != 1)} (async; {self.source})"
        if self.mode == "sync" and self.splits:
            engine = len(self.engine or ())
            return f"engine {engine} / trainer {self.trainer_threads or n} (sync, {n} cores)"
        return None


def _shares_cores(config: Any, on_gpu: bool) -> bool:
    """Whether this run's vLLM engine and torch trainer run on this machine's CPU cores."""
    v = config.rollout.vllm
    return (
        config.rollout.engine == "vllm"
        and not on_gpu
        and config.backend.kind == "torch"
        and v.mode in ("server", "inprocess")
        and v.url is None
        and v.tensor_parallel == 1
    )


def choose_split(
    config: Any,
    *,
    on_gpu: bool,
    cores: Sequence[int] | None = None,
    phases: PhaseTimes | None = None,
    environ: Mapping[str, str] | None = None,
) -> CoreSplit:
    """The core split for a run of ``config`` (a ``TrainConfig``): ``on_gpu`` when the
    trainer's device is a GPU; ``cores`` (default: this process's), ``phases`` measured by
    earlier synchronous steps if any, ``environ`` (default: this process's; a
    ``VLLM_CPU_OMP_THREADS_BIND`` there is the user's and wins).

    ``rollout.vllm.cpu_cores`` sets the engine's share (0: no split), ``backend.threads``
    torch's; both apply to synchronous runs too. ``auto`` (the default for an asynchronous run)
    gives it :func:`engine_share` of the cores; a synchronous run without them keeps every
    core for each side.
    """
    cores = tuple(cores) if cores is not None else machine_cores()
    environ = os.environ if environ is None else environ
    if not _shares_cores(config, on_gpu):
        return CoreSplit(cores, mode="placed")
    n, asked = len(cores), config.rollout.vllm.cpu_cores
    is_async = config.rollout.max_staleness > 0
    if (asked is None or asked == "auto") and not is_async:
        return CoreSplit(cores)
    if asked is None:  # measured to win on shared cores (docs/guides/async.md): the default
        asked = "auto"
    if BIND_ENV in environ:
        return CoreSplit(cores, mode="shared", source=f"{BIND_ENV} is set, left as it is")
    if n < 2 or asked == 0:
        source = "one core, nothing to split" if n < 2 else "rollout.vllm.cpu_cores=0"
        return CoreSplit(cores, mode="shared" if is_async else "sync", source=source)
    if asked != "auto":
        engine, source = min(asked, n - 1), "rollout.vllm.cpu_cores"
    elif phases is not None:
        engine, source = engine_share(n, phases), "from the earlier steps' phase times"
    else:
        engine, source = engine_share(n), "from the machine, fixed before vLLM starts"
    fixed = config.backend.threads
    return CoreSplit(
        cores, cores[n - engine :], fixed or n - engine, fixed or n,
        "async" if is_async else "sync", source,
    )  # fmt: skip


def async_advice(config: Any, split: CoreSplit, phases: PhaseTimes | None) -> str | None:
    """What the header says when an async run on shared cores cannot gain: one core, or
    measured phases that perfect overlap speeds up by less than :data:`MIN_GAIN`
    (:func:`overlap_gain`; a rollout that is all generation on every core gains nothing,
    whatever ``2 - G/W`` says); None otherwise."""
    if config.rollout.max_staleness == 0 or split.mode not in ("async", "shared"):
        return None
    n = len(split.cores)
    if n < 2:
        return (
            "async cannot gain here: vLLM and the trainer share one core, so overlapping "
            "them saves nothing; set rollout.max_staleness: 0"
        )
    if phases is None:
        return None
    gain = overlap_gain(phases, n)
    if gain >= MIN_GAIN:
        return None
    p = phases
    return (
        f"async cannot gain here: the earlier synchronous steps took R = {p.rollout:.1f} s to "
        f"roll out, {p.generation(n):.1f} s of it generation on all {n} cores, and "
        f"W = {p.work(n):.1f} s of CPU work (update {p.update:.1f} + sync {p.sync:.1f} + "
        f"generation), so overlapping them is at most (R + update + sync) / max(R, W) = "
        f"{gain:.2f}x faster; set rollout.max_staleness: 0"
    )


def phases_of_run(run_dir: Path) -> PhaseTimes | None:
    """The phases measured by the synchronous steps already in ``run_dir/metrics.jsonl`` (a
    resumed run's), or None."""
    import json

    path = run_dir / "metrics.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a torn last line: the rest still counts
    return PhaseTimes.from_history(r for r in rows if r.get("step", 0) > 0)


def process_group_cpu_seconds(group: int) -> float | None:
    """CPU time (user + system, seconds) of the live processes in process group ``group``
    (a vLLM server and its engine processes: the server leads its own group), from
    ``/proc``; None where ``/proc`` cannot tell (not Linux)."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()  # after the command's name
        if int(fields[2]) == group:  # pgrp
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


class ThreadBalancer:
    """Sets torch's threads in the update's thread from whether the engine works now, so the
    trainer takes the engine's cores as soon as it idles (the rollout is done, or its episodes
    wait on tools), not at the next update.

    It looks at the update's start and then whenever autograd saves a tensor (the forward
    pass) or takes one back (the backward pass), through ``saved_tensors_hooks``, which run in
    the update's own thread (torch keeps the thread count per thread) a few hundred times per
    micro-batch; and sets the count back after, for the pool's thread may later run updates
    of a run without a split.

    Args:
        split: The run's core split (its :meth:`CoreSplit.update_threads`).
        engine_busy: Whether the engine works now (read from the update's thread).
    """

    def __init__(self, split: CoreSplit, engine_busy: Callable[[], bool]) -> None:
        self.split = split
        self.engine_busy = engine_busy
        self.checks = 0
        self.thread_sum = 0
        """torch's threads summed over the checks (``metrics``: their mean)."""

    def __call__(self) -> None:
        """Set torch's threads for what runs next."""
        threads = self.split.update_threads(self.engine_busy())
        if threads is None:
            return
        import torch

        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        self.checks += 1
        self.thread_sum += threads

    def _look(self, tensor: Any) -> Any:
        self()
        return tensor

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` (the update, in this thread) with the threads balanced; set back
        after."""
        if self.split.trainer_threads is None:
            return fn(*args)
        import torch

        before = torch.get_num_threads()
        try:
            self()
            with torch.autograd.graph.saved_tensors_hooks(self._look, self._look):
                return fn(*args)
        finally:
            torch.set_num_threads(before)

    def metrics(self) -> dict[str, float]:
        """``cores/trainer_threads``: torch's mean threads over the update's checks."""
        if not self.checks:
            return {}
        return {"cores/trainer_threads": self.thread_sum / self.checks}


def limit_interop_threads(split: CoreSplit) -> bool:
    """Cap torch's inter-op pool at the trainer's share, where the split sets one. torch
    allows it only before its first inter-op work (a later call raises): then the pool stays
    as it is. Returns whether it was set."""
    if split.trainer_threads is None:
        return False
    import torch

    try:
        torch.set_num_interop_threads(split.trainer_threads)
    except RuntimeError:
        return False
    return True
