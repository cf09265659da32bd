"""The test harness that runs *inside* the sandbox (copied there as ``harness.py``).

It reads its job as JSON on stdin, keeps the real stdout as its private result channel and
points the program's fd 1 at stderr, runs the solution and then each case with a per-case
timer, and writes one record per case: ``<nonce>{json}``. The host ignores every line without
the nonce, so a program that prints "all tests passed" (or anything else) changes nothing.

Cases: ``{"kind": "assert", "code": "assert f(1) == 2"}`` runs the statement; ``{"kind":
"call", "fn": "f", "args": [...], "kwargs": {...}}`` calls the function and reports the value,
which the host compares with the expected one (expected values never enter the sandbox).

Standard library only, Python 3.6+: it runs on whatever Python the sandbox has.
"""

import json
import os
import signal
import sys


class CaseTimeout(BaseException):
    """Raised by the per-case timer; a BaseException so that ``except Exception`` in the
    solution cannot swallow it."""


def _on_alarm(signum, frame):
    raise CaseTimeout()


def _describe(error):
    text = str(error)
    name = type(error).__name__
    return name + (": " + text[:300] if text else "")


def _timed(fn, seconds):
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _jsonable(value):
    try:
        json.dumps(value, allow_nan=True)
        return value, None
    except (TypeError, ValueError):
        pass
    if isinstance(value, (tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [_jsonable(v)[0] for v in items], None
    return None, repr(value)[:300]


def main():
    """Run the job read from stdin and write one nonce-prefixed record per case.

    The solution is loaded first; if it fails or times out, one ``setup`` record is written and
    no case runs. Otherwise each case's record follows, then a final ``{"done": N}`` record.
    """
    job = json.loads(sys.stdin.read())
    nonce, cases, timeout = job["nonce"], job["cases"], float(job["timeout"])
    channel = os.dup(1)
    os.dup2(2, 1)  # the program's prints go to stderr, never into the result channel
    write, dumps = os.write, json.dumps

    def report(record):
        write(channel, (nonce + dumps(record) + "\n").encode("utf-8"))

    signal.signal(signal.SIGALRM, _on_alarm)
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        _timed(lambda: exec(compile(job["solution"], "solution.py", "exec"), namespace), timeout)
    except CaseTimeout:
        report({"setup": "timeout", "message": "the solution did not finish loading"})
        return
    except BaseException as e:  # SystemExit and all: the solution is broken
        report({"setup": "error", "message": _describe(e)})
        return
    for index, case in enumerate(cases):
        report(_run_case(index, case, namespace, timeout))
    report({"done": len(cases)})


def _run_case(index, case, namespace, timeout):
    try:
        if case["kind"] == "assert":
            _timed(
                lambda: exec(compile(case["code"], f"test_{index}.py", "exec"), dict(namespace)),
                timeout,
            )
            return {"case": index, "status": "pass"}
        fn = namespace.get(case["fn"])
        if not callable(fn):
            return {
                "case": index,
                "status": "error",
                "message": f"no function named {case['fn']!r}",
            }
        value = _timed(lambda: fn(*case.get("args", []), **case.get("kwargs", {})), timeout)
        value, text = _jsonable(value)
        return {"case": index, "status": "value", "value": value, "repr": text}
    except CaseTimeout:
        return {"case": index, "status": "timeout"}
    except AssertionError as e:
        return {
            "case": index,
            "status": "fail",
            "message": _describe(e) if str(e) else "assertion failed",
        }
    except BaseException as e:
        return {"case": index, "status": "error", "message": _describe(e)}


if __name__ == "__main__":
    main()
