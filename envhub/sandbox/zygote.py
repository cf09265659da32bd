"""Zygotes: one interpreter start shared by many Python runs (as root).

A ``print(1)`` run costs ~16 ms of CPU, and ~10 of them are the interpreter starting: at
concurrency 32 on 2 cores that start bounds the whole sandbox to ~100-125 runs/s. A zygote is
one interpreter, started once per set of interpreter flags on the host with the sandbox's
environment, that forks each run instead. The sandbox itself is built exactly as for any run
(bubblewrap's namespaces, mounts and uid, in a fresh world per run); its init waits, without
starting any program, until the run's status arrives (:func:`init_script`). For each run:

1. envhub sends the zygote the host pids of the sandbox's init and of bubblewrap, and the uid,
   with two file descriptors: the write end of the init's status pipe and the read end of the
   run's job pipe (the job itself, files and code, goes straight from envhub to the run: it
   never passes through the zygote's memory, so no run can find another's in its own).
   A session's init is sent with a second uid too, the real and saved uid it keeps (set by the
   joiner before it joins the user namespace, where that uid does not exist): see
   :meth:`Zygote.start`.
2. The zygote forks a *joiner*, which waits until bubblewrap has built the sandbox and started
   its init (never a half-built world), checks that the init and bubblewrap run as the run's
   uid, opens bubblewrap's stdin, stdout and stderr (the run's: envhub's pipes; the init's
   stdin is its status pipe while it waits), drops its groups and joins the sandbox's mount,
   pid, network, ipc, uts, cgroup and user namespaces, in that order.
3. The joiner forks the *run*, pid 2 of the sandbox as in a cold start. The run starts its own
   session, drops every capability (bounding set, ambient, effective, permitted, inheritable),
   takes the run's uid, sets no-new-privs, is dumpable again (as a cold start's exec makes it:
   its ``/proc`` entries are its uid's), closes every file descriptor but its stdio and the job
   pipe, and becomes the program through :mod:`envhub.sandbox.warm`'s stub (files, rlimits,
   ``__main__``): from here on it is what a warm run is.
4. A program that ends without an exception exits as the interpreter would, minus the
   teardown of every module (:data:`EXIT`).
5. The joiner waits for the run and writes its status to the init, which kills whatever the
   run left, and exits with it; envhub reads the run's output and status as for any run.

Measured on 2 cores (``print(1)`` at concurrency 32): 10-11 ms of CPU a run instead of ~18
cold, 157-169 runs/s instead of ~115.

What a program can still tell apart from a cold start, beyond a warm run's differences: its
parent is outside the sandbox (``os.getppid()`` is 0), and every run of one zygote shares its
hash seed (``str`` hashing order; no data) and the memory image of a zygote that has served
nothing but pids and uids. The zygote's own modules are dropped from ``sys.modules``.

Only as root: joining a sandbox's namespaces from the host takes privileges over them that an
unprivileged caller has only in a different order (not written; such runs start cold).
"""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence

from envhub.errors import SandboxError
from envhub.sandbox.warm import STUB

