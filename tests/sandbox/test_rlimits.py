"""Limits become rlimits in one place (:func:`envhub.sandbox.base.rlimits`): every way of
setting them (prlimit, dash's ulimit, the warm stub's job, the session init's request and the
init programs' own resource lists) writes out that one list. No sandbox is started here; the
limits a run really gets are checked in ``test_local.py`` for each way."""

from __future__ import annotations

import re
import resource

from envhub.sandbox import session_init, session_init_c
from envhub.sandbox.base import Limits, prlimit_argv, rlimits
from envhub.sandbox.jail import ulimit_prologue
from envhub.sandbox.outputs import parse_outputs
from envhub.sandbox.warm import _JOB, job_for

LIMITS = Limits(wall_time=5, cpu_time=3, memory_mb=300, processes=12, file_size_mb=2, open_files=99)
MIB = 1 << 20


def test_rlimits_is_the_list_of_resource_soft_hard() -> None:
    assert rlimits(LIMITS, 13) == [
        (resource.RLIMIT_AS, 300 * MIB, 300 * MIB),
        (resource.RLIMIT_CPU, 3, 4),
        (resource.RLIMIT_FSIZE, 2 * MIB, 2 * MIB),
        (resource.RLIMIT_NPROC, 13, 13),
        (resource.RLIMIT_NOFILE, 99, 99),
        (resource.RLIMIT_CORE, 0, 0),
    ]


def test_prlimit_and_ulimit_write_out_the_same_values() -> None:
    assert prlimit_argv(LIMITS, 13) == [
        "prlimit",
        f"--as={300 * MIB}",
        "--cpu=3:4",
        f"--fsize={2 * MIB}",
        "--nproc=13",
        "--nofile=99",
        "--core=0",
        "--",
    ]
    # dash's units: KiB for memory, 512-byte blocks for file size.
    assert ulimit_prologue(LIMITS, 13) == (
        "ulimit -v 307200 && ulimit -S -t 3 && ulimit -H -t 4 && ulimit -f 4096 && "
        "ulimit -p 13 && ulimit -n 99 && ulimit -c 0"
        ' || { echo "envhub sandbox: cannot set its limits" >&2; exit 125; }\n'
    )


def test_the_warm_stub_is_sent_each_resource_with_its_values() -> None:
    job = parse_outputs(job_for(["python", "main.py"], 1, {}, LIMITS, 13), [_JOB])
    fields = job[_JOB].decode().split("\0")
    triples = [tuple(int(n) for n in fields[2 + i : 5 + i]) for i in range(0, 18, 3)]
    assert fields[:2] == ["1", "6"] and fields[20:] == ["python", "main.py"]
    assert triples == rlimits(LIMITS, 13)


def test_the_session_inits_set_rlimits_in_the_order_of_the_one_list() -> None:
    """The init's ``run`` request carries values only: both inits (Python and C) must list the
    resources in :func:`rlimits`' order."""
    message = session_init.run_message(7, ["true"], {}, LIMITS).split(b"\0")
    values = [int(n) for n in message[2:14]]
    expected = rlimits(LIMITS, LIMITS.processes)
    assert values == [n for _, soft, hard in expected for n in (soft, hard)]
    order = [kind for kind, _, _ in expected]
    python_kinds = re.search(r"_KINDS = \(([^)]*)\)", session_init.INIT)
    c_kinds = re.search(r"kinds\[6\] = \{([^}]*)\}", session_init_c.SOURCE)
    for found in (python_kinds, c_kinds):
        assert found is not None
        names = re.findall(r"RLIMIT_[A-Z]+", found.group(1))
        assert [getattr(resource, name) for name in names] == order
