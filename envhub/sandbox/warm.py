"""Warm sandboxes: Python runs whose sandbox and interpreter were started before the call.

A ``print(1)`` run spends ~16 ms before the program's first line: bubblewrap builds the
namespaces and mounts (~4 ms), the init shell starts (~1-2 ms), the interpreter starts and
imports ``site`` (~10 ms). The local backend starts a few sandboxes ahead for each kind of
Python run it has seen (the interpreter's flags, the network setting, the disk size), each
stopped inside :data:`STUB`, blocked on a pipe. A call takes one and sends it the job; the stub
then does what the interpreter would have done with ``python FLAGS SCRIPT ARGS``:

1. writes the call's files into the working folder (as bubblewrap's ``--file`` would have,
   mode 0666, folders 0755);
2. sets the call's rlimits (``setrlimit``: the same values the init's ``ulimit`` sets for a
   cold run, counted the same way inside the sandbox's user namespace); a limit it cannot set
   stops the run with status 125, as a cold run's init does;
3. makes ``SCRIPT`` the ``__main__`` module (``__file__`` absolute, ``sys.argv``,
   ``sys.orig_argv`` and ``sys.path[0]`` as the interpreter sets them) and runs it; an uncaught
   exception is printed by ``sys.excepthook`` without the stub's frames and exits 1 (a
   ``KeyboardInterrupt``: the ``atexit`` handlers, then SIGINT, as the interpreter does).

Each warm sandbox is single-use: one call, then it exits like any run, and its uid goes back to
the pool only once it owns no process. Nothing of one call reaches another.

What a program can still tell apart from a cold start: the stub's frame below its own in
``inspect.stack()``, the modules the stub imported (``resource``, already imported by most
programs that care), the CPU time the interpreter's start-up used (~10 ms, counted against
``cpu_time``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from subprocess import Popen

from envhub.sandbox._process import kill, uid_processes
from envhub.sandbox.base import Limits, rlimits
from envhub.sandbox.outputs import frame
from envhub.sandbox.uids import UidPool

FLAGS = frozenset({"-I", "-S", "-E", "-s", "-B", "-u", "-P", "-O", "-OO"})
"""Interpreter flags a warm sandbox can be started with (none takes an argument)."""

_JOB = "\0job"

STUB = r"""
import os, sys, resource
def _envhub_job(fd):
    data = bytearray()
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)
    entries, at = [], 0
    while at < len(data):
        name_end = data.index(b"\n", at)
        size_end = data.index(b"\n", name_end + 1)
        end = size_end + 1 + int(data[name_end + 1 : size_end])
        entries.append((data[at:name_end].decode(), bytes(data[size_end + 1 : end])))
        at = end
    fields = entries[0][1].decode("utf-8", "surrogateescape").split("\0")
    for name, content in entries[1:]:
        parts = name.split("/")
        for i in range(1, len(parts)):
            folder = "/".join(parts[:i])
            if not os.path.isdir(folder):
                os.mkdir(folder)
                os.chmod(folder, 0o755)
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        os.fchmod(out, 0o666)
        view = memoryview(content)
        while view:
            view = view[os.write(out, view):]
        os.close(out)
    script, count = int(fields[0]), int(fields[1])
    limits = [int(x) for x in fields[2:2 + 3 * count]]
    try:
        for at in range(0, len(limits), 3):
            resource.setrlimit(limits[at], (limits[at + 1], limits[at + 2]))
    except (OSError, ValueError):
        os.write(2, b"envhub sandbox: cannot set its limits\n")
        os._exit(125)
    argv = fields[2 + 3 * count:]
    path = os.path.abspath(argv[script])
    sys.orig_argv[:] = argv
    sys.argv[:] = argv[script:]
    if not getattr(sys.flags, "safe_path", False):
        sys.path[0] = os.path.dirname(path)
    main = type(sys)("__main__")
    main.__file__, main.__cached__, main.__annotations__ = path, None, {}
    main.__builtins__ = sys.modules["builtins"]
    main.__loader__ = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", path)
    sys.modules["__main__"] = main
    with open(path, "rb") as f:
        return compile(f.read(), path, "exec"), main.__dict__
try:
    exec(*_envhub_job(int(sys.argv[1])))
except SystemExit:
    raise
except BaseException as e:
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    e.__traceback__ = tb
    sys.excepthook(type(e), e, tb)
    if isinstance(e, KeyboardInterrupt):
        import atexit, signal
        atexit._run_exitfuncs()
        sys.stdout.flush(), sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(1)
"""

Kind = tuple[tuple[str, ...], bool, int]
"""What a warm sandbox is started with: the interpreter's flags, the network, the disk size."""


@dataclass
class WarmSandbox:
    """One sandbox started ahead, its stub waiting for a job."""

    kind: Kind
    uid: int
    proc: Popen[bytes]
    job_fd: int
    """The write end of the pipe the stub reads its job from."""
    info_fd: int
    """The read end of bubblewrap's ``--info-fd`` pipe (the sandbox init's host pid)."""
    zygote_fds: tuple[int, int] | None = None
    """A zygote run's (:mod:`envhub.sandbox.zygote`): the write end of its init's status pipe
    and the read end of its job pipe, for the zygote; ``None``: the stub runs in the box."""


