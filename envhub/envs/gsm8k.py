"""Grade-school math word problems in the GSM8K format, answered with a boxed number.

Where the problems come from:

- ``source="local"`` (the default): 300 GSM8K-style problems shipped with envhub
  (``envhub/envs/data/gsm8k_style.jsonl``, written by ``scripts/make_gsm8k_style.py``), so
  the env works offline. They are one ``train`` split; use ``split="train[:80%]"`` and
  ``split="train[80%:]"`` (``datasets`` slicing) to hold some out;
- ``data_files=``: your own JSON/JSONL files in the GSM8K format (a path or a list of paths
  is the ``train`` split; a dict maps split names to paths);
- any other ``source``: a Hub dataset id such as ``"openai/gsm8k"`` (config ``"main"``), the
  real GSM8K, when the Hub can be reached.

Each row has a ``question`` and an ``answer``, a worked solution whose last line is
``#### <number>``. The task's answer is that number (commas removed); the whole solution is
kept in ``info["solution"]``. Rows are read with ``datasets.load_dataset`` when the first env
needs them and cached per (source, config, split, files), so making many envs is cheap.

Reward: 1.0 for the right number (math-verify) plus 0.1 for giving it in ``\\boxed{}``; that 0.1
for the form alone is the env's ``audit_floor`` (see :mod:`envhub.audit`).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envhub.env import SingleTurnEnv
from envhub.errors import EnvhubError
from envhub.rewards.format import has_answer
from envhub.rewards.math import math_answer
from envhub.rewards.rubric import Rubric

SHIPPED_FILE = Path(__file__).parent / "data" / "gsm8k_style.jsonl"
HUB_CONFIGS = {"openai/gsm8k": "main", "gsm8k": "main"}
"""Configs to use for Hub datasets that need one, when none is given."""

_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")

DataFiles = str | Sequence[str] | dict[str, str | Sequence[str]]
# (split, ((path, mtime_ns or None), ...)) pairs: hashable, and new when a file changes.
_FilesKey = tuple[tuple[str, tuple[tuple[str, int | None], ...]], ...]


def final_answer(solution: str) -> str:
    """The number after the last ``####`` of a GSM8K solution, without commas or ``$``.

    Raises:
        ValueError: There is no ``####`` line, or what follows it is not a number.
    """
    _, marker, tail = solution.rpartition("####")
    number = tail.strip().replace(",", "").replace("$", "")
    if not marker or not _NUMBER.match(number):
        raise ValueError(f"a GSM8K answer must end with '#### <number>', got {solution[-60:]!r}")
    return number


def to_task(row: dict[str, Any]) -> dict[str, Any]:
    """A task from one GSM8K row (``question``, ``answer``)."""
    return {
        "question": row["question"],
        "answer": final_answer(row["answer"]),
        "info": {"solution": row["answer"]},
    }


def load_tasks(
    source: str = "local",
    split: str = "train",
    data_files: DataFiles | None = None,
    config: str | None = None,
) -> tuple[dict[str, Any], ...]:
    """Every task of one split (cached: later calls with the same arguments are free)."""
    if data_files is not None and source != "local":
        raise EnvhubError(f"gsm8k: pass either source= ({source!r}) or data_files=, not both")
    files = (
        _files_key(data_files if data_files is not None else {"train": str(SHIPPED_FILE)})
        if source == "local"
        else None
    )
    return _load_tasks(source, config or HUB_CONFIGS.get(source), split, files)


def _files_key(data_files: DataFiles) -> _FilesKey:
    splits = data_files if isinstance(data_files, dict) else {"train": data_files}
    key = []
    for split, paths in splits.items():
        paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        key.append((split, tuple((str(p), _mtime(p)) for p in paths)))
    return tuple(key)


def _mtime(path: str | os.PathLike[str]) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:  # a glob pattern or a missing file: datasets will say which
        return None


@functools.lru_cache(maxsize=16)
def _load_tasks(
    source: str, config: str | None, split: str, files: _FilesKey | None
) -> tuple[dict[str, Any], ...]:
    import datasets

    try:
        if files is not None:
            data_files = {name: [path for path, _ in paths] for name, paths in files}
            rows = datasets.load_dataset("json", data_files=data_files, split=split)
        else:
            rows = datasets.load_dataset(source, config, split=split)
    except Exception as e:
        where = (
            source if files is None else ", ".join(path for _, paths in files for path, _ in paths)
        )
        raise EnvhubError(
            f"gsm8k: cannot load split {split!r} of {where}: {type(e).__name__}: {e}"
        ) from e
    missing = {"question", "answer"} - set(rows.column_names)
    if missing:
        raise EnvhubError(
            f"gsm8k: rows need 'question' and 'answer' columns; missing {sorted(missing)} "
            f"(have {rows.column_names})"
        )
    tasks = []
    for index, row in enumerate(zip(rows["question"], rows["answer"], strict=True)):
        try:
            tasks.append(to_task({"question": row[0], "answer": row[1]}))
        except ValueError as e:
            raise EnvhubError(f"gsm8k: row {index} of split {split!r}: {e}") from e
    return tuple(tasks)


SYSTEM_PROMPT = (
    "Solve the math word problem step by step. Give the final answer as \\boxed{NUMBER}."
)


class GSM8KEnv(SingleTurnEnv):
    """Grade-school math word problems (GSM8K format), answered in \\boxed{}.

    Args:
        source: ``"local"`` for the shipped problems (or ``data_files``), else a Hub dataset id
            such as ``"openai/gsm8k"``.
        split: Split to use, with ``datasets`` slicing if you like (``"train[:100]"``).
        data_files: Your own JSON/JSONL files in the GSM8K format, instead of the shipped ones.
        config: Hub dataset config (default: ``"main"`` for ``openai/gsm8k``).
        **kwargs: See :class:`~envhub.env.TaskEnv` (``dataset``, ``rubric``,
            ``system_prompt``, ...).
    """

    name = "gsm8k"
    version = "0.1.0"
    system_prompt = SYSTEM_PROMPT
    default_max_turns = 1
    reward_range = (0.0, 1.1)
    pass_threshold = 1.0
    audit_floor = 0.1  # the format credit: any \boxed{} earns it, right or not

    def __init__(
        self,
        source: str = "local",
        split: str = "train",
        data_files: DataFiles | None = None,
        config: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.source, self.split, self.data_files, self.config = source, split, data_files, config
        super().__init__(**kwargs)

    def load_dataset(self) -> tuple[dict[str, Any], ...]:
        """The problems of ``split`` from ``source`` or ``data_files`` (see :func:`load_tasks`)."""
        return load_tasks(self.source, self.split, self.data_files, self.config)

    def default_rubric(self) -> Rubric:
        """1.0 when the final answer matches the reference, 0.1 for giving a final answer."""
        return Rubric(
            [math_answer(weight=1.0, name="correct"), has_answer(weight=0.1, name="format")]
        )
