"""How fast an env runs on this machine: the numbers ``envhub check`` reports and the Hub card
shows.

:func:`measure` plays an env with its scripted policy and times it: first the env's sandbox, if
it uses one (:func:`env_sandbox`), runs a trivial program in a fresh sandbox (the cold start);
then one warm-up episode (first imports, caches), not counted; then the measured episodes, on
tasks spread over the dataset, until ``budget_s`` has passed (at least ``min_episodes``, at
most ``max_episodes``: a fast env stops at the count, a slow one at the budget).

The policy is the env's ``reference_policy`` (its scripted policy, which solves every task)
when it has one, else the null policy (the empty reply). The null policy ends most episodes at
once, so its numbers are the env's overhead rather than a real episode; :class:`Performance`
says which one played.

The peak RSS is the high-water mark of the process, so it means something only in a process
that did nothing before: :func:`measure_target` (what ``envhub check`` runs) measures in a fresh
interpreter. Programs an env runs in a sandbox are other processes: their memory is not in the
peak RSS, their CPU time is in the CPU time per episode.

What this is not: a benchmark. A few seconds per env, one env at a time, no concurrency, on
whatever else the machine is doing; the numbers come with the :class:`Machine` they were
measured on. ``python -m envhub.evaluation.perf MODULE:ATTR OUT.json`` is the worker of
:func:`measure_target`.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from envhub.env import Env, TaskEnv
from envhub.errors import EnvhubError
from envhub.types import Message, as_message

if TYPE_CHECKING:
    from envhub.sandbox.base import Sandbox

MAX_EPISODES = 200
"""Most measured episodes per env: enough steps for a p99 of a fast env."""
MIN_EPISODES = 3
BUDGET_S = 2.0
"""Seconds after which no further episode starts (once ``MIN_EPISODES`` are done)."""
WARM_RUNS = 3
"""Sandbox runs after the cold one, for the warm start time."""
TIMEOUT_S = 300.0
"""How long :func:`measure_target` waits for its worker."""


class SandboxStart(TypedDict):
    """How long the env's sandbox takes to run a trivial Python program."""

    backend: str
    """The sandbox's backend (``local``, ``e2b``, ...)."""
    cold_start_ms: float
    """The first run of the sandbox in this process, before any episode (making the sandbox
    object is not counted: an env may make it when it is made)."""
    warm_start_ms: float
    """The median of the next few runs (a backend that starts each run afresh, as the local one
    does, shows about the cold time again)."""


class Performance(TypedDict):
    """What :func:`measure` found for one env (JSON-ready; times in milliseconds)."""

    policy: str
    """``reference`` (the env's scripted policy) or ``null`` (the empty reply)."""
    episodes: int
    """Measured episodes (the warm-up not counted)."""
    steps: int
    """Steps over the measured episodes."""
    mean_reward: float
    """The policy's mean total reward over the measured episodes."""
    episodes_per_s: float
    """Measured episodes per second of wall time, policy and resets included."""
    reset_p50_ms: float
    """Median time of ``env.reset``."""
    step_p50_ms: float
    """Median time of ``env.step`` (the policy's time not included, rewards included)."""
    step_p99_ms: float
    """99th percentile (nearest rank) of ``env.step``."""
    cpu_ms_per_episode: float
    """CPU time per measured episode: this process and its finished child processes."""
    peak_rss_mb: float | None
    """The process's peak resident memory in MiB (``None`` where the OS does not say)."""
    sandbox: SandboxStart | None
    """The sandbox's start times; ``None`` for an env without a sandbox."""


class Machine(TypedDict):
    """The machine numbers were measured on (nothing that names it or its owner)."""

    cpu: str
    """The CPU model."""
    cores: int
    """Logical CPUs this process may run on."""
    ram_gb: float
    """Physical memory in GiB."""
    os: str
    """System and kernel release."""
    python: str
    """The Python version."""
    envhub: str
    """The envhub version."""


@dataclass
class _Episode:
    reset_s: float
    step_s: list[float] = field(default_factory=list)
    reward: float = 0.0


