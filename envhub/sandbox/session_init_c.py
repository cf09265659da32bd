"""The compiled session init: :data:`~envhub.sandbox.session_init.INIT`'s loop and protocol in
C, built once per machine with the system's C compiler (``cc``) when a session first starts.

Why C: a call's overhead over a bare ``subprocess.run`` on the host was the Python init's work.
Measured on 2 busy cores (``true`` 300 times): the Python init used ~430 us of CPU a call, and
each call's process ~500 us more than a bare one's before its ``exec`` (an interpreter's
``fork``: page tables to copy, pages faulted back in on both sides, bytecodes to run); the
compiled init uses ~70 us a call and its calls' processes ~500 us less, so a call costs ~1.1x a bare
``subprocess.run`` instead of ~2x. It also starts as the sandbox's pid 1 in well under a
millisecond, where an interpreter takes ~10 ms (which the Python init saves by being forked
from a zygote). Where there is no compiler (or with ``ENVHUB_SESSION_INIT=python``), the Python
init runs: same protocol, same guarantees, slower calls.

The binary lives in a folder of the system's temporary directory that only its owner can
write (``envhub-session-init-UID``, checked before use), named by a hash of its source, and
is bound read-only into each session's sandbox at
:data:`~envhub.sandbox.session_init.COMPILED_PATH`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

SOURCE = r"""
/* envhub's compiled session init: the loop and protocol of session_init.INIT, in C (a fork of
   this small process costs a fraction of a Python one's, and no interpreter runs per call). */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_MESSAGE (1 << 22)
#define MAX_FIELDS 65536
#define MAX_CALLS 64
#define MAX_FDS 64

static char message[MAX_MESSAGE + 1];
static char *fields[MAX_FIELDS + 1];
static struct { pid_t pid; long call; } calls[MAX_CALLS];
static int ctrl;
static const int kinds[6] = {RLIMIT_AS, RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NPROC, RLIMIT_NOFILE,
                             RLIMIT_CORE};

static void reply(long call, int status) {
    char line[64];
    int n = snprintf(line, sizeof line, "exit %ld %d", call, status);
    send(ctrl, line, n, MSG_NOSIGNAL);
}

static int exit_code(int status) {
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

/* Reap every child that has ended and report the calls' exits, but `hold`'s: that one is kept
   in *held (its code, -1 if it did not end). */
static void reap(pid_t hold, long *held_call, int *held) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < MAX_CALLS; i++) {
            if (calls[i].pid != pid) continue;
            calls[i].pid = 0;
            if (pid == hold) {
                *held_call = calls[i].call;
                *held = exit_code(status);
            } else {
                reply(calls[i].call, exit_code(status));
            }
        }
    }
}

/* SIGKILL a call's process group; its exit goes out once the whole group has gone. */
static void kill_group(pid_t pid) {
    long call = 0;
    int code = -1;
    struct timespec ms = {0, 1000000};
    killpg(pid, SIGKILL);
    kill(pid, SIGKILL);
    for (int i = 0; i < 2000; i++) {
        reap(pid, &call, &code);
        if (killpg(pid, 0) != 0) break;
        nanosleep(&ms, NULL);
    }
    if (code >= 0) reply(call, code);
}

/* execve argv[0], searched in the call's PATH as the Python init does; returns on failure. */
static void run_command(char **argv, char **env) {
    const char *path = "/usr/bin:/bin";
    for (char **e = env; *e; e++)
        if (strncmp(*e, "PATH=", 5) == 0) path = *e + 5;
    if (strchr(argv[0], '/')) {
        execve(argv[0], argv, env);
        return;
    }
    int error = ENOENT;
    size_t name = strlen(argv[0]);
    static char full[8192];
    while (*path) {
        const char *end = strchrnul(path, ':');
        size_t folder = end - path;
        if (folder + name + 2 <= sizeof full) {
            memcpy(full, path, folder);
            full[folder] = '/';
            memcpy(full + folder + 1, argv[0], name + 1);
            execve(full, argv, env);
            if (errno != ENOENT && errno != ENOTDIR) error = errno;
        }
        path = *end ? end + 1 : end;
    }
    errno = error;
}

/* The child's side of a call: its session, uids, signals, descriptors, folder, rlimits. */
static void become(char **f, int argc, const int *fds, uid_t uid) {
    sigset_t none;
    sigemptyset(&none);
    f[15 + argc] = NULL; /* the empty field after the argv ends it */
    if (setsid() < 0 || setresuid(uid, uid, uid) != 0) return;
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int n = 0; n < 3; n++)
        if (dup2(fds[n], n) < 0) return;
    if (syscall(SYS_close_range, 3, ~0U, 0) != 0)
        for (int fd = 3; fd < 65536; fd++) close(fd);
    if (chdir("/sandbox") != 0) return;
    for (int i = 0; i < 6; i++) {
        struct rlimit limit = {strtoull(f[2 + 2 * i], NULL, 10), strtoull(f[3 + 2 * i], NULL, 10)};
        if (setrlimit(kinds[i], &limit) != 0) return;
    }
    run_command(f + 15, f + 16 + argc);
}

