"""Code envs: write a function (single turn), or fix one with a ``python`` tool (multi-turn).

Tasks (``envhub/envs/data/code_tasks.jsonl``, 22 written for envhub) have a ``question``, test
cases in ``tests`` (see :mod:`envhub.rewards.code`: assert strings, ``call`` cases compared on
the host, ``io`` cases for stdin/stdout programs), a reference ``solution`` and a plausible
``buggy`` version. The reward is the share of cases the code in the final answer passes, run
in a sandbox (default: :class:`~envhub.sandbox.LocalSandbox`; pass ``sandbox=`` for e2b).

- ``code``: the model answers with the code in a ```` ```python ```` block;
- ``code-fix``: the prompt holds the buggy version; the model may run code through the
  ``python`` tool (stdout, stderr and exit status come back) as often as it likes, and ends
  with the fixed code in a block, without a tool call. Only a complete fix pays (1.0 when every
  case passes, else 0): a pass rate would pay for the cases the buggy code already passes, so
  handing it back unchanged scored (the reward audit, :mod:`envhub.audit`, found it).

Other task sets in the same format load with ``data_files=`` (JSON/JSONL) or, online, from a
Hub dataset id (``source="owner/name"``); ``tests`` may be a list or its JSON text.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from envhub.env import SingleTurnEnv
from envhub.errors import EnvhubError
from envhub.multiturn import TOOL_FORMAT_HINT, ToolEnv
from envhub.rewards.code import code_tests, default_sandbox
from envhub.rewards.rubric import Rubric
from envhub.sandbox.base import Limits, Sandbox
from envhub.state import State
from envhub.tools.prompt import tool_call_block
from envhub.tools.tool import Injected, tool
from envhub.types import Message

SHIPPED_FILE = Path(__file__).parent / "data" / "code_tasks.jsonl"
TOOL_LIMITS = Limits(wall_time=5.0, output_bytes=4096)
"""Limits of one ``python`` tool call (its output is cut at 4 KiB: it goes into the prompt)."""

SYSTEM_PROMPT = (
    "Solve the programming task in Python. Reply with the complete code in one ```python block."
)
FIX_PROMPT = (
    "Fix the buggy Python code so that it solves the task. You can run code with the `python` tool "
    "to test it.\n\n"
    + TOOL_FORMAT_HINT
    + "\n\nWhen you are done, reply without a tool call, with the "
    "complete fixed code in one ```python block."
)


def to_task(row: dict[str, Any]) -> dict[str, Any]:
    """A task from one row: ``question``, ``tests`` (list or JSON text), optional ``solution``,
    ``buggy`` and ``id``."""
    tests = row["tests"]
    if isinstance(tests, str):
        tests = json.loads(tests)
    info = {
        "tests": tests,
        **{k: row[k] for k in ("id", "solution", "buggy") if row.get(k) is not None},
    }
    return {"question": row["question"], "info": info}


@functools.lru_cache(maxsize=8)
def load_tasks(
    source: str = "local", split: str = "train", data_files: str | tuple[str, ...] | None = None
) -> tuple[dict[str, Any], ...]:
    """Every task of one split: the shipped set, your files, or a Hub dataset (cached)."""
    import datasets

    try:
        if source == "local":
            files = data_files if data_files is not None else str(SHIPPED_FILE)
            rows = datasets.load_dataset(
                "json",
                data_files={"train": list(files) if isinstance(files, tuple) else files},
                split=split,
            )
        else:
            rows = datasets.load_dataset(source, split=split)
    except Exception as e:
        raise EnvhubError(
            f"code: cannot load split {split!r} of {data_files or source}: {type(e).__name__}: {e}"
        ) from e
    missing = {"question", "tests"} - set(rows.column_names)
    if missing:
        raise EnvhubError(
            f"code: rows need 'question' and 'tests'; missing {sorted(missing)} "
            f"(have {rows.column_names})"
        )
    return tuple(to_task(dict(row)) for row in rows)


def _solutions(tasks: Sequence[dict[str, Any]]) -> dict[str, str]:
    return {t["question"]: t["info"]["solution"] for t in tasks if "solution" in t["info"]}


def fenced(code: str) -> str:
    """Wrap ``code`` (which ends in a newline) in a ```` ```python ```` block, as in a reply."""
    return f"```python\n{code}```"


class _CodeTasks:
    """Shared set-up of both code envs: the task source, the sandbox, the rubric and the
    reference policy (each env says how its solutions are played, ``_reference_policy``)."""

    def __init__(
        self,
        source: str = "local",
        split: str = "train",
        data_files: str | Sequence[str] | None = None,
        sandbox: Sandbox | None = None,
        timeout: float = 5.0,
        **kwargs: Any,
    ) -> None:
        self.source, self.split, self.timeout = source, split, timeout
        self.data_files = tuple(data_files) if isinstance(data_files, (list, tuple)) else data_files
        self.sandbox = sandbox
        super().__init__(**kwargs)
        answers = _solutions([self.dataset[i] for i in range(len(self.dataset))])
        # Only a task set with a solution for every task has a policy that always wins.
        self.reference_policy = (
            self._reference_policy(answers) if len(answers) == len(self.dataset) else None
        )

    def _reference_policy(self, answers: dict[str, str]) -> Any:
        raise NotImplementedError

    def load_dataset(self) -> tuple[dict[str, Any], ...]:
        return load_tasks(self.source, self.split, self.data_files)

    def default_rubric(self) -> Rubric:
        return Rubric([code_tests(self.sandbox, timeout=self.timeout)])


class CodeEnv(_CodeTasks, SingleTurnEnv):
    """Write a Python function or program; scored by running its test cases in a sandbox.

    Args:
        source: ``"local"`` (the shipped tasks, or ``data_files``) or a Hub dataset id.
        split: Split to use (``datasets`` slicing works: ``"train[:10]"``).
        data_files: Your own JSON/JSONL task files in the same format.
        sandbox: Where code runs (default: a shared local bubblewrap sandbox).
        timeout: Seconds per test case.
        **kwargs: See :class:`~envhub.env.TaskEnv`.
    """

    name = "code"
    version = "0.1.0"
    system_prompt = SYSTEM_PROMPT
    reward_range = (0.0, 1.0)

    def _reference_policy(self, answers: dict[str, str]) -> Any:
        return _single_turn_policy(answers)


def _single_turn_policy(answers: dict[str, str]) -> Any:
    def write_solution(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        question = next(m.content for m in reversed(messages) if m.role == "user")
        return fenced(answers[question or ""])

    return write_solution


@tool(timeout=30.0)
async def python(code: str, sandbox: Annotated[Sandbox, Injected()]) -> str:
    """Run a Python program in a fresh sandbox and see its output.

    Args:
        code: The complete program; print what you want to see.
    """
    result = await sandbox.arun_python(code, limits=TOOL_LIMITS)
    parts = [f"[{result.describe()}]"]
    if result.stdout:
        parts.append(f"stdout:\n{result.stdout}")
    if result.stderr:
        parts.append(f"stderr:\n{result.stderr}")
    return "\n".join(parts)


class CodeFixEnv(_CodeTasks, ToolEnv):
    """Fix buggy code, testing it through a ``python`` tool; scored on the task's test cases.

    Args:
        source: ``"local"`` (the shipped tasks, or ``data_files``) or a Hub dataset id; rows
            need a ``buggy`` version.
        split: Split to use.
        data_files: Your own JSON/JSONL task files in the same format.
        sandbox: Where code runs, for the tool and the tests (default: local bubblewrap).
        timeout: Seconds per test case.
        **kwargs: See :class:`~envhub.multiturn.ToolEnv` (``max_turns`` defaults to 6).
    """

    name = "code-fix"
    version = "0.1.0"
    system_prompt = FIX_PROMPT
    tools = (python,)
    default_max_turns = 6
    reward_range = (0.0, 1.0)

    def _reference_policy(self, answers: dict[str, str]) -> Any:
        return _fix_policy(answers) if self.max_turns >= 2 else None  # it tests, then answers

    def default_rubric(self) -> Rubric:
        """1.0 when the answer passes every case, else 0 (the buggy code passes some)."""
        return Rubric([code_tests(self.sandbox, timeout=self.timeout, partial=False)])

    def format_prompt(self, task: dict[str, Any]) -> list[Message]:
        """The task's question followed by its buggy code in a ```` ```python ```` block.

        Raises:
            EnvhubError: The task has no ``buggy`` code in its ``info``.
        """
        buggy = task["info"].get("buggy")
        if buggy is None:
            raise EnvhubError(
                f"{self.name}: task {task['info'].get('id', task['question'][:40])!r} "
                "has no 'buggy' code"
            )
        return super().format_prompt(
            {**task, "question": f"{task['question']}\n\nBuggy code:\n{fenced(buggy)}"}
        )

    async def setup_state(self, state: State) -> None:
        """Hand the ``python`` tool its sandbox: the env's own, or the process-wide default."""
        state.data["sandbox"] = self.sandbox or default_sandbox()


def _fix_policy(answers: dict[str, str]) -> Any:
    """Run the solution through the tool once, then answer with it."""

    def test_then_answer(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        question = next(m.content for m in messages if m.role == "user") or ""
        code = answers[question.split("\n\nBuggy code:\n")[0]]
        if messages[-1].role == "tool":
            return fenced(code)
        return tool_call_block("python", {"code": code + "print('loaded')\n"})

    return test_then_answer
