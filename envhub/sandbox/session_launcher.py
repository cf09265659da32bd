"""The launcher of local sessions: a root helper that mounts each session's files and starts its
bubblewrap (:mod:`envhub.sandbox.local_session`).

One per envhub process, started on the first session (:func:`launcher`). For each session it
forks a child that, in a mount namespace of its own (nothing of it is visible on the host):

1. mounts a tmpfs of ``disk_mb`` at :data:`MOUNT_POINT` (``nosuid``, ``nodev``) holding the
   session's writable layer, ``/tmp`` and the folders it shows elsewhere (``shown/0``, ...:
   :class:`~envhub.sandbox.session.SessionPaths`), all owned by the session's uid;
2. makes the session's working folder there: an overlay whose lower layer is the workspace,
   bound through an *idmapped* mount (the workspace's owner appears as the session's uid, so
   its files are the session's own: ``chmod``, ``git``'s ownership check; the workspace on disk
   is never written; on a filesystem without idmapped mounts, a plain read-only bind: the files
   then appear owned by ``nobody``), or a copy of the workspace (``start="copy"``), or nothing;
3. takes the descriptors it was sent as 2 (stderr), 3 (the init's control socket) and 4
   (bubblewrap's info pipe), closes every other, and execs the uid drop and bubblewrap.

All of that is syscalls in a forked Python (``unshare``, ``mount``, ``open_tree``,
``mount_setattr``, ``move_mount``): no ``mount`` or ``mkdir`` program per session. The idmap's
user namespace is made once per (owner, uid) pair. The launcher sends back a pidfd of the child
(bubblewrap, once it has exec'd), through which envhub waits for it.

When envhub's end of the launcher's socket closes (envhub exited, or was killed however), the
launcher SIGKILLs every bubblewrap it started (``--die-with-parent`` then kills each sandbox)
and exits.
"""

from __future__ import annotations

import marshal
import os
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from envhub.errors import SandboxError

MOUNT_POINT = Path(tempfile.gettempdir()) / "envhub-session-mount"
"""Where each session mounts its tmpfs, in its own mount namespace (the host's stays empty)."""

SHOWN = "shown"
"""The folder of each session's tmpfs holding the folders it shows elsewhere (``shown/0``, ...;
the name :data:`SOURCE` makes)."""
FDS = {"stderr": 2, "control": 3, "info": 4}
"""The descriptor numbers bubblewrap and the init get: name them in their argv."""

SOURCE = r"""
import ctypes, marshal, os, select, signal, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.argtypes = None
MP = sys.argv[2]
def check(result, what):
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result
def userns(owner, uid, cache={}):
    if (owner, uid) in cache:
        return cache[owner, uid]
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(hold_w)  # its read below ends when the launcher closes its own end
        ok = libc.unshare(0x10000000) == 0
        os.write(ready_w, b"1" if ok else b"0")
        os.read(hold_r, 1)
        os._exit(0)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError("cannot make a user namespace for the workspace's idmap")
        for name, line in (("uid_map", f"{owner} {uid} 1"), ("setgroups", "deny"),
                           ("gid_map", f"{owner} {uid} 1")):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(line)
        fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        for end in (ready_r, ready_w, hold_r, hold_w):
            os.close(end)
        os.waitpid(pid, 0)
    cache[owner, uid] = fd
    return fd
def mount_files(workspace, owner, uid, size, mode, shown):
    check(libc.unshare(0x20000), "unshare(CLONE_NEWNS)")
    check(libc.mount(None, b"/", None, (1 << 14) | (1 << 18), None), "make / private")
    options = f"size={size},mode=0755".encode()
    check(libc.mount(b"envhub-session", MP.encode(), b"tmpfs", 2 | 4, options), "mount tmpfs")
    folders = [f"shown/{i}" for i in range(shown)]
    for name in ("upper", "work", "root", "tmp", "lower", "shown", *folders):
        os.mkdir(f"{MP}/{name}", 0o755)
    for name in ("upper", "root", "tmp", *folders):
        os.chown(f"{MP}/{name}", uid, uid)
    if mode == "overlay":
        tree = check(libc.syscall(428, -100, workspace.encode(), 1 | os.O_CLOEXEC | 0x8000),
                     "open_tree(workspace)")
        attr = struct.pack("QQQQ", 0x100000 | 1, 0, 0, userns(owner, uid))
        if libc.syscall(442, tree, b"", 0x1000 | 0x8000, attr, len(attr)) != 0:
            attr = struct.pack("QQQQ", 1, 0, 0, 0)  # a filesystem without idmapped mounts
            check(libc.syscall(442, tree, b"", 0x1000 | 0x8000, attr, len(attr)), "bind")
        check(libc.syscall(429, tree, b"", -100, f"{MP}/lower".encode(), 4), "move_mount")
        os.close(tree)
        layers = f"lowerdir={MP}/lower,upperdir={MP}/upper,workdir={MP}/work".encode()
        check(libc.mount(b"envhub-session", f"{MP}/root".encode(), b"overlay", 2 | 4, layers),
              "mount overlay")
    elif mode == "copy":
        for argv in (["cp", "-a", workspace + "/.", MP + "/root/"],
                     ["chown", "-R", f"{uid}:{uid}", MP + "/root"]):
            pid = os.posix_spawnp(argv[0], argv, {"PATH": "/usr/bin:/bin"})
            if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
                raise OSError(f"{argv[0]} failed")
def child(request, fds):
    workspace, owner, uid, size, mode, argv, shown = request
    errors = fds[0]
    try:
        mount_files(workspace, owner, uid, size, mode, shown)
        null = os.open("/dev/null", os.O_RDWR)
        high = [os.dup2(fd, 200 + i) for i, fd in enumerate([null, *fds])]
        for target, fd in zip((0, 1, 2, 3, 4), [high[0], high[0], *high[1:]]):
            os.dup2(fd, target)
        errors = 2
        os.closerange(5, 1 << 20)
        os.execve(argv[0], argv, {"PATH": "/usr/bin:/bin"})
    except BaseException as e:
        try:
            os.write(errors, f"envhub session: cannot start: {e}\n".encode())
        finally:
            os._exit(125)
def main(control):
    sock = socket.socket(fileno=control)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    children = set()
    while True:
        try:
            while (pid := os.waitpid(-1, os.WNOHANG)[0]) > 0:
                children.discard(pid)
        except ChildProcessError:
            pass
        ready = select.select([sock, wake_r], [], [])[0]
        if wake_r in ready:
            while True:
                try:
                    os.read(wake_r, 256)
                except BlockingIOError:
                    break
        if sock not in ready:
            continue
        try:
            message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 8)
        except OSError:
            message, fds = b"", []
        if not message:  # envhub has gone: so do its sessions (reaped here, not by pid 1)
            for pid in children:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
            for pid in children:
                try:
                    os.waitpid(pid, 0)
                except OSError:
                    pass
            os._exit(0)
        try:
            request = marshal.loads(message)
            if request[4] == "overlay":
                userns(request[1], request[2])
            pid = os.fork()
        except BaseException as e:
            sock.send(f"error {e}".encode())
        else:
            if pid == 0:
                sock.close()
                child(request, fds)
            children.add(pid)
            pidfd = os.pidfd_open(pid)
            socket.send_fds(sock, [b"ok %d" % pid], [pidfd])
            os.close(pidfd)
        for fd in fds:
            os.close(fd)
main(int(sys.argv[1]))
"""
"""The launcher's program (``python -I -c SOURCE CONTROL_FD MOUNT_POINT``)."""