def measure(
    env: Env,
    *,
    max_episodes: int = MAX_EPISODES,
    min_episodes: int = MIN_EPISODES,
    budget_s: float = BUDGET_S,
    max_steps: int = 100,
) -> Performance:
    """Time ``env`` played by its scripted policy (see the module docstring). The env stays open.

    Args:
        env: The env to measure.
        max_episodes: Most measured episodes.
        min_episodes: Fewest measured episodes, however slow.
        budget_s: Seconds after which no further episode starts.
        max_steps: An episode that has not ended after this many steps is an error.

    Raises:
        EnvhubError: An episode did not end; a sandbox run failed.
    """
    sandbox = _sandbox_start(env)
    policy_name, policy = _policy(env)
    _play(env, 0, _task(env, 0), policy, max_steps)  # the warm-up: first imports and caches
    episodes: list[_Episode] = []
    cpu, start = _cpu_s(), time.perf_counter()
    for seed in range(max_episodes):
        episodes.append(_play(env, seed, _task(env, seed), policy, max_steps))
        if len(episodes) >= min_episodes and time.perf_counter() - start > budget_s:
            break
    wall, cpu = time.perf_counter() - start, _cpu_s() - cpu
    steps = [s for e in episodes for s in e.step_s]
    return Performance(
        policy=policy_name,
        episodes=len(episodes),
        steps=len(steps),
        mean_reward=_round(sum(e.reward for e in episodes) / len(episodes)),
        episodes_per_s=_round(len(episodes) / wall),
        reset_p50_ms=_ms(percentile([e.reset_s for e in episodes], 50)),
        step_p50_ms=_ms(percentile(steps, 50)),
        step_p99_ms=_ms(percentile(steps, 99)),
        cpu_ms_per_episode=_ms(cpu / len(episodes)),
        peak_rss_mb=_peak_rss_mb(),
        sandbox=sandbox,
    )


def env_sandbox(env: Env) -> Sandbox | None:
    """The sandbox ``env`` runs code in, or ``None`` when it uses none.

    An env uses a sandbox when it has a ``sandbox`` attribute (the convention of envhub's code
    envs and of the ``code`` template): a :class:`~envhub.sandbox.Sandbox`, or ``None`` for the
    process-wide default sandbox, as :func:`~envhub.rewards.code.code_tests` reads it.

    Raises:
        SandboxUnavailableError: The env uses the default sandbox and it cannot run here.
    """
    from envhub.sandbox.base import Sandbox

    if not hasattr(env, "sandbox"):
        return None
    sandbox = env.sandbox
    if sandbox is None:
        from envhub.rewards.code import default_sandbox

        return default_sandbox()
    return sandbox if isinstance(sandbox, Sandbox) else None


def _sandbox_start(env: Env) -> SandboxStart | None:
    sandbox = env_sandbox(env)
    if sandbox is None:
        return None
    times = []
    for _ in range(1 + WARM_RUNS):
        start = time.perf_counter()
        result = sandbox.run_python("pass")
        times.append(time.perf_counter() - start)
        if not result.ok:
            raise EnvhubError(
                f"the env's {sandbox.backend} sandbox cannot run `pass`: {result.describe()}: "
                f"{result.stderr.strip()[-300:]}"
            )
    return SandboxStart(
        backend=sandbox.backend,
        cold_start_ms=_ms(times[0]),
        warm_start_ms=_ms(percentile(times[1:], 50)),
    )


def _policy(env: Env) -> tuple[str, Any]:
    from envhub.testing import null_policy

    policy = getattr(env, "reference_policy", None)
    return ("reference", policy) if policy is not None else ("null", null_policy)


def _task(env: Env, k: int) -> int | None:
    return spread_index(k, len(env.dataset)) if isinstance(env, TaskEnv) else None


def spread_index(k: int, size: int) -> int:
    """The ``k``-th of a sequence of task indices whose every start is spread over ``size``
    tasks: 0, 1/2, 1/4, 3/4, 1/8, ... of the way (the van der Corput sequence), so that however
    many episodes fit in the budget, they cover the whole dataset. 20 tasks: 0, 10, 5, 15, 2, ...
    """
    fraction, scale = 0.0, 0.5
    while k:
        fraction, k, scale = fraction + scale * (k & 1), k >> 1, scale / 2
    return int(fraction * size)