JOINER = r"""
import os, sys
_envhub_baseline = set(sys.modules)
def _envhub_zygote(control):
    import ctypes, gc, socket, time
    libc = ctypes.CDLL(None, use_errno=True)
    sock = socket.socket(fileno=control)
    gc.freeze()  # a run's collections leave the zygote's objects (and their pages) alone
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        try:
            message, fds, _, _ = socket.recv_fds(sock, 256, 2)
        except OSError:
            os._exit(0)
        if not message:
            os._exit(0)
        try:
            pid, outer, uid, owner, workdir = message.decode().split(" ", 4)
            pid, outer, uid, owner = int(pid), int(outer), int(uid), int(owner)
            status, job = fds
        except ValueError:
            for fd in fds:
                os.close(fd)
            continue
        if os.fork() == 0:
            sock.close()
            return _envhub_join(libc, ctypes, time, pid, outer, uid, owner, workdir, status, job)
        os.close(status)
        os.close(job)
def _envhub_join(libc, ctypes, time, pid, outer, uid, owner, workdir, status, job):
    code, stdio = 125, []
    try:
        def read(folder, name):
            fd = os.open(name, os.O_RDONLY, dir_fd=folder)
            try:
                return os.read(fd, 65536)
            finally:
                os.close(fd)
        def check_uid(folder):
            uids = [line for line in read(folder, "status").splitlines() if line[:4] == b"Uid:"]
            if uids != [b"Uid:\t%d\t%d\t%d\t%d" % (uid, uid, uid, uid)]:
                raise OSError("the sandbox runs as another uid")
        proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY)
        for _ in range(10000):
            if read(proc, "cmdline").startswith(b"/bin/sh\0"):
                break
            time.sleep(0.0005)
        else:
            raise OSError("the sandbox's init never started")
        check_uid(proc)
        bwrap = os.open(f"/proc/{outer}", os.O_RDONLY | os.O_DIRECTORY)
        check_uid(bwrap)
        stdio = [os.open(f"fd/{n}", mode, dir_fd=bwrap)
                 for n, mode in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY))]
        os.close(bwrap)
        spaces = [(os.open(f"ns/{name}", os.O_RDONLY, dir_fd=proc), flag) for name, flag in (
            ("mnt", 0x20000), ("pid", 0x20000000), ("net", 0x40000000), ("ipc", 0x8000000),
            ("uts", 0x4000000), ("cgroup", 0x2000000), ("user", 0x10000000))]
        os.close(proc)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)
        if owner != uid:  # real and saved uid `owner`, set while it is a uid here: see start()
            libc.prctl(8, 1, 0, 0, 0)  # PR_SET_KEEPCAPS: the capabilities to join stay
            os.setresuid(owner, uid, owner)
            caps = (ctypes.c_uint32 * 6)()
            libc.capget(header, caps)
            caps[0], caps[3] = caps[1], caps[4]  # effective again, as permitted
            if libc.capset(header, caps) != 0:
                raise OSError(ctypes.get_errno(), "capset")
        for fd, flag in spaces:
            if libc.setns(fd, flag) != 0:
                raise OSError(ctypes.get_errno(), "cannot join the sandbox's namespaces")
            os.close(fd)
        child = os.fork()
        if child == 0:
            try:
                os.setsid()
                for cap in range(64):
                    libc.prctl(24, cap, 0, 0, 0)
                libc.prctl(47, 4, 0, 0, 0)
                if owner == uid:
                    os.setresuid(uid, uid, uid)
                if libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:
                    raise OSError(ctypes.get_errno(), "capset")
                if libc.prctl(38, 1, 0, 0, 0) != 0:
                    raise OSError(ctypes.get_errno(), "no_new_privs")
                libc.prctl(4, 1, 0, 0, 0)  # dumpable again, as after an exec: /proc/self is its
                os.chdir(workdir)
                for n, fd in enumerate(stdio):
                    os.dup2(fd, n)
                moved = os.dup2(job, 3)
                os.closerange(4, 1 << 20)
                return moved
            except BaseException as e:
                try:
                    os.write(2, f"envhub sandbox: cannot start the run: {e}\n".encode())
                finally:
                    os._exit(125)
        for fd in (*stdio, job):
            os.close(fd)
        code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
        code = 128 - code if code < 0 else code
    except BaseException as e:
        if len(stdio) == 3:
            os.write(stdio[2], f"envhub sandbox: cannot start the run: {e}\n".encode())
    try:
        os.write(status, b"%d\n" % code)
    except OSError:
        pass
    os._exit(0)
sys.argv[1:] = [str(_envhub_zygote(int(sys.argv[1])))]
for _envhub_name in set(sys.modules) - _envhub_baseline:
    del sys.modules[_envhub_name]
del _envhub_zygote, _envhub_join, _envhub_baseline, _envhub_name
"""
"""The zygote's loop, the joiner and the run's set-up, in the interpreter it starts; the
:data:`~envhub.sandbox.warm.STUB` follows it (the run returns from the loop to module level, so
the program's exit is the interpreter's own: ``atexit``, threads, buffered output)."""

