"""The inside of a local session: its init, and what it is told.

A local session (:mod:`envhub.sandbox.local_session`) is one bubblewrap sandbox built as any
run's (:mod:`envhub.sandbox.jail`: same namespaces, mounts, uid, no capabilities,
``no_new_privs``) whose pid 1 is :data:`INIT`, a small Python loop that forks each command
on request. Its working folder and ``/tmp`` live on a tmpfs of ``disk_mb`` that the launcher
mounted (:mod:`envhub.sandbox.session_launcher`).

The init talks to envhub over a ``SOCK_SEQPACKET`` socket that only it holds:

- envhub -> init: a :mod:`marshal`-ed tuple. ``("run", id, argv, env, rlimits)`` with the
  call's stdin, stdout and stderr as three file descriptors; ``("kill", id)``: SIGKILL the
  call's process group; ``("killall",)``: SIGKILL every other process of the sandbox.
- init -> envhub: ASCII lines: ``ready``; ``exit ID STATUS`` when the call's first process
  ended (``128 + n`` for signal n; 126/127 when it could not start); for a killed call, once
  every process of its group has gone too.

Each command starts in a session of its own (its process group is what a timeout kills), with
the default signal dispositions, its rlimits, only its three descriptors, in ``/sandbox``.
The init searches ``PATH`` itself (``os.execvpe``'s search cost ~1.6 ms a call). It reaps
every orphan; it makes itself non-dumpable first, so that commands (the same
uid) cannot ptrace it or open its ``/proc`` files to forge later calls' results; as pid 1 it
gets no signal from them but the SIGCHLD it handles.
"""

from __future__ import annotations

import marshal
import resource
from collections.abc import Mapping, Sequence

from envhub.sandbox import zygote as zygotes
from envhub.sandbox.base import Limits

INIT = r"""
import os, sys, _signal, _socket, select, marshal, resource
def _main(fd):
    import _ctypes  # not ctypes: its import costs ~3 ms, the init's start is every session's
    class Int(_ctypes._SimpleCData):
        _type_ = "i"
    class Function(_ctypes.CFuncPtr):
        _flags_, _restype_ = _ctypes.FUNCFLAG_CDECL, Int
    prctl = Function(_ctypes.dlsym(_ctypes.dlopen(None), "prctl"))
    if prctl(4, 0, 0, 0, 0) != 0 or prctl(3, 0, 0, 0, 0) != 0:  # PR_SET/GET_DUMPABLE
        os._exit(125)
    if os.getpid() != 1 and prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        os._exit(125)
    prctl(15, b"envhub-init", 0, 0, 0)  # PR_SET_NAME: killing interpreters by name spares it
    ctrl = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET, 0, fd)
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    _signal.set_wakeup_fd(wake_w)
    _signal.signal(_signal.SIGCHLD, lambda *_: None)
    calls = {}
    ctrl.send(b"ready")
    while True:
        _reap(ctrl, calls)
        ready = select.select([ctrl, wake_r], [], [])[0]
        if wake_r in ready:
            while True:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    break
        if ctrl in ready:
            data, ancillary, _, _ = ctrl.recvmsg(1 << 22, 64)
            if not data:
                os._exit(0)
            fds = []
            for level, kind, raw in ancillary:
                if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                    fds += [int.from_bytes(raw[i:i + 4], sys.byteorder)
                            for i in range(0, len(raw) - 3, 4)]
            message = marshal.loads(data)
            if message[0] == "run":
                _start(ctrl, calls, message, fds, wake_w)
            elif message[0] == "kill":
                for pid, call in list(calls.items()):
                    if call == message[1]:
                        _kill_group(ctrl, calls, pid)
            elif message[0] == "killall":
                try:
                    os.kill(-1, 9)
                except OSError:
                    pass
            for fd in fds:
                os.close(fd)
def _reap(ctrl, calls, hold=None):
    held = None
    try:
        while True:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            if pid in calls:
                code = os.waitstatus_to_exitcode(status)
                reply = b"exit %d %d" % (calls.pop(pid), 128 - code if code < 0 else code)
                if pid == hold:
                    held = reply
                else:
                    ctrl.send(reply)
    except ChildProcessError:
        pass
    return held
def _kill_group(ctrl, calls, pid):
    import time
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, 9)
        except OSError:
            pass
    reply = None
    for _ in range(2000):  # the call's exit goes out once its whole group is gone
        reply = _reap(ctrl, calls, pid) or reply
        try:
            os.killpg(pid, 0)
        except OSError:
            break
        time.sleep(0.001)
    if reply is not None:
        ctrl.send(reply)
def _start(ctrl, calls, message, fds, wake_w):
    _, call, argv, env, limits = message
    try:
        pid = os.fork()
    except OSError as e:
        os.write(fds[2], b"envhub session: cannot start the command: %s\n" % str(e).encode())
        ctrl.send(b"exit %d 126" % call)
        return
    if pid == 0:
        try:
            os.setsid()
            _signal.set_wakeup_fd(-1)
            for sig in (_signal.SIGCHLD, _signal.SIGINT, _signal.SIGPIPE, _signal.SIGXFSZ):
                _signal.signal(sig, _signal.SIG_DFL)
            for n, fd in enumerate(fds):
                os.dup2(fd, n)
            os.closerange(3, 1 << 20)
            os.chdir("/sandbox")
            for kind, soft, hard in limits:
                resource.setrlimit(kind, (soft, hard))
            _exec(argv, env)
        except BaseException as e:
            code = 127 if isinstance(e, FileNotFoundError) else 126
            try:
                os.write(2, b"envhub session: cannot run %s: %s\n"
                         % (argv[0].encode(), str(e).encode()))
            finally:
                os._exit(code)
    calls[pid] = call
def _exec(argv, env):
    if "/" in argv[0]:
        os.execve(argv[0], argv, env)
    error = FileNotFoundError(2, "No such file or directory")
    for folder in env.get("PATH", "/usr/bin:/bin").split(":"):
        try:
            os.execve(folder + "/" + argv[0], argv, env)
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as e:
            error = e
    raise error
_main(int(sys.argv[1]))
"""
"""The session's init (``python3 -S -I -c INIT CONTROL_FD``): its pid 1, or (forked from a
zygote, :data:`JOINED_INIT`) its pid 2, the reaper of every orphan of its calls."""

