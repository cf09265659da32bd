"""Local sandbox sessions: episode set-up and teardown, commands per second, many at once.

1. Set-up (until the session's init is ready) and teardown (``aclose``) of a session whose
   workspace has 10 / 1,000 / 10,000 files: copy-on-write (the default: an overlay on the
   workspace) against a copy (``start="copy"``: ``cp -a`` into the session's tmpfs), with
   ``shutil.copytree`` of the workspace into a fresh host folder beside them (what a copy costs
   before any sandbox), and a one-shot cold run of ``true`` for scale (the machine's load).
2. Commands one after another in one session against a bare ``subprocess.run`` of the same
   argv on the host (no sandbox): ``true`` and ``sh -c 'echo hi'``.
3. 64 sessions at once on one workspace: start time, memory (the proportional set size of
   every process of theirs, and the host's available memory before and after), a command in
   each, then what is left after they close: processes of their uids and of the session
   launcher, mounts of a session's tmpfs or overlay those hold, files under the mount point.

Needs root and bubblewrap (as local sessions do). The session init is the compiled one where
``cc`` builds it; ``ENVHUB_SESSION_INIT=python`` runs the Python init instead.

    .venv/bin/python bench/sandbox_session.py [--runs 15] [--calls 300] [--sessions 64]
        [--parts 1 2 3] [--no-zygote]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from envhub.sandbox import Limits, LocalSandbox, Workspace
from envhub.sandbox._process import uid_processes
from envhub.sandbox.local_session import LocalSession
from envhub.sandbox.session_init_c import compiled_init
from envhub.sandbox.session_launcher import MOUNT_POINT, launcher


def workspace_of(files: int) -> Workspace:
    """A workspace of ``files`` small files, 100 to a folder."""
    return Workspace.from_files(
        {f"pkg{i // 100}/module_{i}.py": f"VALUE = {i}\n" * 4 for i in range(files)}
    )


def ms(values: list[float]) -> str:
    """The median of ``values`` (seconds) in milliseconds, for the table."""
    return f"{statistics.median(values) * 1000:8.1f}"


async def setup_teardown(box: LocalSandbox, workspace: Workspace, start: str, runs: int):
    """Median set-up and teardown seconds of ``runs`` sessions, one after another."""
    ups, downs = [], []
    for _ in range(runs):
        began = time.perf_counter()
        session = box.session(workspace, start=start)  # type: ignore[arg-type]
        await session.__aenter__()
        ready = time.perf_counter()
        await session.aclose()
        ups.append(ready - began)
        downs.append(time.perf_counter() - ready)
    return ups, downs


def copytree_seconds(workspace: Workspace, runs: int) -> list[float]:
    """Seconds of ``shutil.copytree`` of the workspace into a fresh folder."""
    seconds = []
    for _ in range(runs):
        target = Path(tempfile.mkdtemp()) / "copy"
        began = time.perf_counter()
        shutil.copytree(workspace.path, target)
        seconds.append(time.perf_counter() - began)
        shutil.rmtree(target.parent)
    return seconds


async def one_shot_seconds(box: LocalSandbox, runs: int) -> list[float]:
    """Seconds of a one-shot cold run of ``true`` (bubblewrap, its init, the command): what
    any sandbox costs on this machine now, beside the sessions' rows."""
    seconds = []
    for _ in range(runs):
        began = time.perf_counter()
        await box.arun(["true"])
        seconds.append(time.perf_counter() - began)
    return seconds


async def part_setup(box: LocalSandbox, sizes: list[int], runs: int) -> None:
    """Part 1: set-up and teardown by workspace size, copy against copy-on-write."""
    one_shot = await one_shot_seconds(box, runs)
    print(f"\n1. session set-up (ready) and teardown, p50 ms (a one-shot run: {ms(one_shot)})")
    header = ["copytree", "copy up", "copy down", "cow up", "cow down"]
    print(f"{'files':>6} " + " ".join(f"{h:>8}" for h in header))
    for size in sizes:
        workspace = workspace_of(size)
        try:
            copied = copytree_seconds(workspace, runs)
            await setup_teardown(box, workspace, "overlay", 2)  # warm the caches
            copy_up, copy_down = await setup_teardown(box, workspace, "copy", runs)
            cow_up, cow_down = await setup_teardown(box, workspace, "overlay", runs)
            print(
                f"{size:>6} {ms(copied)} {ms(copy_up)} {ms(copy_down):>9} {ms(cow_up)} "
                f"{ms(cow_down)}"
            )
        finally:
            workspace.remove()


async def part_commands(box: LocalSandbox, calls: int) -> None:
    """Part 2: commands one after another in a session against ``subprocess.run``, in
    interleaved rounds of 20 (the machine's load changes under a long run): medians of the
    rounds."""
    print(f"\n2. {calls} commands one after another (interleaved rounds of 20, medians)")
    print(f"{'command':18} {'session ms':>10} {'host ms':>8} {'ratio':>6} {'session/s':>9}")
    async with box.session() as session:
        for argv in (["true"], ["sh", "-c", "echo hi"]):
            await session.arun(argv)
            inside, host = [], []
            for _ in range(max(1, calls // 20)):
                began = time.perf_counter()
                for _ in range(20):
                    result = await session.arun(argv)
                inside.append((time.perf_counter() - began) / 20)
                assert result.exit_code == 0
                began = time.perf_counter()
                for _ in range(20):
                    subprocess.run(argv, capture_output=True, check=True)
                host.append((time.perf_counter() - began) / 20)
            mid_inside, mid_host = statistics.median(inside), statistics.median(host)
            print(
                f"{' '.join(argv):18} {mid_inside * 1000:10.2f} {mid_host * 1000:8.2f} "
                f"{mid_inside / mid_host:6.2f} {1 / mid_inside:9.0f}"
            )


def pss_kib(pids: list[int]) -> int:
    """The proportional set size of ``pids`` together, in KiB (shared pages split fairly)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration):
            continue
    return total


def available_kib() -> int:
    """The host's available memory (``MemAvailable``), in KiB."""
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))


