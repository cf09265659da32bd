"""The local backend's mechanism: the command line that confines a run, flag by flag.

Everything that decides what a sandboxed process can see and do is built here, from explicit
inputs: a :class:`Jail` (the sandbox's settings, fixed when it is made), the run's uid and its
:class:`~envhub.sandbox.base.Limits`. Which uid a run gets, and whether it starts cold, warm or
forked from a zygote, is policy: :mod:`envhub.sandbox.local`, which calls these. What this
contains and what it does not: :mod:`envhub.sandbox.threat_model`.

A run is ``[prlimit <limits> --] <uid drop> bwrap <flags> -- /bin/sh -c <init> sh <command>``
(:func:`bwrap_argv`):

- **The rlimits.** The sandbox's init (its pid 1) sets them with its ``ulimit`` builtin
  (:func:`ulimit_prologue`) before the command starts, and stops the run with status 125 if one
  cannot be set. That is where ``/bin/sh`` is dash (Debian, Ubuntu; :func:`shell_is_dash`);
  with another shell ``prlimit <limits> --`` goes in front instead, one more exec per run.
  RLIMIT_NPROC counts the run's own processes (:func:`nproc`).
- **The uid drop** (as root; :func:`prefix_argv`). ``setpriv --reuid U --regid U
  --clear-groups --no-new-privs --``, or, where the uid keeps a network namespace
  (:mod:`envhub.sandbox.netns`), ``nsenter --net=<U's namespace> --setuid U --setgid U --``
  in its place. The process drops to an unprivileged uid of its own: RLIMIT_NPROC does not bind
  uid 0, so a fork bomb is only contained this way. When envhub is not root, runs use the
  caller's own uid (the process limit then counts the caller's processes too).
- **The world bubblewrap builds** (:func:`bwrap_flags`):

  - ``--unshare-all --unshare-user``: new user, pid, network, ipc, uts and cgroup namespaces
    (``--share-net`` only with ``Limits(network=True)``, or to keep the uid's namespace that
    ``nsenter`` entered: it has nothing but a loopback);
  - ``--disable-userns``: no nested user namespaces;
  - ``--die-with-parent``: every process killed when the caller dies; ``--new-session``: a
    session of its own, with no controlling terminal; ``--as-pid-1``: the init shell is pid 1
    (bubblewrap's own init would leave a zombie for the host's init to reap, holding a slot of
    the uid's process limit meanwhile); ``--hostname sandbox``;
  - the system's ``/usr`` read-only, ``/lib``, ``/bin``... as links into it (read-only binds
    where they are real folders); ``/etc`` a prepared read-only copy of the few host files
    programs need (the loader's cache, the alternatives, the time zone:
    :mod:`envhub.sandbox.system_files`), the resolver's and TLS files bound on top only when
    the run has the network; the sandbox's ``ro_binds`` read-only at their place;
  - a fresh ``/proc`` and ``/dev``; the working folder ``/sandbox`` a private tmpfs of
    ``disk_mb``, ``/tmp`` pointing into it (a session binds its own: see
    :func:`shown_path_problem` for the other folders it may show);
  - ``--clearenv``: no environment variables but :data:`ENV`;
  - the call's files copied in from memfds (:func:`input_files`);
  - ``--info-fd``: bubblewrap reports the init's host pid (the uid is free once it is gone);
  - ``--remount-ro /`` last: the root bubblewrap builds is a tmpfs with no size limit.

The weaker ``isolation="rlimits"`` fallback (no namespaces) is :mod:`envhub.sandbox.fallback`.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal

from envhub.sandbox import _process, netns
from envhub.sandbox.base import WORKDIR, Limits, prlimit_argv, rlimits
from envhub.sandbox.system_files import prepared_etc

Isolation = Literal["bwrap", "rlimits"]
_RO_SYSTEM = ("/usr",)
_NET_FILES = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
)
_LINKS = {"/lib": "usr/lib", "/lib64": "usr/lib64", "/bin": "usr/bin", "/sbin": "usr/sbin"}
ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORKDIR,
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
"""The whole environment of a run (``--clearenv`` drops every other variable)."""


SYSTEM_PATHS = (*_RO_SYSTEM, *_LINKS, "/etc", "/proc", "/dev", WORKDIR, "/tmp")
"""What every sandbox's root holds (besides the jail's ``ro_binds``)."""


@dataclass(frozen=True)
class Jail:
    """How a local sandbox confines every run: its settings, fixed when it is made."""

    isolation: Isolation
    """``"bwrap"``, or the ``"rlimits"`` fallback (:mod:`envhub.sandbox.fallback`)."""
    as_root: bool
    """Whether envhub runs as root: each run then drops to a uid of its own."""
    bwrap: str = "bwrap"
    """The bubblewrap executable."""
    ro_binds: tuple[str, ...] = ()
    """Extra host paths mounted read-only at the same place."""
    limits_in_init: bool = False
    """Whether the sandbox's init sets the rlimits (dash's ``ulimit``), not ``prlimit``."""
    keeps_netns: bool = False
    """Whether runs start in their uid's kept network namespace (:mod:`envhub.sandbox.netns`),
    not one bubblewrap makes per run."""


@functools.lru_cache(maxsize=4)
def bwrap_problem(bwrap: str = "bwrap") -> str | None:
    """Why bubblewrap cannot sandbox here, or ``None`` when it can (checked once per process)."""
    path = shutil.which(bwrap)
    if path is None:
        return f"`{bwrap}` is not installed"
    links = [
        x
        for link, target in _LINKS.items()
        if os.path.islink(link)
        for x in ("--symlink", target, link)
    ]
    probe = [
        path,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
        *links,
        "--",
        "/usr/bin/true",
    ]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap failed to start: {e}"
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip()
        return f"bubblewrap cannot create namespaces here: {reason}"
    return None


def bwrap_argv(
    jail: Jail,
    uid: int,
    limits: Limits,
    flags: list[str],
    info_fd: int,
    command: list[str],
    rlimits: bool = True,
    scratch: list[str] | None = None,
) -> list[str]:
    """The whole argv of a bubblewrap run of ``command`` as ``uid`` (see :func:`prefix_argv`
    for ``rlimits``), with extra bubblewrap ``flags``; bubblewrap writes the sandbox init's
    host pid to ``info_fd``. ``scratch``: the flags that make the working folder and ``/tmp``
    (default :func:`scratch_flags`; a session binds its own)."""
    # No network: the uid's kept namespace (bubblewrap keeps it), else a new one per run.
    namespace = None if limits.network or not jail.keeps_netns else netns.netns_path(uid)
    # The root bubblewrap builds is a tmpfs with no size limit: make it read-only last.
    return [
        *prefix_argv(jail, uid, limits, namespace, rlimits=rlimits),
        jail.bwrap,
        *bwrap_flags(jail, limits, keep_net=namespace is not None, scratch=scratch),
        *flags,
        "--info-fd",
        str(info_fd),
        "--remount-ro",
        "/",
        "--",
        *command,
    ]


def bwrap_flags(
    jail: Jail, limits: Limits, keep_net: bool = False, scratch: list[str] | None = None
) -> list[str]:
    """bubblewrap's flags for a run under ``limits`` (see the module docstring); with
    ``keep_net``, it keeps the network namespace it was started in; ``scratch`` replaces
    :func:`scratch_flags`."""
    flags = [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",
        "--hostname",
        "sandbox",
    ]
    if limits.network or keep_net:
        flags += ["--share-net"]
    for path in _RO_SYSTEM:
        flags += ["--ro-bind", path, path]
    for link, target in _LINKS.items():
        if os.path.islink(link) or not os.path.exists(link):
            flags += ["--symlink", target, link]
        else:  # a system whose /lib is a real folder
            flags += ["--ro-bind", link, link]
    on_top = (*(_NET_FILES if limits.network else ()), *jail.ro_binds)
    flags += ["--ro-bind", prepared_etc(on_top), "/etc"]
    for path in on_top:
        flags += ["--ro-bind-try", path, path]
    flags += ["--proc", "/proc", "--dev", "/dev"]
    flags += scratch_flags(limits) if scratch is None else scratch
    flags += [
        "--clearenv",
        *[x for key, value in ENV.items() for x in ("--setenv", key, value)],
        "--chdir",
        WORKDIR,
    ]
    return flags


def shown_path_problem(jail: Jail, path: str) -> str | None:
    """Why a session of ``jail`` cannot show a folder of its own at ``path`` (absolute and
    normalized), or ``None`` when it can. bubblewrap makes the mount point in the root it
    builds, after the system's mounts: a path at or under one of :data:`SYSTEM_PATHS` or the
    ``ro_binds``, or above a ``ro_bind`` (it would hide it), cannot be one; nor a hidden name at
    the top (``/.envhub-session-init``: envhub's own)."""
    for mount in SYSTEM_PATHS:
        if _within(path, mount):
            return f"{path} is {mount} or inside it, which every sandbox has"
    for mount in jail.ro_binds:
        if _within(path, mount) or _within(mount, path):
            return f"{path} meets {mount}, which the sandbox mounts read-only"
    if path.split("/")[1].startswith("."):
        return f"{path}: hidden names at the top of a sandbox are envhub's own"
    return None


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def scratch_flags(limits: Limits) -> list[str]:
    """The working folder, a private tmpfs of ``disk_mb``, with ``/tmp`` pointing into it."""
    return [
        "--size",
        str(limits.disk_mb << 20),
        "--tmpfs",
        WORKDIR,
        "--dir",
        f"{WORKDIR}/.tmp",
        "--symlink",
        f"{WORKDIR}/.tmp",
        "/tmp",
    ]


def prefix_argv(
    jail: Jail, uid: int, limits: Limits, namespace: str | None = None, rlimits: bool = True
) -> list[str]:
    """The argv before bubblewrap (or the rlimits fallback's command): ``prlimit`` unless the
    init (or a warm sandbox's stub: ``rlimits=False``) sets the limits, then (as root) the
    drop to ``uid``: ``nsenter``'s, into the network namespace at ``namespace`` when there
    is one, else ``setpriv``'s."""
    prlimit = rlimits and not jail.limits_in_init
    argv = prlimit_argv(limits, nproc(jail, uid, limits)) if prlimit else []
    if namespace is not None:  # nsenter -G also drops the supplementary groups
        return [
            *argv,
            "nsenter",
            f"--net={namespace}",
            f"--setuid={uid}",
            f"--setgid={uid}",
            "--",
        ]
    if jail.as_root:
        argv += [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--no-new-privs",
            "--",
        ]
    return argv


def nproc(jail: Jail, uid: int, limits: Limits) -> int:
    """RLIMIT_NPROC for a run, so that ``limits.processes`` counts the run's own processes
    (its init included). Set by the init inside the sandbox's user namespace it counts just
    those (Linux >= 5.14 counts processes per user namespace). Set before bubblewrap by
    prlimit it also counts the outer bubblewrap and, when not root, the caller's own
    processes (the same uid): both are added."""
    if jail.limits_in_init:
        return limits.processes
    outer = 1 if jail.isolation == "bwrap" else 0
    return limits.processes + outer + (0 if jail.as_root else len(_process.uid_processes(uid)))


def shell_is_dash(shell: str = "/bin/sh") -> bool:
    """Whether ``shell`` is dash, whose ``ulimit`` builtin sets every limit a run needs with the
    units :func:`ulimit_prologue` uses (bash's ``ulimit -p`` is the pipe size, not processes)."""
    return os.path.basename(os.path.realpath(shell)) == "dash"


_ULIMIT_FLAGS = {
    resource.RLIMIT_AS: ("v", 1024),
    resource.RLIMIT_CPU: ("t", 1),
    resource.RLIMIT_FSIZE: ("f", 512),
    resource.RLIMIT_NPROC: ("p", 1),
    resource.RLIMIT_NOFILE: ("n", 1),
    resource.RLIMIT_CORE: ("c", 1),
}
"""dash's ``ulimit`` flag for each resource :func:`~envhub.sandbox.base.rlimits` sets, and
the bytes in its unit (KiB for memory, 512-byte blocks for file size)."""


def ulimit_prologue(limits: Limits, nproc: int) -> str:
    """The rlimits of :func:`~envhub.sandbox.base.rlimits`, set by dash's ``ulimit`` in the
    sandbox's init before the command starts; the run stops with status 125 if one cannot be
    set, so no command runs without its limits."""
    settings = []
    for kind, soft, hard in rlimits(limits, nproc):
        flag, unit = _ULIMIT_FLAGS[kind]
        if soft == hard:  # without -S or -H, dash sets both
            settings.append(f"-{flag} {soft // unit}")
        else:  # soft first: a hard limit below the current soft one is refused
            settings += [f"-S -{flag} {soft // unit}", f"-H -{flag} {hard // unit}"]
    setters = " && ".join(f"ulimit {setting}" for setting in settings)
    return f'{setters} || {{ echo "envhub sandbox: cannot set its limits" >&2; exit 125; }}\n'


def input_files(inputs: dict[str, bytes]) -> tuple[list[int], list[str]]:
    """Each input file as a memfd bubblewrap copies into the sandbox (``--file FD DEST``): the
    fds to pass to bubblewrap, and its flags (the folders first)."""
    fds, flags, made = [], [], set()
    for path, data in inputs.items():
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            folder = "/".join(parts[:i])
            if folder not in made:
                made.add(folder)
                flags += ["--dir", f"{WORKDIR}/{folder}"]
        fd = os.memfd_create("envhub-input", 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        fds.append(fd)
        flags += ["--file", str(fd), f"{WORKDIR}/{path}"]
    return fds, flags