static void start(char **f, int count, const int *fds, int nfds, uid_t uid) {
    long call = strtol(f[1], NULL, 10);
    int argc = count > 15 ? atoi(f[14]) : 0;
    if (nfds != 3 || argc < 1 || 16 + argc > count) {
        reply(call, 126);
        return;
    }
    int slot = -1;
    for (int i = 0; i < MAX_CALLS && slot < 0; i++)
        if (calls[i].pid == 0) slot = i;
    errno = EAGAIN;
    pid_t pid = slot < 0 ? -1 : fork();
    if (pid < 0) {
        dprintf(fds[2], "envhub session: cannot start the command: %s\n", strerror(errno));
        reply(call, 126);
        return;
    }
    if (pid == 0) {
        become(f, argc, fds, uid);
        int error = errno;
        dprintf(2, "envhub session: cannot run %s: %s\n", f[15], strerror(error));
        _exit(error == ENOENT ? 127 : 126);
    }
    calls[slot].pid = pid;
    calls[slot].call = call;
}

/* One message: its fields (NUL-ended) and the descriptors that came with it. */
static int receive(int *fds, int *nfds, int *count) {
    char control[CMSG_SPACE(sizeof(int) * MAX_FDS)];
    struct iovec io = {message, MAX_MESSAGE};
    struct msghdr header = {0};
    header.msg_iov = &io;
    header.msg_iovlen = 1;
    header.msg_control = control;
    header.msg_controllen = sizeof control;
    ssize_t size = recvmsg(ctrl, &header, MSG_CMSG_CLOEXEC);
    if (size <= 0) return size < 0 && errno == EINTR ? 0 : -1;
    *nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&header); c; c = CMSG_NXTHDR(&header, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        int n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (int i = 0; i < n && *nfds < MAX_FDS; i++)
            memcpy(&fds[(*nfds)++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
    }
    message[size] = 0;
    *count = 0;
    for (char *p = message; p < message + size && *count < MAX_FIELDS;) {
        fields[(*count)++] = p;
        p += strlen(p) + 1;
    }
    fields[*count] = NULL;
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    ctrl = atoi(argv[1]);
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 || prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0)
        return 125;
    if (getpid() != 1 && prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) return 125;
    prctl(PR_SET_NAME, "envhub-init", 0, 0, 0);
    uid_t uid = geteuid();
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGPIPE);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL); /* each call's child unblocks them */
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    int children = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (children < 0) return 125;
    send(ctrl, "ready", 5, MSG_NOSIGNAL);
    struct pollfd polled[2] = {{ctrl, POLLIN, 0}, {children, POLLIN, 0}};
    for (;;) {
        long unused_call;
        int unused;
        reap(0, &unused_call, &unused);
        if (poll(polled, 2, -1) < 0) continue;
        if (polled[1].revents) {
            struct signalfd_siginfo info[16];
            while (read(children, info, sizeof info) > 0) {}
        }
        if (!polled[0].revents) continue;
        int fds[MAX_FDS], nfds = 0, count = 0;
        int got = receive(fds, &nfds, &count);
        if (got < 0) _exit(0);
        if (got == 0) continue;
        if (count >= 2 && strcmp(fields[0], "run") == 0) {
            start(fields, count, fds, nfds, uid);
        } else if (count >= 2 && strcmp(fields[0], "kill") == 0) {
            long call = strtol(fields[1], NULL, 10);
            for (int i = 0; i < MAX_CALLS; i++)
                if (calls[i].pid && calls[i].call == call) kill_group(calls[i].pid);
        } else if (count >= 1 && strcmp(fields[0], "killall") == 0) {
            kill(-1, SIGKILL);
        }
        for (int i = 0; i < nfds; i++) close(fds[i]);
    }
}
"""
"""The compiled init's C source (one file, the C library only)."""

FLAGS = ["-O2", "-std=gnu11", "-Wall", "-Werror"]


@functools.cache
def compiled_init() -> Path | None:
    """The compiled init of this machine, built now if it was not yet; ``None`` where it
    cannot be (no ``cc``, a failed build, one that does not run here, a folder someone else
    could write) or when
    ``ENVHUB_SESSION_INIT=python`` asks for the Python init."""
    if os.environ.get("ENVHUB_SESSION_INIT", "").lower() == "python":
        return None
    compiler = shutil.which("cc")
    folder = Path(tempfile.gettempdir()) / f"envhub-session-init-{os.geteuid()}"
    digest = hashlib.sha256(SOURCE.encode() + " ".join(FLAGS).encode()).hexdigest()[:16]
    binary = folder / f"init-{digest}"
    try:
        folder.mkdir(mode=0o711, exist_ok=True)
        if not _private(folder):
            return None
        if binary.exists():
            return binary if _private(binary) and _runs(binary) else None
        if compiler is None:
            return None
        building = folder / f".{binary.name}.{os.getpid()}"
        done = subprocess.run(
            [compiler, *FLAGS, "-o", str(building), "-x", "c", "-"],
            input=SOURCE.encode(),
            capture_output=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            return None
        os.chmod(building, 0o755)
        os.replace(building, binary)
    except (OSError, subprocess.SubprocessError):
        return None
    return binary if _runs(binary) else None


def _runs(binary: Path) -> bool:
    """Whether ``binary`` runs here (a folder on a ``noexec`` mount, or a broken build, would
    stop every session from starting): without arguments it exits with status 2."""
    try:
        done = subprocess.run([str(binary)], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 2


def _private(path: Path) -> bool:
    """Whether ``path`` is this process's (effective uid) and nobody else may write it."""
    info = path.lstat()
    return info.st_uid == os.geteuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