def session_mounts(pids: list[int]) -> int:
    """Mount lines of a session's tmpfs or overlay seen by ``pids``."""
    count = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/mountinfo") as f:
                count += sum("envhub-session" in line for line in f)
        except OSError:
            continue
    return count


def ours(uids: list[int]) -> list[int]:
    """This process's session processes: the launcher's children (each session's bubblewrap,
    whose mount namespace holds its files) and every process of the sessions' uids, but those
    that exited and wait for their parent to reap them. (Other
    programs on the machine may run sessions of their own at the same time.)"""
    helper = launcher().proc.pid
    try:
        with open(f"/proc/{helper}/task/{helper}/children") as f:
            children = [int(pid) for pid in f.read().split()]
    except OSError:
        children = []
    every = {*children, *(pid for uid in uids for pid in uid_processes(uid))}
    return sorted(pid for pid in every if not zombie(pid))


def zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits to be reaped (or is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:\tZ") for line in f)
    except OSError:
        return True


async def part_many(box: LocalSandbox, count: int) -> None:
    """Part 3: ``count`` sessions at once: time, memory, and leftovers after they close."""
    print(f"\n3. {count} sessions at once on one 1,000-file workspace")
    workspace = workspace_of(1000)
    original = (workspace.path / "pkg0/module_0.py").read_bytes()
    before = available_kib()
    sessions: list[LocalSession] = [box.session(workspace) for _ in range(count)]
    began = time.perf_counter()
    await asyncio.gather(*[s.__aenter__() for s in sessions])
    started = time.perf_counter() - began
    results = await asyncio.gather(
        *[s.arun(f"echo {i} >> pkg0/module_0.py && (sleep 300 &)") for i, s in enumerate(sessions)]
    )
    assert all(r.ok for r in results), [r for r in results if not r.ok][:1]
    uids: list[int] = [s.uid for s in sessions]  # type: ignore[misc]
    inits = [s._running.server_pid for s in sessions if s._running and s._running.server_pid]
    pids = [*inits, *(pid for uid in uids for pid in uid_processes(uid, live=True))]
    mounted = session_mounts(ours(uids))
    used, pss = before - available_kib(), pss_kib(pids)
    began = time.perf_counter()
    tails = await asyncio.gather(*[s.arun("tail -n 1 pkg0/module_0.py") for s in sessions])
    one_each = time.perf_counter() - began
    assert [r.stdout for r in tails] == [f"{i}\n" for i in range(count)]
    began = time.perf_counter()
    await asyncio.gather(*[s.aclose() for s in sessions])
    closed = time.perf_counter() - began
    left = ours(uids)
    print(f"  start all: {started * 1000:.0f} ms; a command in each: {one_each * 1000:.0f} ms")
    print(f"  processes: {len(pids)}, their PSS: {pss / 1024:.0f} MiB")
    print(f"  host memory used while they lived: {used / 1024:.0f} MiB")
    print(f"  close all: {closed * 1000:.0f} ms")
    print(
        f"  left after close: {len(left)} processes, {session_mounts(left)} session mounts "
        f"(while they lived: {mounted}), "
        f"{len(list(MOUNT_POINT.iterdir()))} files under {MOUNT_POINT}, workspace unchanged: "
        f"{(workspace.path / 'pkg0/module_0.py').read_bytes() == original}"
    )
    workspace.remove()


async def main(
    runs: int, calls: int, sessions: int, sizes: list[int], parts: list[int], zygote: bool
) -> None:
    """Run the parts asked for."""
    init = "compiled" if compiled_init() else "Python"
    print(f"cpus: {os.cpu_count()}; bubblewrap sessions as root; {init} init; zygote: {zygote}")
    limits = Limits(wall_time=30, processes=32)
    with LocalSandbox(limits, max_concurrency=max(8, sessions), warm=0, zygote=zygote) as box:
        if 1 in parts:
            await part_setup(box, sizes, runs)
        if 2 in parts:
            await part_commands(box, calls)
        if 3 in parts:
            await part_many(box, sessions)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="sessions per set-up row")
    parser.add_argument("--calls", type=int, default=300, help="commands per command row")
    parser.add_argument("--sessions", type=int, default=64, help="sessions at once")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 1000, 10000])
    parser.add_argument("--parts", type=int, nargs="+", default=[1, 2, 3], help="which parts")
    parser.add_argument(
        "--no-zygote", action="store_true", help="sessions start their own init (pid 1)"
    )
    args = parser.parse_args()
    asyncio.run(
        main(args.runs, args.calls, args.sessions, args.sizes, args.parts, not args.no_zygote)
    )
