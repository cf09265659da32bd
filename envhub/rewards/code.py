"""Code-execution rewards: run the model's program in a sandbox and score it on test cases.

Three kinds of case, mixed freely in one task:

- **assert** — a statement run after the solution: ``"assert add(1, 2) == 3"``;
- **call** — ``{"fn": "add", "args": [1, 2], "expected": 3}``: the function's return value is
  sent back and compared *on the host* (floats with a tolerance, tuples as lists);
- **io** — ``{"stdin": "1 2\\n", "stdout": "3\\n"}``: the whole program runs once per case and
  its stdout is compared token by token (whitespace and trailing blank lines ignored, numbers
  with a tolerance).

Every case has its own timeout. The result is a :class:`TestReport`: which cases passed, and
for each failure why (``wrong answer``, ``timeout``, ``AssertionError: ...``, ``no result``).

Where verification reads from: assert and call cases report through a private channel of the
in-sandbox harness (its saved stdout; the program's own prints go to stderr), and each record
carries a random per-run nonce, so printed text ("all tests passed"), files, or an early
``exit(0)`` cannot pass a case. Expected values of call and io cases never enter the sandbox.
What is *not* covered: assert cases run in the same interpreter as the solution, so a program
that deliberately reads the harness's memory can forge them (their comparisons do refuse an
object that equals everything); use call or io cases where the policy is adversarial. See
:mod:`envhub.sandbox.threat_model`.

Sandbox failures raise :class:`~envhub.errors.SandboxError`; inside a rubric that is recorded
on the trajectory (reward 0 plus the reason) and the batch goes on.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.errors import ConfigError, SandboxError
from envhub.rewards.rubric import RewardFunction, reward
from envhub.sandbox.base import Limits, Sandbox
from envhub.state import State

HARNESS = (Path(__file__).parent / "code_harness.py").read_text(encoding="utf-8")
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(text: str, language: str = "python") -> str | None:
    """The last fenced code block in ``language`` (or unlabelled); ``None`` when there is none."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text or "")]
    chosen = [
        body
        for lang, body in blocks
        if lang in (language, "py" if language == "python" else language, "")
    ]
    return chosen[-1] if chosen else None


@dataclass(frozen=True)
class CaseResult:
    """One case: passed or not, and why not (``""`` when it passed)."""

    index: int
    kind: str
    passed: bool
    reason: str = ""


@dataclass(frozen=True)
class TestReport:
    """Every case's result, plus how the sandbox run(s) ended."""

    cases: tuple[CaseResult, ...]
    stop_reason: str = "ok"
    detail: str = ""
    """A problem that failed every case: no code, a solution that does not load, ..."""
    stderr: str = ""

    @property
    def passed(self) -> int:
        """Number of cases passed."""
        return sum(c.passed for c in self.cases)

    @property
    def pass_rate(self) -> float:
        """Share of cases passed (0.0 for no cases)."""
        return self.passed / len(self.cases) if self.cases else 0.0

    @property
    def failures(self) -> list[CaseResult]:
        """The cases that did not pass, in order."""
        return [c for c in self.cases if not c.passed]

    def summary(self) -> str:
        """A short text for the model or a log: ``3/4 passed; case 2: timeout``."""
        head = f"{self.passed}/{len(self.cases)} tests passed"
        if self.detail:
            head += f" ({self.detail})"
        return "; ".join([head, *[f"case {c.index}: {c.reason}" for c in self.failures[:5]]])


@dataclass
class _Cases:
    harness: list[dict[str, Any]] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    expected: list[Any] = field(default_factory=list)
    io: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)


def _split(cases: Sequence[str | dict[str, Any]]) -> _Cases:
    split = _Cases()
    for index, case in enumerate(cases):
        if isinstance(case, str):
            case = {"kind": "assert", "code": case}
        kind = case.get("kind") or (
            "io" if "stdin" in case or "stdout" in case else "call" if "fn" in case else "assert"
        )
        split.kinds.append(kind)
        if kind == "io":
            split.io.append((index, case))
        elif kind == "call":
            split.harness.append(
                {
                    "kind": "call",
                    "fn": case["fn"],
                    "args": list(case.get("args", [])),
                    "kwargs": dict(case.get("kwargs", {})),
                }
            )
            split.positions.append(index)
            split.expected.append(case.get("expected"))
        elif kind == "assert":
            split.harness.append({"kind": "assert", "code": case["code"]})
            split.positions.append(index)
            split.expected.append(None)
        else:
            raise ConfigError(
                f"test case {index}: unknown kind {kind!r}; use 'assert', 'call' or 'io'"
            )
    return split