@dataclass
class WarmSet:
    """The warm sandboxes of one local sandbox, by kind, with the pool their uids are from
    (whose :attr:`~envhub.sandbox.uids.UidPool.warm` it keeps in step: every box goes in and
    out through here). Its ``lock`` is the local sandbox's own, for its other state too."""

    uids: UidPool
    boxes: dict[Kind, list[WarmSandbox]] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def admit(self, kind: Kind, most: int) -> bool:
        """Whether boxes of ``kind`` are kept: it was admitted before, or is now, as one of the
        first ``most`` kinds."""
        with self.lock:
            if kind not in self.boxes:
                if len(self.boxes) >= most:
                    return False
                self.boxes[kind] = []
            return True

    def count(self, kind: Kind) -> int:
        """How many boxes of ``kind`` wait for a call."""
        with self.lock:
            return len(self.boxes.get(kind, ()))

    def held_uids(self) -> frozenset[int]:
        """The uids the boxes hold."""
        with self.lock:
            return frozenset(box.uid for boxes in self.boxes.values() for box in boxes)

    def put(self, box: WarmSandbox) -> None:
        """Keep ``box`` ready for a call of its kind."""
        with self.lock:
            self.boxes.setdefault(box.kind, []).append(box)
            self.uids.mark_warm(box.uid)

    def take(self, kind: Kind | None = None) -> WarmSandbox | None:
        """The oldest box of ``kind`` (of any kind when ``None``), or ``None``."""
        with self.lock:
            kinds = [kind] if kind is not None else list(self.boxes)
            for boxes in (self.boxes.get(k) for k in kinds):
                if boxes:
                    box = boxes.pop(0)
                    self.uids.unmark_warm([box.uid])
                    return box
        return None

    def take_all(self) -> list[WarmSandbox]:
        """Every box, of every kind."""
        with self.lock:
            every = [box for boxes in self.boxes.values() for box in boxes]
            self.boxes.clear()
            self.uids.unmark_warm(box.uid for box in every)
        return every

    def after_fork(self) -> UidPool:
        """In a forked child: forget the boxes (the parent's children, which it goes on using),
        then take a pool of the child's own (:meth:`~envhub.sandbox.uids.UidPool.reclaimed`),
        which is returned."""
        self.boxes.clear()
        self.lock = threading.RLock()
        self.uids = self.uids.reclaimed()
        return self.uids


def script_of(argv: Sequence[str], python: str, files: Mapping[str, bytes]) -> int | None:
    """Where the script is in ``argv`` when it is ``python [FLAGS] SCRIPT [ARGS]`` with
    ``SCRIPT`` one of the call's ``files`` and every flag in :data:`FLAGS`, else ``None``."""
    if len(argv) < 2 or argv[0] != python:
        return None
    for position, word in enumerate(argv[1:], start=1):
        if word in FLAGS:
            continue
        usable = word in files and word.endswith(".py") and not any("\n" in f for f in files)
        return position if usable else None
    return None


def kind_of(argv: Sequence[str], script: int, limits: Limits) -> Kind:
    """The kind of warm sandbox that can run ``argv`` under ``limits``."""
    return (tuple(argv[1:script]), limits.network, limits.disk_mb)


def stub_argv(python: str, kind: Kind, job_fd: int) -> list[str]:
    """The interpreter command a warm sandbox of ``kind`` runs."""
    return [python, *kind[0], "-c", STUB, str(job_fd)]


def job_for(
    argv: Sequence[str], script: int, files: Mapping[str, bytes], limits: Limits, nproc: int
) -> bytes:
    """The job for a stub: where the script is in ``argv``, the number of rlimits, each of
    :func:`~envhub.sandbox.base.rlimits` as ``resource soft hard`` (the stub sets what it is
    sent, so it holds no list of its own), ``argv``, then the files."""
    triples = rlimits(limits, nproc)
    numbers = [script, len(triples), *(n for triple in triples for n in triple)]
    head = "\0".join([*(str(n) for n in numbers), *argv]).encode("utf-8", "surrogateescape")
    return frame({_JOB: head, **files})


def close_fds(box: WarmSandbox) -> None:
    """Close what this process holds of a warm sandbox: its job and info pipes, its stdio."""
    for fd in (box.job_fd, box.info_fd, *(box.zygote_fds or ())):
        with contextlib.suppress(OSError):
            os.close(fd)
    for stream in (box.proc.stdin, box.proc.stdout, box.proc.stderr):
        if stream is not None:
            stream.close()


def stop(box: WarmSandbox, uids: UidPool) -> None:
    """Stop a warm sandbox and wait for it (blocking: for clean-up outside an event loop)."""
    kill(box.proc, False)
    try:
        box.proc.wait(5)
    except subprocess.TimeoutExpired:
        box.proc.kill()
        box.proc.wait()
    close_fds(box)
    if not uids.exclusive:  # the caller's own uid: nothing to wait for (as LocalSandbox does)
        uids.release(box.uid)
        return
    deadline = time.monotonic() + 2
    while uid_processes(box.uid) and time.monotonic() < deadline:
        time.sleep(0.005)
    if not uid_processes(box.uid):  # else the uid stays out of the pool
        uids.release(box.uid)


def stop_all(warm: WarmSet) -> None:
    """Stop every warm sandbox of a :class:`~envhub.sandbox.LocalSandbox` (it was collected, or
    the interpreter exits)."""
    for box in warm.take_all():
        stop(box, warm.uids)
