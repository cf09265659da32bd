"""Where a step's episodes run when ``rollout.workers`` asks for Ray CPU actors.

By default the producer runs each step's jobs (:class:`~envhub.trainer.rollout_jobs.RolloutJob`)
in the trainer's driver. With ``rollout.workers: N``, :class:`RolloutWorkers` deals the groups
of every job round-robin to N Ray actors (one logical CPU each), so that env code, reward
functions and sandboxes never share a process with the trainer. Each actor runs
:func:`~envhub.trainer.rollout_jobs.run_job` on its share with the job's own seed and gives each
group the id the driver would have given it (its position in the job), so the trajectories are
the same wherever they ran, up to the engine's sampling; the driver puts them back in job, then
task, order.

The actors generate through their own client of the trainer's vLLM server (:class:`VLLMClient`:
HTTP only, no weight sync, no server of their own): the driver keeps the engine, syncs its
weights and checks its health after each rollout, as without workers.

What stays the same: a failure inside an episode is recorded on its trajectory by the runner (a
bad rollout is data, not a crash). What is new: a worker whose process dies (a segfaulting
sandbox, an OOM kill, a lost node) fails the step with
:class:`~envhub.errors.WorkerDiedError` naming the worker and its node, and
any other failure of a worker (it cannot load an env) with
:class:`~envhub.errors.WorkerError`; the loop stops the run and says how to
resume.

Envs reach the workers by name, as ``envhub.make`` finds them: installed packages and Hub
references resolve in each worker; envs registered in the driver with ``envhub.register`` are
registered again in each worker from the same target, which Ray pickles (by reference, so its
module must be importable there, or registered with ``ray.cloudpickle.register_pickle_by_value``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import envhub
from envhub.errors import ConfigError, WorkerDiedError, WorkerError
from envhub.inference.base import InferenceEngine
from envhub.registry import list_envs
from envhub.trainer.cluster.ray_runtime import death_cause, import_ray, init_ray
from envhub.trainer.config import EnvSpec, TrainConfig
from envhub.trainer.engines.base import RolloutEngine
from envhub.trainer.rollout_jobs import RolloutJob, RunnerOptions, run_job
from envhub.types import Trajectory

PROGRESS_S = 0.5
"""How often the driver asks the workers how many episodes they have finished."""


@dataclass(frozen=True)
class VLLMClient:
    """Builds, in a worker, a client of the trainer's running vLLM server: generation over HTTP
    with the trainer's tokenizer and EOS ids; no weight sync, no server of its own."""

    settings: Any
    """The trainer engine's ``EngineSettings``."""
    urls: tuple[str, ...]
    """Each engine's base URL (several with ``rollout.vllm.engines``)."""
    tokenizer: Any
    """The policy's ``transformers`` tokenizer (pickled: no model folder needed on the worker's
    node)."""
    eos_token_ids: tuple[int, ...]

    @classmethod
    def of(cls, engine: Any, max_concurrency: int) -> VLLMClient:
        """A client of the started ``VLLMEngine`` ``engine``, with ``max_concurrency`` requests
        in flight."""
        from envhub.trainer.engines.vllm import server_urls

        urls = server_urls(engine.transport)
        if not urls:
            raise ConfigError(
                f"rollout workers reach vLLM over HTTP, but {engine!r} has no URL: "
                "set rollout.vllm.mode=server"
            )
        settings = replace(engine.settings, max_concurrency=max_concurrency)
        return cls(
            settings, urls, engine.tokenizer.tokenizer, tuple(engine.tokenizer.eos_token_ids)
        )

    def __call__(self) -> RolloutEngine:
        """Build the client in the worker: a ``VLLMEngine`` in server mode at ``urls`` (spread
        over them when there are several), with weight verification off."""
        from transformers import GenerationConfig

        from envhub.trainer.engines.vllm import VLLMEngine

        generation_config = GenerationConfig(eos_token_id=list(self.eos_token_ids))
        transport = None
        if len(self.urls) > 1:
            from envhub.trainer.engines.vllm_replicas import ReplicatedTransport
            from envhub.trainer.engines.vllm_transport import ServerTransport

            transport = ReplicatedTransport(
                [ServerTransport(self.settings, url) for url in self.urls]
            )
        url = self.urls[0] if transport is None else None
        return VLLMEngine(
            self.settings,
            self.tokenizer,
            generation_config=generation_config,
            mode="server",
            url=url,
            transport=transport,
            verify="off",
        )