def values_match(got: Any, expected: Any, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Equality for returned values: numbers within a tolerance, sequences element-wise
    (a tuple equals the list of its items), dicts key by key; everything else ``==``."""
    if isinstance(got, bool) or isinstance(expected, bool):
        return got is expected or (type(got) is type(expected) and got == expected)
    if isinstance(got, (int, float)) and isinstance(expected, (int, float)):
        return math.isclose(got, expected, rel_tol=rel_tol, abs_tol=abs_tol) or got == expected
    if isinstance(got, (list, tuple)) and isinstance(expected, (list, tuple)):
        return len(got) == len(expected) and all(
            values_match(g, e, rel_tol, abs_tol) for g, e in zip(got, expected, strict=True)
        )
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(
            values_match(got[k], expected[k], rel_tol, abs_tol) for k in got
        )
    return got == expected


def outputs_match(got: str, expected: str, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Tolerant stdout comparison: same lines of whitespace-separated tokens (trailing blank
    lines and spacing ignored); tokens that both read as numbers compare with a tolerance."""

    def lines(text: str) -> list[list[str]]:
        rows = [line.split() for line in text.replace("\r\n", "\n").split("\n")]
        while rows and not rows[-1]:
            rows.pop()
        return rows

    a, b = lines(got), lines(expected)
    if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b, strict=True)):
        return False
    return all(
        _token_match(x, y, rel_tol, abs_tol)
        for row_a, row_b in zip(a, b, strict=True)
        for x, y in zip(row_a, row_b, strict=True)
    )


def _token_match(a: str, b: str, rel_tol: float, abs_tol: float) -> bool:
    if a == b:
        return True
    try:
        return math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=abs_tol)
    except ValueError:
        return False


async def run_tests(
    sandbox: Sandbox,
    code: str | None,
    cases: Sequence[str | dict[str, Any]],
    *,
    timeout: float = 5.0,
    limits: Limits | None = None,
) -> TestReport:
    """Run ``code`` against ``cases`` in ``sandbox``; see the module docstring.

    Args:
        sandbox: Where the code runs.
        code: The program (``None``, e.g. no code block in the answer, fails every case).
        cases: Assert strings, or dicts of kind ``assert``, ``call`` or ``io``.
        timeout: Seconds per case.
        limits: Limits of the sandbox run(s); the wall time is raised to fit the cases.

    Raises:
        SandboxError: The sandbox itself failed.
    """
    split = _split(cases)
    if code is None:
        return TestReport(
            tuple(CaseResult(i, k, False, "no code") for i, k in enumerate(split.kinds)),
            detail="no code found",
        )
    base = limits or sandbox.limits
    results: dict[int, CaseResult] = {}
    report = TestReport(())
    if split.harness:
        report = await _run_harness(sandbox, code, split, timeout, base)
        results.update({c.index: c for c in report.cases})
    if split.io:
        io_limits = base.with_(wall_time=timeout, cpu_time=timeout)
        outcomes = await asyncio.gather(
            *[_run_io(sandbox, code, index, case, io_limits) for index, case in split.io]
        )
        results.update({c.index: c for c in outcomes})
    ordered = tuple(results[i] for i in range(len(split.kinds)))
    return TestReport(ordered, report.stop_reason, report.detail, report.stderr)


async def _run_harness(
    sandbox: Sandbox, code: str, split: _Cases, timeout: float, base: Limits
) -> TestReport:
    nonce = secrets.token_hex(16)
    job = json.dumps({"nonce": nonce, "solution": code, "cases": split.harness, "timeout": timeout})
    wall = timeout * (len(split.harness) + 1) + 2.0
    limits = base.with_(wall_time=wall, cpu_time=wall)
    result = await sandbox.arun(
        [sandbox.python, "-I", "-S", "harness.py"],
        stdin=job,
        files={"harness.py": HARNESS},
        limits=limits,
    )
    records = _records(result.stdout, nonce)
    setup = next((r for r in records if "setup" in r), None)
    by_case = {r["case"]: r for r in records if isinstance(r.get("case"), int)}
    detail = f"solution {setup['setup']}: {setup.get('message', '')}".rstrip(": ") if setup else ""
    if not setup and not any("done" in r for r in records):
        detail = f"the program stopped the harness ({result.describe()})"
    cases = []
    for position, (index, expected) in enumerate(zip(split.positions, split.expected, strict=True)):
        record = by_case.get(position)
        cases.append(_judge(index, split.kinds[index], record, expected, detail or "no result"))
    return TestReport(tuple(cases), result.stop_reason, detail, result.stderr[-2000:])


def _records(stdout: str, nonce: str) -> list[dict[str, Any]]:
    records = []
    for line in stdout.splitlines():
        if line.startswith(nonce):
            try:
                record = json.loads(line[len(nonce) :])
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


