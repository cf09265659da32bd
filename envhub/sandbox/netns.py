"""One network namespace per uid of the local sandbox's pool, made once and reused by its runs.

bubblewrap's ``--unshare-net`` makes a network namespace for every run, and the kernel tears it
down after: ~1.5 ms of a ~17 ms ``print(1)`` run on 2 cores (measured). As root the local
backend instead starts each run inside a namespace kept for its uid (``nsenter --net=...``,
which also drops to the uid as ``setpriv`` did) and tells bubblewrap to keep it
(``--share-net``). Each namespace has only a loopback interface, up, as bubblewrap's own. It is
never shared by two runs at once: a uid is handed out again only once it owns no process, so a
run finds nothing of an earlier one but, at most, its closed TCP connections' TIME_WAIT entries
(a fixed port bound without ``SO_REUSEADDR`` may then be refused for a minute). The sandbox's
root cannot reconfigure it: the namespace belongs to the host's user namespace, where the
sandbox has no capability.

Where the namespace cannot be made (not root, or a container without ``CAP_SYS_ADMIN``) runs
fall back to bubblewrap's own ``--unshare-net``.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import socket
import struct
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1

_lock = threading.Lock()
_namespaces: dict[int, int] = {}
"""uid -> an open file descriptor of its namespace (a forked child inherits them)."""
_unavailable: list[str] = []


def netns_path(uid: int) -> str | None:
    """A path naming ``uid``'s network namespace for ``nsenter --net=``, made on first use;
    ``None`` where this process cannot make one (then bubblewrap makes one per run)."""
    with _lock:
        if _unavailable:
            return None
        fd = _namespaces.get(uid)
        if fd is None:
            try:
                fd = _namespaces[uid] = _new_namespace()
            except OSError as e:
                _unavailable.append(str(e))
                return None
    return f"/proc/{os.getpid()}/fd/{fd}"


def _new_namespace() -> int:
    """A new network namespace with its loopback up, as an open descriptor."""

    def make() -> int:
        _check(_libc().unshare(_CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _loopback_up()
        except OSError:
            os.close(fd)
            raise
        return fd

    return _on_own_thread(make, "envhub-netns")


def listen_in(namespace: str, port: int) -> socket.socket:
    """A TCP socket listening on ``127.0.0.1:port`` in the network namespace at the path
    ``namespace`` (``/proc/PID/ns/net``), held by this process: a sandbox without a network
    can then reach a service of the host, and only that one, through whatever this process
    does with the connections it accepts. Non-blocking.

    Raises:
        OSError: The namespace cannot be entered (not root), or the port is taken there.
    """

    def make() -> socket.socket:
        fd = os.open(namespace, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _check(_libc().setns(fd, _CLONE_NEWNET), f"setns({namespace})")
        finally:
            os.close(fd)
        # IPPROTO_TCP named, so that asyncio sets TCP_NODELAY on the accepted connections.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen(64)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return sock

    return _on_own_thread(make, "envhub-netns-listen")


def _on_own_thread(work: Callable[[], T], name: str) -> T:
    """``work()`` run on a thread of its own, which then ends (``unshare`` and ``setns`` move
    only the calling thread): its result, or the ``OSError`` it raised, raised here."""
    done: list[T] = []
    failed: list[OSError] = []

    def run() -> None:
        try:
            done.append(work())
        except OSError as e:
            failed.append(e)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return done[0]


def _check(status: int, call: str) -> None:
    """Raise the ``OSError`` of a libc ``call`` that returned ``status`` != 0."""
    if status != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{call}: {os.strerror(error)}")


def _loopback_up() -> None:
    """Bring ``lo`` of the calling thread's network namespace up."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | _IFF_UP))


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)
