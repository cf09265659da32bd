"""What envhub's sandboxes protect against, and what they do not. (Documentation only.)

The adversary is the code a policy writes: it may be buggy or hostile, and RL will find any
shortcut to reward. The host is a researcher's workstation or a training node running envhub.

Contained by the local backend (built flag by flag in :mod:`envhub.sandbox.jail`; each item
has a test in ``tests/sandbox/``):

- **Resources** — wall time (killed), CPU time (RLIMIT_CPU), memory (RLIMIT_AS), processes
  (RLIMIT_NPROC, for a non-root uid of its own, set by the sandbox's init before the command
  starts and counted in its user namespace: a fork bomb stops there), file size
  (RLIMIT_FSIZE), scratch disk (a size-limited tmpfs), open files, stdout/stderr size (killed).
- **The host's files** — only ``/usr`` (and a few ``/etc`` files the loader needs) is mounted,
  read-only; the project tree, ``/root``, ``/etc/shadow``, other users' files are not there.
  The root and everything outside the scratch tmpfs are read-only.
- **Secrets in the environment** — the run starts with an empty environment (``--clearenv``).
- **The network** — its own network namespace with only a loopback: the host's loopback
  services (an inference server, a database) and the internet are unreachable (opt in with
  ``Limits(network=True)``). As root the namespace is kept per pool uid and reused by that
  uid's later runs, never by two at once (:mod:`envhub.sandbox.netns`): a run can meet an
  earlier run's closed connections in TIME_WAIT, nothing else.
- **Other processes** — its own pid namespace: it cannot see or signal the caller, the host or
  other runs; init ignores its signals; no process survives the run (the namespace dies with
  it, and a run's uid is reused only once it owns no process), nor the caller being killed
  (``--die-with-parent``). A warm sandbox (started ahead, :mod:`envhub.sandbox.warm`) is the
  same sandbox started earlier and serves one call only; its stub runs as the run's uid inside
  it, so the call's code can read or change it (nothing of the host or of another call).
  A zygote run (as root, :mod:`envhub.sandbox.zygote`) is forked by a root process on the host
  into the namespaces of a sandbox built for it, after bubblewrap has finished building it; it
  drops every capability and takes the run's uid before any code of the call runs, and keeps
  no file descriptor of the zygote's. The zygote's child that waits for it stays outside the
  sandbox's pid namespace (invisible, unsignalable from inside). The run can write a status to
  its init's pipe as it can choose its own exit status; the zygote's memory, which each run
  inherits, holds pids and uids only (the call's code and files reach the run by a pipe).
- **Privilege** — a non-root uid, no capabilities, ``no_new_privs``, no nested user namespaces.
- **Faked results** — code rewards never read a verdict from the program's stdout or files;
  harness results carry a per-run nonce; expected values of call and stdin/stdout cases never
  enter the sandbox (see :mod:`envhub.rewards.code`).

Sessions (:mod:`envhub.sandbox.session`: one sandbox that lives for an episode) keep all of the
above, with these changes:

- **One sandbox, many calls** — the session is one bubblewrap sandbox (the same flags) as a uid
  of its own for the whole episode; a small init (:mod:`.session_init`) forks each call's
  command with the call's rlimits, in a process group of its own (what a timeout or the output
  limit kills). Files and processes persist from call to call, by design: what a call plants
  (a background process, a FIFO, a symlink, a setuid file) is there for the next call, and for
  the tests that score the episode. Those must treat what the episode left as hostile;
  ``LocalSession.akill_processes`` ends everything the calls left running before a verifier
  runs.
- **Processes** — those a call leaves running (``&``, ``nohup``, ``setsid``) live on until the
  session ends, counted against ``processes`` (RLIMIT_NPROC counts every process of the
  session's uid in its user namespace) and each bound by the rlimits of the call that started
  it. The init is not dumpable: calls cannot ptrace it or open its ``/proc`` files to forge a
  later call's result; its replies carry numbers only. No call can kill it (``kill -9 -1``,
  ``kill -9`` of its pid): the compiled init (:mod:`.session_init_c`), and the Python one with
  ``zygote=False``, is the sandbox's pid 1, which gets no signal from inside its namespace; as
  root the Python init is forked into the sandbox by a zygote (pid 2, as a one-shot zygote
  run: no capabilities, ``no_new_privs``, a child subreaper) with the session's uid as its
  effective uid only: its real and saved uid are a *keeper* uid that this envhub process claims
  and no sandbox process has, so the kernel refuses the calls' signals and ptrace. Each call's
  process sets all three of its uids to the session's before it runs anything. The compiled
  init is a file of the host bound read-only into the sandbox (a call can read it, as it can
  read ``/usr``).
- **Files** — ``/sandbox`` and ``/tmp`` live on one tmpfs of ``disk_mb`` (the whole session's
  writes), mounted by a root helper (:mod:`.session_launcher`) in a mount namespace of the
  session's own before bubblewrap starts; ``/sandbox`` is an overlay whose lower layer is the
  workspace through an idmapped, read-only mount (its owner's files appear as the session's
  uid's; the workspace is never written), or a copy (``start="copy"``). The folders a session
  is asked to show elsewhere (:class:`~envhub.sandbox.session.SessionPaths`: the working folder
  again at ``/app``, empty folders such as ``/tests``) are binds of that same tmpfs, at paths
  none of the sandbox's own mounts holds (:func:`~envhub.sandbox.jail.shown_path_problem`).
  Nothing of it is visible on the host; it goes with the session's last process.
  ``read_file``/``write_file`` run inside the sandbox as the session's uid, so a symlink to a
  host path reaches nothing of the host.
- **The end** — closing SIGKILLs the sandbox's pid 1: the kernel kills its pid namespace, and
  the mount namespace with its tmpfs goes with bubblewrap. When envhub dies however it dies, the
  launcher sees its socket close and SIGKILLs every session's bubblewrap, and a session's
  ``--die-with-parent`` does the same if the launcher itself is killed. A local session needs
  root (the mounts; a uid of its own). The e2b backend's session is one VM per episode
  (:mod:`envhub.sandbox.e2b_session`): ``disk_mb`` is not enforced there.

The container back end (:mod:`envhub.sandbox.container`, Podman or Docker) contains by the
engine's namespaces, cgroups and rlimits, one container per session, none outliving envhub
(a label names the owning process; a reaper removes its containers when it dies). Its one
difference for scoring a Harbor task: **in the task's own container a model's processes live
until the tests**, as in Harbor, so a process the agent or its commands left running (a
watcher that rewrites an answer or the tests as they are copied in) runs beside the tests and
can tamper with what they read or write. Bubblewrap sessions end every such process before
the tests (``akill_processes``); a task whose tests must not share the agent's container says
``environment_mode = "separate"`` under ``[verifier]``: its artifacts are copied (links out of
them, devices and setuid bits dropped) into a fresh container that runs the tests
(:mod:`envhub.harbor.separate`).

Not contained (know these before you rely on it):

- **Kernel exploits** — the sandbox shares the host kernel; a kernel bug (user namespaces are a
  known attack surface) can break out. Use the e2b backend (a micro-VM per sandbox) or a VM for
  code from sources you would not run yourself.
- **In-process forgery of assert cases** — assert-style test cases run in the same interpreter
  as the solution, so code that inspects the harness's memory can forge their results. (Their
  comparisons refuse a value whose class compares by the solution's own code, the object that
  equals everything; see :mod:`envhub.rewards.code_harness`.) Call and stdin/stdout cases
  cannot be forged that way.
- **Side channels and CPU contention** — runs share CPUs and caches with the host; a run can
  slow others down within its CPU limit.
- **The stop-reason diagnosis** — ``memory`` is read from the program's own stderr, so a program
  can fake it; it is a diagnosis, never a reward input.
- **The ``rlimits`` fallback** (``LocalSandbox(isolation="rlimits")``,
  :mod:`envhub.sandbox.fallback`) contains resources only: host files, environment and network
  are exposed. It is never chosen automatically.
- **The e2b backend** shares one VM between the runs of one ``E2BSandbox`` (each in its own
  folder); runs are isolated from the host by the VM, from each other only by folder and rlimits.
"""
