"""The test harness that runs *inside* the sandbox (copied there as ``harness.py``).

It reads its job as JSON on stdin, keeps the real stdout as its private result channel and
points the program's fd 1 at stderr, runs the solution and then each case with a per-case
timer, and writes one record per case: ``<nonce>{json}``. The host ignores every line without
the nonce, so a program that prints "all tests passed" (or anything else) changes nothing.

Cases: ``{"kind": "assert", "code": "assert f(1) == 2"}`` runs the statement; ``{"kind":
"call", "fn": "f", "args": [...], "kwargs": {...}}`` calls the function and reports the value,
which the host compares with the expected one (expected values never enter the sandbox).

An assert case's comparisons and truth tests do not trust the solution's own dunder methods:
each single comparison (``==``, ``<``, ``in``, ...) and the assert's truth test are rewritten to
``_Compare`` and :func:`_truth`, which fail the case when exactly one side is a value whose
class takes its comparison, truth or membership from code the solution compiled
(``solution.py``), as an object that equals everything does; two such values (the test built
one with the solution's class) compare as usual. A solution that reads the harness's memory
can still forge an assert case; call and io cases stay the ones to use against an adversarial
policy.

Standard library only, Python 3.6+: it runs on whatever Python the sandbox has.
"""

import ast
import json
import operator
import os
import signal
import sys
import types
from itertools import islice


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


_BUILTIN_SLOTS = (type(object.__eq__), type(str.join), type(len), type(object().__eq__))
_DUNDERS = (
    "__eq__",
    "__ne__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "__bool__",
    "__len__",
    "__contains__",
)
_CONTAINERS = (list, tuple, set, frozenset, dict)
_OPERATORS = {
    "Eq": operator.eq,
    "NotEq": operator.ne,
    "Lt": operator.lt,
    "LtE": operator.le,
    "Gt": operator.gt,
    "GtE": operator.ge,
    "In": lambda a, b: a in b,
    "NotIn": lambda a, b: a not in b,
}


def _from_solution(slot, _isinstance=isinstance, _function=types.FunctionType):
    """True when a dunder comes from the solution's code (or is no plain function or builtin)."""
    if _isinstance(slot, (staticmethod, classmethod)):
        slot = slot.__func__
    if _isinstance(slot, _function):
        return slot.__code__.co_filename == "solution.py"
    return not _isinstance(slot, _BUILTIN_SLOTS)


def _forged(value, depth=0, _type=type, _isinstance=isinstance, _vars=vars, _islice=islice):
    """True when ``value`` (or an item of a list, tuple, set or dict in it, 3 levels deep)
    compares, tests true or holds items by the solution's own code."""
    for klass in _type(value).__mro__:
        found = _vars(klass)
        if any(name in found and _from_solution(found[name]) for name in _DUNDERS):
            return True
    if depth < 3 and _isinstance(value, _CONTAINERS):
        items = value.items() if _isinstance(value, dict) else value
        for item in _islice(items, 1000):
            parts = item if _isinstance(value, dict) else (item,)
            if any(_forged(part, depth + 1) for part in parts):
                return True
    return False


FORGED = "a value that compares or tests true by the solution's own code"


class _Compare:
    """``_compare.Eq(a, b)`` and the like: the comparison, refused (an AssertionError, whatever
    negates it) when one side only is forged."""

    def __getattr__(self, name, _operators=_OPERATORS, _forged=_forged, _bool=bool):
        def compare(a, b):
            if _forged(a) != _forged(b):
                raise AssertionError(FORGED)
            return _bool(_operators[name](a, b))

        return compare


def _truth(value, _forged=_forged, _bool=bool):
    """The truth of ``value``, refused (an AssertionError) when the solution's code decides it."""
    if _forged(value):
        raise AssertionError(FORGED)
    return _bool(value)


class _Guard(ast.NodeTransformer):
    """Rewrites single comparisons to ``__envhub_compare__.Op(a, b)`` and each assert's test to
    ``__envhub_truth__(...)`` along its ``and``/``or``/``not`` spine."""

    def visit_Compare(self, node):
        self.generic_visit(node)
        op = type(node.ops[0]).__name__
        if len(node.ops) != 1 or op not in _OPERATORS:
            return node
        name = ast.Name(id="__envhub_compare__", ctx=ast.Load())
        func = ast.Attribute(value=name, attr=op, ctx=ast.Load())
        return ast.copy_location(
            ast.Call(func=func, args=[node.left, node.comparators[0]], keywords=[]), node
        )

    def visit_Assert(self, node):
        self.generic_visit(node)
        node.test = self._spine(node.test)
        return node

    def _spine(self, node):
        if isinstance(node, ast.BoolOp):
            node.values = [self._spine(v) for v in node.values]
            return node
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            node.operand = self._spine(node.operand)
            return node
        truth = ast.Name(id="__envhub_truth__", ctx=ast.Load())
        return ast.copy_location(ast.Call(func=truth, args=[node], keywords=[]), node)


def _guarded(code, filename):
    """``code`` compiled with its comparisons and assert tests guarded (see the docstring)."""
    tree = ast.fix_missing_locations(_Guard().visit(ast.parse(code, filename)))
    return compile(tree, filename, "exec")


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
            code = _guarded(case["code"], f"test_{index}.py")
            scope = dict(namespace, __envhub_compare__=_Compare(), __envhub_truth__=_truth)
            _timed(lambda: exec(code, scope), timeout)
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
