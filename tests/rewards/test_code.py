"""Code rewards: exact pass rates and failure reasons for every kind of case, tolerant
comparison, per-case timeouts, and code that tries to fake its way to a pass."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import pytest

from envhub.env import SingleTurnEnv
from envhub.rewards.code import (
    code_tests,
    extract_code,
    failure_kind,
    outputs_match,
    run_tests,
    values_match,
)
from envhub.rewards.rubric import Rubric
from envhub.sandbox import Limits, LocalSandbox, bwrap_problem

ADD = "def add(a, b):\n    return a + b\n"
CASES: list[Any] = [
    "assert add(1, 2) == 3",
    {"fn": "add", "args": [0.1, 0.2], "expected": 0.3},
    {"fn": "add", "args": [[1], [2]], "expected": [1, 2]},
    {"fn": "add", "args": [2, 2], "expected": 5},
]


@pytest.fixture(scope="module")
def sandbox() -> Iterator[LocalSandbox]:
    if bwrap_problem() is not None:
        pytest.skip(f"no bubblewrap here: {bwrap_problem()}")
    yield LocalSandbox(Limits(wall_time=5), base_uid=61300, max_concurrency=8)


def run(sandbox: LocalSandbox, code: str | None, cases: list[Any], timeout: float = 2.0):
    return asyncio.run(run_tests(sandbox, code, cases, timeout=timeout))


def reasons(report: Any) -> list[str]:
    return [c.reason for c in report.cases]


def test_mixed_cases_partial_credit(sandbox: LocalSandbox) -> None:
    report = run(sandbox, ADD, CASES)
    assert reasons(report) == ["", "", "", "wrong answer: got 4"]
    assert (report.passed, report.pass_rate) == (3, 0.75)
    assert report.summary() == "3/4 tests passed; case 3: wrong answer: got 4"


def test_stdin_stdout_cases(sandbox: LocalSandbox) -> None:
    code = (
        "import sys\nnums = [float(x) for x in sys.stdin.read().split()]\n"
        "print(f'{sum(nums):.6f}')\n"
    )
    cases = [
        {"stdin": "1 2", "stdout": "3"},
        {"stdin": "0.1 0.2\n", "stdout": "0.3\n\n"},
        {"stdin": "1", "stdout": "2"},
        {"stdin": "x", "stdout": "0"},
    ]
    report = run(sandbox, code, cases)
    assert reasons(report)[:3] == ["", "", "wrong answer: got '1.000000\\n'"]
    assert reasons(report)[3] == "exit 1: ValueError: could not convert string to float: 'x'"


def test_each_case_has_its_own_timeout(sandbox: LocalSandbox) -> None:
    code = "def f(x):\n    while x:\n        pass\n    return 0\n"
    cases = [
        {"fn": "f", "args": [1], "expected": 0},
        {"fn": "f", "args": [0], "expected": 0},
        "assert f(1) == 0",
    ]
    assert reasons(run(sandbox, code, cases, timeout=0.5)) == ["timeout", "", "timeout"]
    io = [{"stdin": "", "stdout": ""}]
    [reason] = reasons(run(sandbox, "while True:\n    pass\n", io, timeout=0.5))
    # The reason carries the measured wall time (0.5 s on a quiet machine, more on a busy one).
    waited = re.fullmatch(r"timeout after (\d+\.\d) s", reason)
    assert waited is not None, reason
    assert 0.5 <= float(waited[1]) < 5.0


def test_errors_are_reported_per_case(sandbox: LocalSandbox) -> None:
    cases = [
        "assert add(1, 1) == 3, 'one and one'",
        "add(None, 1)",
        {"fn": "sub", "args": [], "expected": 0},
        {"fn": "add", "args": [[1], 2], "expected": 0},
    ]
    assert reasons(run(sandbox, ADD, cases)) == [
        "AssertionError: one and one",
        "TypeError: unsupported operand type(s) for +: 'NoneType' and 'int'",
        "no function named 'sub'",
        'TypeError: can only concatenate list (not "int") to list',
    ]


def test_no_code_and_broken_code_fail_every_case(sandbox: LocalSandbox) -> None:
    assert reasons(run(sandbox, None, CASES)) == ["no code"] * 4
    broken = run(sandbox, "def add(a, b)\n    return a + b\n", CASES)
    assert (
        reasons(broken) == ["solution error: SyntaxError: expected ':' (solution.py, line 1)"] * 4
    )
    slow = run(sandbox, "while True:\n    pass\n", CASES, timeout=0.5)
    assert reasons(slow) == ["solution timeout: the solution did not finish loading"] * 4


@pytest.mark.parametrize(
    "cheat",
    [
        "print('all tests passed')\nprint('4/4 tests passed')",  # a fake report on stdout
        "import os\nos._exit(0)",  # leave before the tests run
        "import sys\nsys.exit(0)",
        'import os\nos.write(1, b\'{"case": 0, "status": "pass"}\\n\')\n'
        "os._exit(0)",  # forge a record
        "import os\nfor fd in range(3, 10):\n"
        "    try:\n        os.write(fd, b'{\"done\": 4}\\n')\n"
        "    except OSError:\n        pass",
        "open('results.json', 'w').write('{\"passed\": 4}')\n"
        "open('/tmp/harness.py', 'w').write('')",
        "import builtins\nbuiltins.AssertionError = type('Nope', (Exception,), {})",
    ],
)
def test_cheating_code_passes_nothing(sandbox: LocalSandbox, cheat: str) -> None:
    cases = [
        "assert add(1, 2) == 3",
        {"fn": "add", "args": [1, 2], "expected": 3},
        {"stdin": "", "stdout": "3"},
    ]
    report = run(sandbox, cheat + "\ndef add(a, b):\n    return 0\n", cases)
    assert report.passed == 0 and len(report.cases) == 3
    assert run(sandbox, ADD, cases[:2]).passed == 2  # the next run is unaffected


def test_code_tests_reward_records_the_report(sandbox: LocalSandbox) -> None:
    env = SingleTurnEnv(
        [{"question": "add", "info": {"tests": CASES}}],
        rubric=Rubric([code_tests(sandbox, timeout=2)]),
    )
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(f"Here:\n```python\n{ADD}```")
    assert (reward, terminated, info["reward_components"], info["errors"]) == (
        0.75,
        True,
        {"tests": 0.75},
        [],
    )
    assert info["metrics"] == {"tests_passed": 3, "tests_total": 4, "tests_failed/wrong_answer": 1}
    assert (
        env.state.data["test_report"].summary() == "3/4 tests passed; case 3: wrong answer: got 4"
    )


def test_all_or_nothing_reward(sandbox: LocalSandbox) -> None:
    env = SingleTurnEnv(
        [{"question": "add", "info": {"tests": CASES}}],
        rubric=Rubric([code_tests(sandbox, partial=False)]),
    )
    env.reset(seed=0)
    assert env.step(f"```python\n{ADD}```")[1] == 0.0


def test_a_sandbox_failure_is_recorded_not_raised(sandbox: LocalSandbox) -> None:
    from envhub.sandbox.e2b import E2BSandbox

    dead = E2BSandbox(
        api_url="http://127.0.0.1:9", debug=True, envd_port=9
    )  # nothing listens on port 9
    env = SingleTurnEnv(
        [{"question": "add", "info": {"tests": CASES}}], rubric=Rubric([code_tests(dead)])
    )
    env.reset(seed=0)
    _, reward, _, _, info = env.step(f"```python\n{ADD}```")
    assert (reward, info["reward_components"]) == (0.0, {"tests": 0.0})
    [error] = info["errors"]
    assert (error.stage, error.type) == ("reward:tests", "SandboxError")


def test_a_task_without_tests_is_an_error_on_the_episode(sandbox: LocalSandbox) -> None:
    env = SingleTurnEnv([{"question": "add"}], rubric=Rubric([code_tests(sandbox)]))
    env.reset(seed=0)
    _, reward, _, _, info = env.step("```python\npass\n```")
    assert reward == 0.0 and [(e.type, e.message) for e in info["errors"]] == [
        ("ConfigError", "the task has no test cases: put them in info['tests']")
    ]


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("wrong answer: got 4", "wrong_answer"),
        ("timeout", "timeout"),
        ("timeout after 0.5 s", "timeout"),
        ("no code", "no_code"),
        ("the program stopped the harness (exit 0)", "no_result"),
        ("solution error: SyntaxError: x", "solution_error"),
        ("solution timeout: the solution did not finish loading", "solution_error"),
        ("exit 1: ValueError: x", "exit"),
        ("killed by signal 9", "killed"),
        ("output limit", "output_limit"),
        ("AssertionError: one and one", "error"),
    ],
)
def test_failure_kinds(reason: str, kind: str) -> None:
    assert failure_kind(reason) == kind


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("```python\na = 1\n```", "a = 1\n"),
        ("x\n```py\nb = 2\n```\nthen\n```python\nc = 3\n```", "c = 3\n"),
        ("```\nd = 4\n```", "d = 4\n"),
        ("```js\nlet e = 5\n```", None),
        ("no code", None),
    ],
)
def test_extract_code(text: str, code: str | None) -> None:
    assert extract_code(text) == code


def test_tolerant_comparisons() -> None:
    assert values_match(0.30000000000000004, 0.3) and values_match((1, 2), [1, 2])
    assert values_match({"a": [1.0]}, {"a": [1]}) and not values_match({"a": 1}, {"b": 1})
    assert not values_match(True, 1) and not values_match(1, True) and not values_match(0.31, 0.3)
    assert values_match(None, None) and not values_match(None, 0)
    assert outputs_match("1  2\n3\n\n", "1 2\n3") and outputs_match("0.3000000001\n", "0.3")
    assert (
        not outputs_match("1 2", "1\n2")
        and not outputs_match("abc", "abd")
        and not outputs_match("", "0")
    )


ANYTHING = """\
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __lt__ = __le__ = __gt__ = __ge__ = __eq__
    def __bool__(self):
        return True
    def __contains__(self, item):
        return True