class Launcher:
    """One launcher process (see the module docstring) and envhub's end of its socket."""

    def __init__(self) -> None:
        MOUNT_POINT.mkdir(mode=0o755, exist_ok=True)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-c", SOURCE, str(theirs.fileno()), str(MOUNT_POINT)],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            ours.close()
            raise SandboxError(f"cannot start the session launcher: {e}") from e
        finally:
            theirs.close()
        self._socket = ours
        self._socket.settimeout(30)
        self._lock = threading.Lock()
        self.pid = os.getpid()

    def launch(
        self,
        workspace: str,
        owner: int,
        uid: int,
        size: int,
        mode: str,
        argv: Sequence[str],
        fds: Sequence[int],
        shown: int = 0,
    ) -> tuple[int, int]:
        """Start ``argv`` (absolute program path) with the session's files mounted and
        ``shown`` empty folders made for it (``shown/0``, ...); ``fds``: its stderr, the init's
        control socket, bubblewrap's info pipe (sent, not closed). Returns the started
        process's pid and a pidfd of it."""
        message = marshal.dumps((workspace, owner, uid, size, mode, list(argv), shown))
        with self._lock:
            try:
                socket.send_fds(self._socket, [message], list(fds))
                reply, pidfds, _, _ = socket.recv_fds(self._socket, 4096, 1)
            except OSError as e:
                raise SandboxError(f"the session launcher is gone ({e})") from e
        words = reply.split()
        if words[:1] != [b"ok"] or len(words) != 2 or len(pidfds) != 1:
            for fd in pidfds:
                os.close(fd)
            raise SandboxError(f"the session launcher failed: {reply.decode(errors='replace')}")
        return int(words[1]), pidfds[0]

    @property
    def alive(self) -> bool:
        """Whether the launcher runs and belongs to this process (not a forked parent's)."""
        return self.pid == os.getpid() and self.proc.poll() is None


_LAUNCHER: Launcher | None = None
_LOCK = threading.Lock()


def _forget_in_child() -> None:
    """In a forked child: close the parent's launcher socket (the launcher must see it close
    when the parent dies, whoever else lives on) and start another when needed."""
    global _LAUNCHER, _LOCK
    if _LAUNCHER is not None:
        _LAUNCHER._socket.close()
    _LAUNCHER, _LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)


def launcher() -> Launcher:
    """This process's launcher, started when there is none (or it died)."""
    global _LAUNCHER
    with _LOCK:
        if _LAUNCHER is None or not _LAUNCHER.alive:
            _LAUNCHER = Launcher()
        return _LAUNCHER
