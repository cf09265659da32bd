"""The inside of a local session: its init, and what it is told.

A local session (:mod:`envhub.sandbox.local_session`) is one bubblewrap sandbox built as any
run's (:mod:`envhub.sandbox.jail`: same namespaces, mounts, uid, no capabilities,
``no_new_privs``) whose pid 1 is its init, a small loop that forks each command on request:
the compiled one (:mod:`envhub.sandbox.session_init_c`, C built once with the system's ``cc``)
where it could be built, else :data:`INIT`, the same loop in Python. Its working folder and
``/tmp`` live on a tmpfs of ``disk_mb`` that the launcher mounted
(:mod:`envhub.sandbox.session_launcher`).

The init talks to envhub over a ``SOCK_SEQPACKET`` socket that only it holds:

- envhub -> init: NUL-ended fields (:func:`run_message`): ``run ID RLIMITS... ARGC ARGV...
  "" ENV...`` with the call's stdin, stdout and stderr as three file descriptors;
  ``kill ID``: SIGKILL the call's process group; ``killall``: SIGKILL every other process of
  the sandbox.
- init -> envhub: ASCII lines: ``ready``; ``exit ID STATUS`` when the call's first process
  ended (``128 + n`` for signal n; 126/127 when it could not start); for a killed call, once
  every process of its group has gone too.

Each command starts in a session of its own (its process group is what a timeout kills), with
the default signal dispositions, its rlimits, only its three descriptors, in ``/sandbox``.
The init searches ``PATH`` itself (``os.execvpe``'s search cost ~1.6 ms a call). It reaps
every orphan; it makes itself non-dumpable first, so that commands (the same uid) cannot
ptrace it or open its ``/proc`` files to forge later calls' results. No call can kill it
(``kill -9 -1``, ``kill -9 PID`` of it): as the sandbox's pid 1 it gets no signal from them
but the SIGCHLD it handles; forked from a zygote (pid 2) its real and saved uid are the
*keeper* uid (:func:`~envhub.sandbox.uids.keeper_uid`), which no process of a sandbox has,
and only its effective uid is the session's: the kernel lets a process signal another only
when one of its real and effective uids is the other's real or saved uid (and ptrace needs
all three the same), while the init may still set its children's three uids to its effective
one (which each call's child does first) and signal them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from envhub.sandbox import zygote as zygotes
from envhub.sandbox.base import Limits, rlimits
from envhub.sandbox.session_launcher import SHOWN

if TYPE_CHECKING:
    from envhub.sandbox.session import SessionPaths

COMPILED_PATH = "/.envhub-session-init"
"""Where a session whose sandbox has the compiled init (:mod:`envhub.sandbox.session_init_c`)
sees it (a read-only bind on the sandbox's root)."""

INIT = r"""
import os, sys, _signal, _socket, select, resource
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
    uid = os.geteuid()  # the calls' (a joined init's real uid is one they do not have)
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
            fields = data.split(b"\0")[:-1]
            if fields[0] == b"run" and len(fds) == 3:
                _start(ctrl, calls, fields, fds, uid)
            elif fields[0] == b"kill":
                for pid, call in list(calls.items()):
                    if call == int(fields[1]):
                        _kill_group(ctrl, calls, pid)
            elif fields[0] == b"killall":
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
_KINDS = (resource.RLIMIT_AS, resource.RLIMIT_CPU, resource.RLIMIT_FSIZE,
          resource.RLIMIT_NPROC, resource.RLIMIT_NOFILE, resource.RLIMIT_CORE)
def _start(ctrl, calls, fields, fds, uid):
    call, argc = int(fields[1]), int(fields[14])
    argv = fields[15:15 + argc]
    env = dict(entry.split(b"=", 1) for entry in fields[16 + argc:])
    try:
        pid = os.fork()
    except OSError as e:
        os.write(fds[2], b"envhub session: cannot start the command: %s\n" % str(e).encode())
        ctrl.send(b"exit %d 126" % call)
        return
    if pid == 0:
        try:
            os.setsid()
            os.setresuid(uid, uid, uid)
            _signal.set_wakeup_fd(-1)
            for sig in (_signal.SIGCHLD, _signal.SIGINT, _signal.SIGPIPE, _signal.SIGXFSZ):
                _signal.signal(sig, _signal.SIG_DFL)
            for n, fd in enumerate(fds):
                os.dup2(fd, n)
            os.closerange(3, 1 << 20)
            os.chdir("/sandbox")
            for n, kind in enumerate(_KINDS):
                resource.setrlimit(kind, (int(fields[2 + 2 * n]), int(fields[3 + 2 * n])))
            _exec(argv, env)
        except BaseException as e:
            code = 127 if isinstance(e, FileNotFoundError) else 126
            try:
                os.write(2, b"envhub session: cannot run %s: %s\n" % (argv[0], str(e).encode()))
            finally:
                os._exit(code)
    calls[pid] = call
def _exec(argv, env):
    if b"/" in argv[0]:
        os.execve(argv[0], argv, env)
    error = FileNotFoundError(2, "No such file or directory")
    for folder in env.get(b"PATH", b"/usr/bin:/bin").split(b":"):
        try:
            os.execve(folder + b"/" + argv[0], argv, env)
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
environment variable ``INIT_VARIABLE``: its command line stays short and free of words that a
call's ``pkill -f python`` (or ``bash``, ``sh``...) would match."""

JOINED_INIT = zygotes.JOINER + INIT
"""A zygote's program whose runs are session inits (:mod:`envhub.sandbox.zygote`): the
sandbox's pid 1 is then the zygote init's ``sh``, which waits; the session's init is forked
into the sandbox (pid 2, the session's uid as its effective one and the keeper uid as its
real and saved ones, no capabilities, ``no_new_privs``) with the control socket as its
descriptor 3, instead of starting an interpreter per session (~10 ms). Only the Python init
runs this way (the compiled one starts as pid 1 as fast)."""


def scratch_flags(tmpfs: str, paths: SessionPaths | None = None) -> list[str]:
    """bubblewrap's flags binding the session's working folder and ``/tmp`` from its tmpfs,
    then its :class:`~envhub.sandbox.session.SessionPaths`: the working folder again at each
    ``workdir`` path, and the launcher's folder ``shown/i`` at ``folders[i]``."""
    flags = ["--bind", f"{tmpfs}/root", "/sandbox", "--bind", f"{tmpfs}/tmp", "/tmp"]
    if paths is not None:
        for path in paths.workdir:
            flags += ["--bind", f"{tmpfs}/root", path]
        for i, path in enumerate(paths.folders):
            flags += ["--bind", f"{tmpfs}/{SHOWN}/{i}", path]
    return flags


def run_message(call: int, argv: Sequence[str], env: Mapping[str, str], limits: Limits) -> bytes:
    """The init's ``run`` request (the three stdio descriptors go beside it): NUL-ended fields
    ``run``, the call's id, the soft and hard value of each of
    :func:`~envhub.sandbox.base.rlimits` (in its order, the order of the init's ``_KINDS``),
    the number of arguments, the arguments, an empty field, then ``NAME=value`` for each
    variable of the environment.

    RLIMIT_NPROC is ``limits.processes``: it counts every process of the session's uid in its
    user namespace, the processes earlier calls left running too, and one more of the
    session's own (its init, or a joined init's waiting ``sh``: the init itself then has
    another real uid), so that ``processes`` means the same either way.

    Raises:
        ValueError: An argument or variable holds a NUL byte, or a variable's name is empty or
            holds ``=`` (no program could be given it).
    """
    variables = [f"{name}={value}" for name, value in env.items()]
    if any("=" in name or not name for name in env) or any(
        "\0" in text for text in (*argv, *variables)
    ):
        raise ValueError("an argument or environment variable holds a NUL byte or a bad name")
    numbers = [n for _, soft, hard in rlimits(limits, limits.processes) for n in (soft, hard)]
    fields = [b"run", b"%d" % call, *(b"%d" % n for n in numbers), b"%d" % len(argv)]
    fields += [*map(os.fsencode, argv), b"", *map(os.fsencode, variables)]
    return b"\0".join(fields) + b"\0"


def kill_message(call: int) -> bytes:
    """The init's ``kill`` request: SIGKILL the call's process group."""
    return b"kill\0%d\0" % call


KILLALL = b"killall\0"
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
