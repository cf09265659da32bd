"""Conversations to learn from, out of an ``sft.sources`` entry, filtered by reward.

Three kinds of source, one result: :class:`Conversation` s (OpenAI messages, tools, reward,
where each came from) and a count of what was left out and why.

- ``env``: the env's ``reference_policy`` plays ``num_tasks`` of its tasks through the rollout
  runner (the env's own reward decides; failed episodes are left out), so demonstrations are
  made on the fly from what ``envhub check`` already verifies.
- ``path``: JSONL records, each either a recorded episode (``envhub eval``'s
  ``trajectories.jsonl``, a run's ``trajectories/step-*.jsonl``: a
  :class:`~envhub.types.Trajectory`) or a ``{"messages": [...], "tools": [...]}`` record.
- ``dataset``: rows of a ``datasets`` dataset with the same fields.

A record that cannot be read is counted with its reason, never raised, unless nothing at all
can be read (then the error names the first problem).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.errors import ConfigError
from envhub.trainer.sft.config import DemoSource
from envhub.types import Message, Trajectory, as_message


@dataclass(frozen=True)
class Conversation:
    """One conversation to learn from."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None
    reward: float | None
    """Its reward, when the source has one."""
    origin: str
    """Where it came from (``calculator task 12``, ``demos.jsonl:3``)."""


@dataclass
class SourceResult:
    """What one source gave: the conversations kept and why the others were left out."""

    source: DemoSource
    conversations: list[Conversation] = field(default_factory=list)
    read: int = 0
    """Records (episodes, lines, rows) read."""
    dropped: Counter[str] = field(default_factory=Counter)
    """Reason -> records left out for it."""
    first_problem: str | None = None

    def drop(self, reason: str, detail: str | None = None) -> None:
        """Count a record left out for ``reason`` (``detail``: the first one's specifics)."""
        self.dropped[reason] += 1
        if self.first_problem is None:
            self.first_problem = f"{reason}: {detail}" if detail else reason

    def describe(self) -> str:
        """``kept 60 of 64 (4 below reward 1)``."""
        text = f"{self.source.describe()}: kept {len(self.conversations)} of {self.read}"
        if self.dropped:
            text += " (" + ", ".join(f"{n} {why}" for why, n in self.dropped.items()) + ")"
        return text


async def load_source(source: DemoSource, seed: int = 0) -> SourceResult:
    """The conversations of ``source`` that pass its reward filter (see the module doc).

    Raises:
        ConfigError: The env has no reference policy, the file or dataset is missing, or not
            one of its records could be read (the message names the first problem).
    """
    result = SourceResult(source)
    if source.env is not None:
        await _play_reference(source, seed, result)
    elif source.path is not None:
        _add_records(result, _jsonl_records(Path(source.path)), source.min_reward)
    else:
        _add_records(result, _dataset_records(source), source.min_reward)
    if result.read and not result.conversations and result.first_problem:
        raise ConfigError(
            f"sft.sources: {source.describe()} gave no usable conversation "
            f"({result.read} read; first problem: {result.first_problem})"
        )
    if not result.read:
        raise ConfigError(f"sft.sources: {source.describe()} holds no record")
    return result


# -- an env's reference policy ---------------------------------------------------------------


async def _play_reference(source: DemoSource, seed: int, result: SourceResult) -> None:
    """Play the env's reference policy on ``num_tasks`` tasks; keep the episodes that reach
    the source's reward bar."""
    import envhub
    from envhub.checks.checker import spread_tasks
    from envhub.evaluation import evaluate
    from envhub.testing import ScriptedEngine

    assert source.env is not None
    with envhub.make(source.env, **source.args) as env:
        policy = getattr(env, "reference_policy", None)
        if policy is None:
            raise ConfigError(
                f"sft.sources: env {env.name!r} has no reference_policy (or these args void "
                "it), so it cannot demonstrate its tasks; give recorded demonstrations instead "
                "(path: a JSONL of episodes or messages, or dataset:)"
            )
        size = len(env.dataset) if hasattr(env, "dataset") else source.num_tasks
        bar = source.min_reward if source.min_reward is not None else top_reward(env)
    tasks = sorted(set(spread_tasks(min(source.num_tasks, size), size)))
    played = await evaluate(
        ScriptedEngine(policy), source.env, tasks, env_args=source.args, seed=seed
    )
    for t in played.trajectories:
        result.read += 1
        if t.outcome != "ok":
            result.drop(f"{t.outcome.replace('_', ' ')}s", _first_error(t))
        elif t.reward < bar:
            result.drop(f"below reward {bar:g}", f"task {t.task_index} scored {t.reward:g}")
        else:
            origin = f"{t.env.name} task {t.task_index}"
            result.conversations.append(Conversation(list(t.messages), t.tools, t.reward, origin))