EXIT = r"""
def _envhub_exit():
    import gc
    def flushed():
        try:
            for stream in (sys.stdout, sys.stderr):
                if stream is not None and not stream.closed:
                    stream.flush()
            return True
        except Exception:
            return False
    if "threading" in sys.modules:
        sys.modules["threading"]._shutdown()
    import atexit
    atexit._run_exitfuncs()
    if not flushed():
        return
    gc.collect()
    main = sys.modules.get("__main__")
    if main is not None:
        main.__dict__.clear()
    gc.collect()
    if flushed():
        os._exit(0)
_envhub_exit()
"""
"""How a run that ends without an exception exits: what the interpreter's own exit does that a
program can see, in its order (join its threads, ``atexit``, flush stdout and stderr, collect
cycles, destroy ``__main__``'s objects so that their ``__del__`` and unflushed files run),
then ``os._exit``; when a flush fails, the interpreter's own exit reports it (status 120).
The teardown of every module it skips is what a forked interpreter's exit mostly costs (~2 ms
of copy-on-write faults a run). An exception or ``sys.exit`` takes the interpreter's own
exit."""

SOURCE = JOINER + STUB + EXIT
"""What a zygote runs (``python FLAGS -c SOURCE CONTROL_FD``)."""


def init_script(status_fd: int) -> str:
    """The sandbox init of a zygote run: wait for the run's status on the pipe at
    ``status_fd`` (reopened through ``/proc``: dash redirects only single-digit fds), kill
    whatever the run left behind, exit with the status (125 when none came: the run never
    started)."""
    return (
        f"read status < /proc/self/fd/{status_fd}\n"
        'case "$status" in ""|*[!0-9]*) status=125;; esac\n'
        "kill -9 -1 2>/dev/null\n"
        "exit $status\n"
    )


class Zygote:
    """One interpreter started with ``flags`` that forks runs into sandboxes (see the module
    docstring).

    Args:
        python: The interpreter (the sandbox's: the same files inside and out).
        flags: Its flags (``-I``, ``-S``...), those of the runs it serves.
        env: The environment of every run (the sandbox's).
        workdir: The runs' working folder inside the sandbox.
        source: What it runs: :data:`JOINER` and, after it, what a run does (default
            :data:`SOURCE`; a local session's init: :mod:`envhub.sandbox.session_init`).
        name: Its ``argv[0]`` (default: ``python``), what its runs' command line starts with.
    """

    def __init__(
        self,
        python: str,
        flags: Sequence[str],
        env: Mapping[str, str],
        workdir: str,
        source: str = SOURCE,
        name: str | None = None,
    ) -> None:
        self.workdir = workdir
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [name or python, *flags, "-c", source, str(theirs.fileno())],
                executable=python if name else None,
                pass_fds=[theirs.fileno()],
                env=dict(env),
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            ours.close()
            raise SandboxError(f"cannot start a zygote ({python}): {e}") from e
        finally:
            theirs.close()
        self._socket = ours
        self._lock = threading.Lock()

    def start(
        self,
        init_pid: int,
        bwrap_pid: int,
        uid: int,
        status_fd: int,
        job_fd: int,
        owner: int | None = None,
    ) -> None:
        """Fork a run into the sandbox whose init is ``init_pid`` (bubblewrap's ``bwrap_pid``,
        whose stdio the run takes), as ``uid``; it writes its status to ``status_fd`` and reads
        its job from ``job_fd`` (both sent, not closed). With ``owner`` (a host uid that no
        process of the sandbox has) the run's real and saved uid are ``owner`` and only its
        effective uid is ``uid``: the sandbox's processes cannot signal or trace it, and it can
        still give its children ``uid`` (a session's init: :mod:`envhub.sandbox.session_init`)."""
        owned = uid if owner is None else owner
        message = f"{init_pid} {bwrap_pid} {uid} {owned} {self.workdir}".encode()
        try:
            with self._lock:
                socket.send_fds(self._socket, [message], [status_fd, job_fd])
        except OSError as e:
            raise SandboxError(f"the zygote is gone ({e})") from e

    @property
    def alive(self) -> bool:
        """Whether the zygote is still running."""
        return self.proc.poll() is None

    def stop(self) -> None:
        """End the zygote (runs it forked go on) and wait for it."""
        self._socket.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