def add(a, b):
    return Anything()
def pair(a, b):
    return [Anything(), Anything()]
"""


@pytest.mark.parametrize(
    "case",
    [
        "assert add(1, 2) == 3",
        "assert 3 == add(1, 2)",
        "assert not add(1, 2) != 3",
        "assert add(1, 2) >= 3 and add(1, 2) <= 3",
        "assert 5 in add(1, 2)",
        "assert add(1, 2)",
        "assert pair(1, 2) == [1, 2]",
        "result = add(1, 2)\nassert result == 3, 'wrong'",
    ],
)
def test_an_object_that_equals_everything_passes_no_assert_case(
    sandbox: LocalSandbox, case: str
) -> None:
    report = run(sandbox, ANYTHING, [case])
    assert (report.passed, report.cases[0].reason) == (
        0,
        "AssertionError: a value that compares or tests true by the solution's own code",
    )


@pytest.mark.parametrize(
    ("solution", "case"),
    [
        ("from collections import Counter\ndef f(s):\n    return Counter(s)\n",
         "assert f('aab') == {'a': 2, 'b': 1}"),
        ("from collections import namedtuple\nP = namedtuple('P', 'x y')\ndef f():\n"
         "    return P(1, 2)\n", "assert f() == (1, 2)"),
        ("from dataclasses import dataclass\n@dataclass\nclass P:\n    x: int\ndef f():\n"
         "    return P(1)\n", "assert f() == P(1)"),
        ("class V:\n    def __init__(self, x):\n        self.x = x\n"
         "    def __eq__(self, other):\n        return self.x == other.x\n",
         "assert V(1) == V(1) and not V(1) == V(2)"),
        ("def f():\n    return [1, 2]\n", "assert 2 in f() and f() and not [] and f() != [2]"),
        ("def f():\n    return 0.1 + 0.2\n", "assert abs(f() - 0.3) < 1e-9 and 0 < f() < 1"),
    ],
)  # fmt: skip
def test_plain_values_and_the_solutions_own_classes_on_both_sides_compare_as_usual(
    sandbox: LocalSandbox, solution: str, case: str
) -> None:
    report = run(sandbox, solution, [case])
    assert report.passed == 1, report.summary()
