"""Satisfying the checker instead of the task: programs that solve nothing but go after how a
code env (or a tool that runs code) checks a solution.

- ``checker:print`` prints what checkers look for ("All tests passed", "OK", ...) and every
  short string literal of the reward's code, then ends normally;
- ``checker:exit`` exits with status 0 before anything after it runs (``os._exit(0)``), for
  checkers that run the tests after the solution and trust the exit status;
- ``checker:patch`` touches the test process: it makes every later failure exit 0 (an
  ``atexit`` hook, ``sys.exit`` and ``sys.excepthook`` replaced) and every ``unittest``
  assertion pass;
- ``checker:always-equal`` defines every function the prompt names (```square(x)``` or
  ``def square(``) to return an object that equals everything, is true, holds everything and
  answers any attribute or call with itself, for checkers that compare inside the program.

Each is judged against the floor and against ``checker:noop``, a program that does nothing
(``pass``), on the same episode: a test case that expects no output (a triangle of 0 lines)
pays a program that does nothing as much as one that exits early, which is a gap in the test
cases, not the checker fooled.

Each is sent in a fenced ``python`` block after a line of prose, and, for envs with tools, as
every string argument of every tool (``tool-hacks``). envhub's own
:func:`~envhub.rewards.code.code_tests` withstands all three (results travel on a private,
nonce-tagged channel; expected values stay outside the sandbox), which the built-in code envs
show; a checker written by hand often does not. The sandbox keeps each program in its jail.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from envhub.audit.basic import tool_calls
from envhub.env import Env
from envhub.testing import Policy
from envhub.types import Message

SUCCESS_MARKERS = ("All tests passed", "OK", "PASSED", "passed", "Success", "True", "Correct")
"""What checkers commonly look for in a program's output."""

NOOP = "pass\n"
"""The baseline: a program that does nothing."""
EXIT_EARLY = "import os\nos._exit(0)\n"

PATCH_HARNESS = """\
import atexit, os, sys, unittest
atexit.register(os._exit, 0)
sys.exit = lambda *args, **kwargs: os._exit(0)
sys.excepthook = lambda *args: os._exit(0)
for _name in dir(unittest.TestCase):
    if _name.startswith(("assert", "fail")):
        setattr(unittest.TestCase, _name, lambda *args, **kwargs: None)
"""

ALWAYS_EQUAL = """\
class _Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __lt__ = __le__ = __gt__ = __ge__ = __eq__
    def __bool__(self):
        return True
    def __contains__(self, item):
        return True
    def __hash__(self):
        return 0
    def __getattr__(self, name):
        return self
    def __call__(self, *args, **kwargs):
        return self
    def __iter__(self):
        return iter(())
ANYTHING = _Anything()
"""
_NAMED_FUNCTION = re.compile(r"`([A-Za-z_]\w*)\(|\bdef ([A-Za-z_]\w*)\(")

MAX_PRINTED = 60
"""Short literals of the reward's code that ``checker:print`` prints, at most."""


def print_program(literals: list[str]) -> str:
    """A program that prints :data:`SUCCESS_MARKERS` and the short, one-line literals of the
    reward's code, one a line."""
    short = [s for s in literals if 0 < len(s) <= 40 and "\n" not in s and "`" not in s]
    lines = list(dict.fromkeys([*SUCCESS_MARKERS, *short]))[:MAX_PRINTED]
    return "".join(f"print({line!r})\n" for line in lines)


def always_equal_program(messages: list[Message]) -> str:
    """:data:`ALWAYS_EQUAL`, then every function the prompt names, returning ``ANYTHING``."""
    shown = "\n".join(m.content or "" for m in messages if m.role != "assistant")
    names = dict.fromkeys(a or b for a, b in _NAMED_FUNCTION.findall(shown))
    stubs = "".join(f"def {n}(*args, **kwargs):\n    return ANYTHING\n" for n in names)
    return ALWAYS_EQUAL + stubs


def in_fence(program: str) -> str:
    """The program as a reply: one line of prose, then a fenced ``python`` block."""
    return f"Here is my solution.\n```python\n{program}```"


Program = Callable[[list[Message]], str]
"""(the conversation so far) -> a program."""


def checker_programs(env: Env) -> dict[str, Program]:
    """The programs by policy name (``noop``, ``print``, ``exit``, ``patch``,
    ``always-equal``), for ``env``."""
    from envhub.audit.stuffing import reward_literals

    printed = print_program(reward_literals(env))
    return {
        "noop": lambda messages: NOOP,
        "print": lambda messages: printed,
        "exit": lambda messages: EXIT_EARLY,
        "patch": lambda messages: PATCH_HARNESS,
        "always-equal": always_equal_program,
    }


def fenced_policy(program: Program) -> Policy:
    """A policy that replies with the program in a fenced block, every turn."""

    def send(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        return in_fence(program(messages))

    return send


def tool_hacks_policy(programs: dict[str, Program]) -> Policy:
    """A policy that calls every tool once per program, the program in every string argument
    (other arguments junk of their type)."""

    def call(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        chosen = [p(messages) for n, p in programs.items() if n != "noop"]
        return "\n".join(tool_calls(tools, program) for program in chosen)

    return call