INIT_NAME = "envhub-session-init"
INIT_VARIABLE = "ENVHUB_SESSION_INIT"
INIT_LOADER = f"import os;exec(os.environ.pop({INIT_VARIABLE!r}))"
"""How a joined init's zygote starts: ``INIT_NAME -S -I -c INIT_LOADER``, its program in the
environment variable ``INIT_VARIABLE``. A pid-2 init can be killed by the session's calls,
unlike a pid 1: this keeps its command line short and free of words that a call's
``pkill -f python`` (or ``bash``, ``sh``...) would match."""

JOINED_INIT = zygotes.JOINER + INIT
"""A zygote's program whose runs are session inits (:mod:`envhub.sandbox.zygote`): the
sandbox's pid 1 is then the zygote init's ``sh``, which waits; the session's init is forked
into the sandbox (pid 2, the session's uid, no capabilities, ``no_new_privs``) with the
control socket as its descriptor 3, instead of starting an interpreter per session (~10 ms)."""


def scratch_flags(tmpfs: str) -> list[str]:
    """bubblewrap's flags binding the session's working folder and ``/tmp`` from its tmpfs."""
    return ["--bind", f"{tmpfs}/root", "/sandbox", "--bind", f"{tmpfs}/tmp", "/tmp"]


def rlimits(limits: Limits, helpers: int = 0) -> list[tuple[int, int, int]]:
    """A call's rlimits as ``(resource, soft, hard)``, the values a cold run's init sets
        (:func:`~envhub.sandbox.jail.ulimit_prologue`). RLIMIT_NPROC counts every process of the
        session's uid in its user namespace: the processes earlier calls left running too, and the
    init; ``helpers`` more are allowed for the session's own processes beyond one init (the
    waiting ``sh`` of a joined init), so that ``processes`` means the same either way."""
    mib, cpu = 1 << 20, limits.cpu_seconds
    return [
        (resource.RLIMIT_AS, limits.memory_mb * mib, limits.memory_mb * mib),
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_FSIZE, limits.file_size_mb * mib, limits.file_size_mb * mib),
        (resource.RLIMIT_NPROC, limits.processes + helpers, limits.processes + helpers),
        (resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
        (resource.RLIMIT_CORE, 0, 0),
    ]


def run_message(
    call: int, argv: Sequence[str], env: Mapping[str, str], limits: Limits, helpers: int = 0
) -> bytes:
    """The init's ``run`` request (the three stdio descriptors go beside it); ``helpers`` as
    for :func:`rlimits`."""
    return marshal.dumps(("run", call, list(argv), dict(env), rlimits(limits, helpers)))


def kill_message(call: int) -> bytes:
    """The init's ``kill`` request: SIGKILL the call's process group."""
    return marshal.dumps(("kill", call))


KILLALL = marshal.dumps(("killall",))
"""The init's ``killall`` request: SIGKILL every process of the sandbox but the init."""


def parse_reply(data: bytes) -> tuple[str, int, int]:
    """An init reply as ``(kind, call, status)`` (``("ready", 0, 0)`` for ``ready``).

    Raises:
        ValueError: Not a reply the init sends.
    """
    words = data.decode("ascii").split()
    if words == ["ready"]:
        return "ready", 0, 0
    if len(words) == 3 and words[0] == "exit":
        return "exit", int(words[1]), int(words[2])
    raise ValueError(f"unexpected reply from a session's init: {data[:80]!r}")