def top_reward(env: Any) -> float:
    """The reward a demonstration must reach: the top of the env's ``reward_range``, or its
    ``pass_threshold`` when the range is open."""
    high = float(getattr(env, "reward_range", (0.0, math.inf))[1])
    return high if math.isfinite(high) else float(getattr(env, "pass_threshold", 1.0))


def _first_error(t: Trajectory) -> str | None:
    error = next(iter(t.errors), None)
    return None if error is None else f"{error.stage}: {error.type}: {error.message}"


# -- records: JSONL files and datasets ---------------------------------------------------------


def _add_records(
    result: SourceResult, records: Iterable[tuple[str, Any]], min_reward: float | None
) -> None:
    """Read each ``(origin, record)``; keep the conversations at or above ``min_reward``."""
    for origin, record in records:
        result.read += 1
        if isinstance(record, ValueError):  # a line that is not JSON
            result.drop("unreadable", f"{origin}: {record}")
            continue
        try:
            conversation = read_record(record, origin)
        except ValueError as e:
            result.drop("unreadable", f"{origin}: {e}")
            continue
        if conversation is None:
            result.drop("unfinished or failed episodes", origin)
        elif (
            min_reward is not None
            and conversation.reward is not None
            and (conversation.reward < min_reward)
        ):
            result.drop(f"below reward {min_reward:g}", origin)
        else:
            result.conversations.append(conversation)


def read_record(record: Any, origin: str) -> Conversation | None:
    """One record as a conversation: a recorded episode (``None`` unless it ended on its own
    and was scored: outcome ``ok``) or a ``messages`` record.

    Raises:
        ValueError: The record is neither, or its messages or tools are malformed.
    """
    if not isinstance(record, dict) or "messages" not in record:
        raise ValueError("a record needs a 'messages' list (OpenAI chat format)")
    if "env" in record and "task_index" in record:  # a recorded episode
        try:
            t = Trajectory.model_validate(record)
        except Exception as e:  # noqa: BLE001 - pydantic's message says what is wrong
            raise ValueError(f"not a readable episode record: {e}") from None
        if t.outcome != "ok":
            return None
        return Conversation(list(t.messages), t.tools, t.reward, origin)
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    try:
        parsed = [as_message(m) for m in messages]
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"a message is not in OpenAI chat format: {e}") from None
    reward = record.get("reward")
    if reward is not None and not isinstance(reward, (int, float)):
        raise ValueError(f"'reward' must be a number, got {reward!r}")
    return Conversation(parsed, _tools(record.get("tools")), reward, origin)


def _tools(value: Any) -> list[dict[str, Any]] | None:
    """``tools`` as a list of OpenAI schemas (datasets often store them as a JSON string)."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError("'tools' is a string that is not JSON") from None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ValueError("'tools' must be a list of OpenAI tool schemas")
    return value


def _jsonl_records(path: Path) -> Iterator[tuple[str, Any]]:
    """``(file:line, record)`` of a JSONL file, or of every ``*.jsonl`` file of a folder (not
    its subfolders: a run's ``trajectories/eval/`` holds held-out episodes); a line that is
    not JSON comes as the ``ValueError`` saying so."""
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
    elif path.is_file():
        files = [path]
    else:
        raise ConfigError(f"sft.sources: {path} does not exist")
    for file in files:
        with file.open() as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    record: Any = json.loads(line)
                except ValueError as e:
                    record = ValueError(f"not JSON ({e})")
                yield f"{file.name}:{number}", record


def _dataset_records(source: DemoSource) -> Iterator[tuple[str, Any]]:
    """``(dataset[row], row)`` of the dataset's split."""
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - datasets is a core dependency
        raise ConfigError("sft.sources: dataset needs the `datasets` package") from e
    assert source.dataset is not None
    local = Path(source.dataset).expanduser()
    try:
        if local.is_dir():
            loaded = datasets.load_from_disk(str(local))
            rows = loaded[source.split] if isinstance(loaded, datasets.DatasetDict) else loaded
        else:
            rows = datasets.load_dataset(source.dataset, split=source.split)
    except Exception as e:  # noqa: BLE001 - missing, offline, or no such split
        raise ConfigError(f"sft.sources: cannot load dataset {source.dataset!r}: {e}") from None
    for index, row in enumerate(rows):
        yield f"{source.dataset}[{index}]", row