def merge_stats(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    """The workers' engine counters as one engine's: sums, and ``seconds_per_request`` averaged
    over all requests."""
    merged: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            merged[key] = merged.get(key, 0.0) + value
    if "seconds_per_request" in merged:
        requests = merged.get("requests", 0.0)
        seconds = sum(p.get("seconds_per_request", 0.0) * p.get("requests", 0.0) for p in parts)
        merged["seconds_per_request"] = seconds / requests if requests else 0.0
    return merged


def stats_since(now: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """The counters between two :func:`merge_stats` of running totals: differences, and
    ``seconds_per_request`` averaged over the requests in between."""
    delta = {key: value - before.get(key, 0.0) for key, value in now.items()}
    if "seconds_per_request" in now:
        requests = delta.get("requests", 0.0)
        seconds = _request_seconds(now) - _request_seconds(before)
        delta["seconds_per_request"] = seconds / requests if requests else 0.0
    return delta


def _request_seconds(stats: dict[str, float]) -> float:
    return stats.get("seconds_per_request", 0.0) * stats.get("requests", 0.0)


def _progress(totals: dict[str, float]) -> tuple[float, float]:
    return totals.get("requests", 0.0), totals.get("generated_tokens", 0.0)


@dataclass(frozen=True)
class Part:
    """A worker's groups of one job."""

    job_index: int
    job: RolloutJob
    """The job, with only this part's tasks."""
    positions: list[int]
    """Where those tasks are in the whole job (the numbers of their groups)."""


def deal(jobs: Sequence[RolloutJob], workers: int) -> list[list[Part]]:
    """Each worker's share of ``jobs``. Groups go round-robin across all jobs, so shares differ
    by at most one group."""
    groups = [(j, position) for j, job in enumerate(jobs) for position in range(len(job.tasks))]
    shares = []
    for worker in range(workers):
        mine = groups[worker::workers]
        share = []
        for j in dict.fromkeys(j for j, _ in mine):
            positions = [position for k, position in mine if k == j]
            share.append(
                Part(
                    j, replace(jobs[j], tasks=tuple(jobs[j].tasks[p] for p in positions)), positions
                )
            )
        shares.append(share)
    return shares


class _Worker:
    """Runs in a Ray actor (async: :meth:`progress` answers while :meth:`run` runs)."""

    def __init__(
        self,
        engine_factory: Callable[[], InferenceEngine],
        envs: list[EnvSpec],
        registrations: dict[str, Any],
    ) -> None:
        _pin_to_cores(os.environ.get(CORES_ENV))
        for name, target in registrations.items():
            envhub.register(name, target, override=True)
        self.envs = envs
        self.engine = engine_factory()
        self.done: dict[int, int] = {}
        """Episodes finished by each call in progress."""
        self._counting = False
        """Whether the engine's counters run (from the first call on, never reset: calls
        overlap in asynchronous training)."""

    def where(self) -> dict[str, Any]:
        import ray

        return {"node": ray.util.get_node_ip_address(), "pid": os.getpid()}

    async def run(
        self, share: list[Part], options: RunnerOptions, call: int = 0
    ) -> tuple[list[list[Trajectory]], dict[str, float]]:
        """The trajectories of each part of the share, and the engine's counters since this
        worker's first call.

        ``call`` tells concurrent calls apart (asynchronous training runs several draws at
        once): :meth:`progress` counts each call's episodes on their own.
        """
        self.done[call] = 0
        await self.engine.start()  # once, before the runners (each would start it)
        if isinstance(self.engine, RolloutEngine):
            if not self._counting:
                self.engine.reset_stats()
                self._counting = True
            newest = max(p.job.version for p in share)
            self.engine.weights_version = max(self.engine.weights_version, newest)
        runs = [
            run_job(
                self.engine,
                self._factory(p.job),
                p.job,
                options,
                partial(self._count, call),
                p.positions,
            )
            for p in share
        ]
        try:
            results = list(await asyncio.gather(*runs))
        finally:
            self.done.pop(call, None)
        return results, self.engine.stats() if isinstance(self.engine, RolloutEngine) else {}

    def progress(self, call: int = 0) -> int:
        """Episodes of call ``call`` finished so far."""
        return self.done.get(call, 0)

    async def aclose(self) -> None:
        """Close this worker's engine client."""
        await self.engine.aclose()

    def _count(self, call: int, _: Trajectory) -> None:
        self.done[call] = self.done.get(call, 0) + 1

    def _factory(self, job: RolloutJob) -> Callable[[], Any]:
        spec = self.envs[job.env_index]
        return job.env_factory(spec.name, spec.args)


class RolloutWorkers:
    """``count`` Ray actors that run a step's episodes (see the module docstring).

    Args:
        count: Number of actors, one logical CPU each.
        engine_factory: Builds each actor's inference engine, in the actor (pickled by Ray).
        envs: The run's envs (``config.envs``); jobs name them by index.
        address: A Ray cluster to connect to when Ray is not initialised yet; None starts a
            local one (stopped again by :meth:`aclose`).
        here_only: Place every actor on this process's node (for an engine reachable only
            from here, such as a server on 127.0.0.1).
        cores: With ``here_only``, the cores the actors run on (the engine's side of the
            run's core split, ``trainer/cores.py``); None: wherever the OS puts them.

    Example::

        workers = RolloutWorkers(2, partial(ScriptedEngine, null_policy), config.envs)
        try:
            trajectories = await workers.run(jobs, RunnerOptions.from_config(config.rollout))
        finally:
            await workers.aclose()
    """

    def __init__(
        self,
        count: int,
        engine_factory: Callable[[], InferenceEngine],
        envs: Sequence[EnvSpec],
        *,
        address: str | None = None,
        here_only: bool = False,
        cores: Sequence[int] | None = None,
    ) -> None:
        ray = import_ray()
        self._started_ray = init_ray(address, num_cpus=count)
        self._totals: dict[int, dict[str, float]] = {}
        """Each worker's engine counters since its first call, as of its latest call to end."""
        self._read: dict[str, float] = {}
        """The merged totals at the last :meth:`stats`."""
        self._calls = 0
        """Calls of :meth:`run` so far (each call's progress is counted apart)."""
        self._nodes = ["?"] * count
        strategy = "DEFAULT"
        if here_only:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            strategy = NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=False
            )
        remote = ray.remote(_Worker).options(
            num_cpus=1,
            max_concurrency=8,
            scheduling_strategy=strategy,
            runtime_env={"env_vars": forwarded_env() | _affinity_env(cores if here_only else None)},
        )
        self._actors = [
            remote.remote(engine_factory, list(envs), _registrations(envs)) for _ in range(count)
        ]
        try:
            self.info: list[dict[str, Any]] = [
                self._get(i, actor.where.remote(), "start") for i, actor in enumerate(self._actors)
            ]
            """``{"node", "pid"}`` of each worker."""
        except BaseException:
            self._kill()
            if self._started_ray:
                ray.shutdown()
            raise
        self._nodes = [w["node"] for w in self.info]

    @classmethod
    def for_run(
        cls, config: TrainConfig, engine: Any, cores: Sequence[int] | None = None
    ) -> RolloutWorkers:
        """``rollout.workers`` actors that reach the run's started vLLM engine over HTTP, with
        ``rollout.max_concurrency`` split between them; on this node when the server listens
        on a loopback address, there on ``cores`` when given (the engine's share)."""
        count = config.rollout.workers
        client = VLLMClient.of(engine, max_concurrency=-(-config.rollout.max_concurrency // count))
        loopback = any(
            urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1") for url in client.urls
        )
        return cls(
            count, client, config.envs, address=config.cluster.address, here_only=loopback,
            cores=cores,
        )  # fmt: skip

    async def run(
        self,
        jobs: Sequence[RolloutJob],
        options: RunnerOptions,
        on_progress: Callable[[int], None] | None = None,
    ) -> list[Trajectory]:
        """Run ``jobs`` on the workers, ``options.max_concurrency`` split between them;
        trajectories in job, then task, then sample order, as :func:`run_job` gives them.
        ``on_progress(episodes done)`` is called as the count grows.

        Raises:
            WorkerDiedError: A worker's process died (the others go on until :meth:`close`).
            WorkerError: A worker failed outside its episodes.
        """
        shares = deal(jobs, len(self._actors))
        options = replace(options, max_concurrency=-(-options.max_concurrency // len(self._actors)))
        self._calls += 1
        call = self._calls
        calls = {
            i: asyncio.ensure_future(self._actors[i].run.remote(share, options, call))
            for i, share in enumerate(shares)
            if share
        }
        results = await self._collect(calls, on_progress, call)
        for i, (_, totals) in results.items():
            # overlapping calls may end out of order: the larger totals are the newer
            if _progress(totals) >= _progress(self._totals.get(i, {})):
                self._totals[i] = totals
        n = options.samples_per_task
        slots: list[list[Trajectory]] = [[None] * (len(job.tasks) * n) for job in jobs]  # type: ignore[list-item]
        for i, (per_part, _) in results.items():
            for part, trajectories in zip(shares[i], per_part, strict=True):
                for k, t in enumerate(trajectories):
                    slots[part.job_index][part.positions[k // n] * n + k % n] = t
        return [t for per_job in slots for t in per_job]

    def stats(self) -> dict[str, float]:
        """The workers' engine counters (:func:`merge_stats`) since the last call, as far as
        the calls of :meth:`run` that ended tell: exact in sum, and per step when draws do not
        overlap (a request is counted at the first read after a call on its worker ends)."""
        now = merge_stats(list(self._totals.values()))
        since, self._read = stats_since(now, self._read), now
        return since

    async def aclose(self) -> None:
        """Close each worker's engine client, end the actors, and stop Ray if this started it.
        Idempotent."""
        ray = import_ray()
        if self._actors and ray.is_initialized():
            closing = [actor.aclose.remote() for actor in self._actors]
            await asyncio.to_thread(ray.wait, closing, num_returns=len(closing), timeout=10.0)
        self._kill()
        if self._started_ray:
            self._started_ray = False
            ray.shutdown()

    async def _collect(
        self, calls: dict[int, Any], on_progress: Callable[[int], None] | None, call: int
    ) -> dict[int, Any]:
        """Each call's result by worker; the first failure raises at once."""
        ray = import_ray()
        worker_of = {future: i for i, future in calls.items()}
        results: dict[int, Any] = {}
        pending, reported = set(worker_of), 0
        try:
            while pending:
                done, pending = await asyncio.wait(
                    pending, timeout=PROGRESS_S, return_when=asyncio.FIRST_COMPLETED
                )
                for future in done:
                    try:
                        results[worker_of[future]] = future.result()
                    except ray.exceptions.RayError as err:
                        raise self._error(worker_of[future], "rollout", err) from err
                if on_progress is not None:
                    running = [worker_of[f] for f in pending]
                    count = await self._progress(results, running, call)
                    if count > reported:
                        reported = count
                        on_progress(count)
        finally:
            # After a failure the other results are not needed: cancel what still runs, and
            # retrieve every error (two can finish in one wait) so asyncio does not log it.
            for future in worker_of:
                future.cancel()
                future.add_done_callback(lambda f: f.cancelled() or f.exception())
        return results

    async def _progress(self, results: dict[int, Any], running: list[int], call: int) -> int:
        """Episodes finished: all of the finished shares, and what the running workers report
        (a worker that cannot answer counts 0; its call reports why)."""
        finished = sum(len(t) for per_part, _ in results.values() for t in per_part)
        counts = await asyncio.gather(
            *(self._actors[i].progress.remote(call) for i in running), return_exceptions=True
        )
        return finished + sum(c for c in counts if isinstance(c, int))

    def _get(self, worker: int, ref: Any, what: str) -> Any:
        ray = import_ray()
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as err:
            raise self._error(worker, what, err) from err

    def _error(self, worker: int, what: str, err: Exception) -> WorkerError:
        ray = import_ray()
        node = self._nodes[worker]
        if isinstance(err, ray.exceptions.RayActorError):
            return WorkerDiedError(
                f"rollout worker {worker} on node {node} died: {death_cause(err)}",
                worker=worker,
                node=node,
            )
        cause = getattr(err, "cause", None)
        detail = (
            f"{type(cause).__name__}: {cause}"
            if isinstance(cause, BaseException)
            else str(err).strip().splitlines()[0]
        )
        return WorkerError(
            f"rollout worker {worker} on node {node} failed in {what}: {detail}",
            worker=worker,
            node=node,
        )

    def _kill(self) -> None:
        ray = import_ray()
        if ray.is_initialized():
            for actor in self._actors:
                ray.kill(actor, no_restart=True)
        self._actors = []


FORWARDED_PREFIXES = ("ENVHUB_", "E2B_", "HF_", "HUGGING_FACE_", "OPENAI_")
"""Environment variables the workers get from the driver: envhub's own, and the credentials
and endpoints that sandboxes (e2b), Hub envs and judge rewards read. A worker on another node
does not inherit the driver's environment."""


CORES_ENV = "ENVHUB_WORKER_CORES"
"""Comma-separated cores a rollout worker pins itself to (the engine's share of a split)."""


def _affinity_env(cores: Sequence[int] | None) -> dict[str, str]:
    """The worker environment that pins it to ``cores`` (nothing when None)."""
    return {CORES_ENV: ",".join(map(str, cores))} if cores else {}


def _pin_to_cores(value: str | None) -> None:
    """Run this process on the cores ``value`` lists (``CORES_ENV``), where the OS allows:
    every thread it has (Linux pins one thread per call; a Ray actor's ``__init__`` does not
    run on the main thread), so the threads they start later are pinned too."""
    if not value or not hasattr(os, "sched_setaffinity"):
        return
    try:
        cores = {int(c) for c in value.split(",")}
    except ValueError:
        return
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]  # this thread at least
    for thread in threads:
        try:
            os.sched_setaffinity(thread, cores)
        except OSError:
            pass  # cores this node lacks, or a thread that ended: left to the OS


def forwarded_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The driver's variables that :data:`FORWARDED_PREFIXES` selects."""
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items() if k.startswith(FORWARDED_PREFIXES)}


def _registrations(envs: Sequence[EnvSpec]) -> dict[str, Any]:
    """Targets of the run's envs that were registered in this process (not installed), to
    register again in each worker."""
    known = list_envs()
    return {
        e.name: known[e.name].target
        for e in envs
        if e.name in known and known[e.name].distribution is None
    }