def _play(env: Env, seed: int, task: int | None, policy: Any, max_steps: int) -> _Episode:
    """One episode; only ``env.reset`` and ``env.step`` are timed, not the policy."""
    options = None if task is None else {"task_index": task}
    start = time.perf_counter()
    observation, _ = env.reset(seed=seed, options=options)
    episode = _Episode(time.perf_counter() - start)
    conversation: list[Message] = [as_message(m) for m in observation]
    for _ in range(max_steps):
        action = policy(list(conversation), env.tool_schemas)
        start = time.perf_counter()
        observation, reward, terminated, truncated, _ = env.step(action)
        episode.step_s.append(time.perf_counter() - start)
        episode.reward += float(reward)
        conversation += [Message(role="assistant", content=action)]
        conversation += [as_message(m) for m in observation]
        if terminated or truncated:
            return episode
    where = f"seed {seed}" + ("" if task is None else f", task {task}")
    raise EnvhubError(f"{env.name}: the episode ({where}) did not end within {max_steps} steps")


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` by nearest rank (always one of the values)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _cpu_s() -> float:
    """CPU seconds of this process and of its children that have ended (sandboxed runs)."""
    try:
        import resource
    except ImportError:  # not on Windows: this process only
        return time.process_time()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _peak_rss_mb() -> float | None:
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux counts KiB, macOS bytes.
    return _round(peak / (1 << 20) if sys.platform == "darwin" else peak / 1024)


def _ms(seconds: float) -> float:
    return _round(seconds * 1000)


def _round(value: float) -> float:
    """Three significant digits: timings vary more than that from run to run."""
    return float(f"{value:.3g}")


def machine() -> Machine:
    """This machine: CPU model, cores, memory, OS, Python and envhub versions."""
    from envhub.version import __version__

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on macOS or Windows
        cores = os.cpu_count() or 1
    return Machine(
        cpu=_cpu_model(),
        cores=cores,
        ram_gb=_ram_gb(),
        os=f"{platform.system()} {platform.release()}".strip(),
        python=platform.python_version(),
        envhub=__version__,
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _ram_gb() -> float:
    try:
        return _round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30))
    except (ValueError, OSError, AttributeError):
        return 0.0


def measure_target(
    target: str, *, root: str | Path | None = None, timeout: float = TIMEOUT_S
) -> Performance:
    """:func:`measure` the env ``target`` (``"module:attr"``, made without arguments) in a fresh
    interpreter, so that its peak RSS is its own.

    Args:
        target: The env's entry point target.
        root: A package folder: the worker runs there, with it first on ``PYTHONPATH``.
        timeout: Seconds to wait for the worker.

    Raises:
        EnvhubError: The worker failed (its last error line says why).
        subprocess.TimeoutExpired: It did not finish within ``timeout``.
    """
    environ = dict(os.environ)
    if root is not None:
        paths = [str(Path(root).resolve()), environ.get("PYTHONPATH", "")]
        environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    with tempfile.TemporaryDirectory(prefix="envhub-perf-") as tmp:
        out = Path(tmp) / "performance.json"
        command = [sys.executable, "-m", "envhub.evaluation.perf", target, str(out)]
        done = subprocess.run(
            command, cwd=root, env=environ, capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0 or not out.is_file():
            lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
            raise EnvhubError(f"measuring {target} failed: {lines[-1]}")
        return json.loads(out.read_text(encoding="utf-8"))


def summary(performance: Mapping[str, Any]) -> str:
    """One line: ``850 episodes/s, step p50 40 µs / p99 90 µs (200 episodes, reference policy)``."""
    p = performance
    line = (
        f"{format_rate(p['episodes_per_s'])} episodes/s, step p50 {format_ms(p['step_p50_ms'])}"
        f" / p99 {format_ms(p['step_p99_ms'])}"
    )
    if p.get("sandbox"):
        line += f", sandbox cold start {format_ms(p['sandbox']['cold_start_ms'])}"
    return f"{line} ({p['episodes']} episodes, {p['policy']} policy)"


def machine_line(m: Mapping[str, Any]) -> str:
    """One line: ``AMD EPYC, 2 cores, 7.8 GiB RAM, Linux 6.1.0, Python 3.11.9, envhub 0.1.0``."""
    return (
        f"{m['cpu']}, {m['cores']} cores, {m['ram_gb']:g} GiB RAM, {m['os']}, "
        f"Python {m['python']}, envhub {m['envhub']}"
    )


def format_ms(ms: float) -> str:
    """A duration given in milliseconds, in the unit that reads best: ``45 µs``, ``1.2 ms``,
    ``3.4 s``."""
    if ms < 1:
        return f"{ms * 1000:.3g} µs"
    if ms < 1000:
        return f"{ms:.3g} ms"
    return f"{ms / 1000:.3g} s"


def format_rate(value: float) -> str:
    """A rate without exponents: ``12300``, ``850``, ``12.5``, ``0.42``."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def main(argv: list[str] | None = None) -> int:
    """The worker of :func:`measure_target`:
    ``python -m envhub.evaluation.perf MODULE:ATTR OUT.json``."""
    from envhub.registry import EnvSpec

    target, out = argv if argv is not None else sys.argv[1:]
    with EnvSpec(target, target).load()() as env:
        performance = measure(env)
    Path(out).write_text(json.dumps(performance), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