def _judge(
    index: int, kind: str, record: dict[str, Any] | None, expected: Any, missing: str
) -> CaseResult:
    if record is None:
        return CaseResult(index, kind, False, missing)
    status = record.get("status")
    if status == "pass" and kind == "assert":
        return CaseResult(index, kind, True)
    if status == "value" and kind == "call":
        if record.get("repr") is None and values_match(record.get("value"), expected):
            return CaseResult(index, kind, True)
        shown = record.get("repr") or json.dumps(record.get("value"))[:200]
        return CaseResult(index, kind, False, f"wrong answer: got {shown}")
    if status == "timeout":
        return CaseResult(index, kind, False, "timeout")
    return CaseResult(index, kind, False, str(record.get("message") or status)[:300])


async def _run_io(
    sandbox: Sandbox, code: str, index: int, case: dict[str, Any], limits: Limits
) -> CaseResult:
    result = await sandbox.arun(
        [sandbox.python, "-I", "main.py"],
        stdin=case.get("stdin", ""),
        files={"main.py": code},
        limits=limits,
    )
    if result.stop_reason != "ok":
        return CaseResult(index, "io", False, result.describe())
    if result.exit_code != 0:
        last = result.stderr.strip().splitlines()[-1:] or [""]
        return CaseResult(
            index, "io", False, f"exit {result.exit_code}: {last[0][:200]}".rstrip(": ")
        )
    if not outputs_match(result.stdout, str(case.get("stdout", ""))):
        return CaseResult(index, "io", False, f"wrong answer: got {result.stdout[:200]!r}")
    return CaseResult(index, "io", True)


def code_tests(
    sandbox: Sandbox | None = None,
    *,
    weight: float = 1.0,
    name: str = "tests",
    partial: bool = True,
    timeout: float = 5.0,
    language: str = "python",
) -> RewardFunction:
    """A reward: the share of the task's test cases the answer's code passes.

    The cases come from ``info["tests"]`` of the task (see :func:`run_tests`); the code is the
    last fenced block of the response, or ``state.data["code"]`` when the env put it there.
    The :class:`TestReport` is stored in ``state.data["test_report"]``; the episode's metrics
    (which the trajectory carries) get ``tests_passed``, ``tests_total`` and one
    ``tests_failed/<kind>`` count per failed case (see :func:`failure_kind`).

    Args:
        sandbox: Where code runs (default: one shared :class:`~envhub.sandbox.LocalSandbox`).
        partial: Pass rate (``True``) or 1.0 only when every case passes.
        timeout: Seconds per case.
    """

    async def score(response: str, info: dict[str, Any], state: State) -> float:
        cases = info.get("tests")
        if not cases:
            raise ConfigError("the task has no test cases: put them in info['tests']")
        code = state.data.get("code") or extract_code(response, language)
        report = await run_tests(sandbox or default_sandbox(), code, cases, timeout=timeout)
        state.data["test_report"] = report
        state.metrics["tests_passed"] += report.passed
        state.metrics["tests_total"] += len(report.cases)
        for case in report.failures:
            state.metrics[f"tests_failed/{failure_kind(case.reason)}"] += 1
        if partial:
            return report.pass_rate
        return float(report.passed == len(report.cases))

    return reward(score, weight=weight, name=name)


def failure_kind(reason: str) -> str:
    """A failure reason in one word, for metrics: ``wrong_answer``, ``timeout``, ``no_code``,
    ``no_result`` (the program stopped the harness), ``solution_error`` (it does not load),
    ``exit`` (an io case exited non-zero), ``killed``, ``memory``, ``output_limit`` or ``error``
    (an exception or a failed assert)."""
    for prefix, kind in _KINDS:
        if reason.startswith(prefix):
            return kind
    return "error"


_KINDS = (
    ("wrong answer", "wrong_answer"),
    ("timeout", "timeout"),
    ("no code", "no_code"),
    ("the program stopped", "no_result"),
    ("no result", "no_result"),
    ("solution", "solution_error"),
    ("exit", "exit"),
    ("killed", "killed"),
    ("memory", "memory"),
    ("output limit", "output_limit"),
)

_DEFAULT: list[Sandbox] = []


def default_sandbox() -> Sandbox:
    """A process-wide :class:`~envhub.sandbox.LocalSandbox`, made on first use.

    Raises:
        SandboxUnavailableError: bubblewrap cannot run here (the message says what to do).
    """
    if not _DEFAULT:
        from envhub.sandbox.local import LocalSandbox

        _DEFAULT.append(LocalSandbox())
    return _DEFAULT[0]


__all__ = [
    "CaseResult",
    "SandboxError",
    "TestReport",
    "code_tests",
    "default_sandbox",
    "extract_code",
    "failure_kind",
    "outputs_match",
    "run_tests",
    "values_match",
]
