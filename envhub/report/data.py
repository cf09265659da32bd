"""The report's data: one JSON document for a run or an eval folder, plus one block per step.

The document holds what the page draws at load (curve specs, the summary, the list of steps); the
episodes of each step sit in their own block so the page parses a step only when it is chosen.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from envhub.errors import ConfigError
from envhub.report.series import shape_chart
from envhub.rollout.io import iter_trajectories
from envhub.types import Trajectory

Decode = Callable[[int], str]
"""Turns one token id into its text (a tokenizer's ``decode([id])``)."""

# (title, y-axis, predicate on a metric key): one chart each, drawn when any key matches.
CHART_GROUPS: list[tuple[str, str, Callable[[str], bool]]] = [
    (
        "Reward per component",
        "reward",
        lambda k: (k.startswith("reward/") and k != "reward/std") or k == "pass@1",
    ),
    (
        "Held-out eval: reward and pass@k",
        "reward",
        lambda k: k.startswith("eval/") and (k.endswith("/reward") or "/pass@" in k),
    ),
    ("Loss", "loss", lambda k: k in ("train/loss", "train/policy_loss")),
    (
        "Demonstrations: negative logprob (warm start, supervised term) and epochs",
        "nats / epochs",
        lambda k: k in ("train/sft_nll", "sft/epoch"),
    ),
    (
        "Distillation: reverse KL to the teacher and its coefficient",
        "nats / weight",
        lambda k: k.startswith("distill/") and k != "distill/teacher_logprob",
    ),
    ("KL and entropy", "nats", lambda k: k in ("train/kl", "train/entropy")),
    ("Clip fraction", "fraction", lambda k: k.startswith("train/clip_frac")),
    (
        "Sampler/trainer mismatch",
        "logprob gap",
        lambda k: k in ("train/mismatch_kl",) or k.startswith("train/mismatch_abs_logprob"),
    ),
    (
        "Lengths",
        "tokens / turns",
        lambda k: k in ("rollout/completion_tokens", "rollout/turns", "rollout/tool_calls"),
    ),
    (
        "Truncation, errors and drift",
        "per episode",
        lambda k: k in ("rollout/truncated", "rollout/errors", "rollout/token_drift"),
    ),
    (
        "Critic: explained variance and value loss",
        "",
        lambda k: k in ("critic/explained_variance", "critic/value_loss", "critic/value_clip_frac"),
    ),
    (
        "Curriculum: skipped share and pass rate of drawn tasks",
        "fraction",
        lambda k: k in ("curriculum/skipped_share", "curriculum/drawn_pass_rate"),
    ),
    (
        "Curriculum: each env's difficulty level",
        "level (0: easiest)",
        lambda k: k.startswith("curriculum/level/"),
    ),
    ("Time by phase", "seconds", lambda k: k.startswith("time/")),
    (
        "Throughput",
        "tokens / s",
        lambda k: k.startswith("throughput/") or k == "engine/tokens_per_second",
    ),
]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl``, in file order (an absent file gives none)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def chart_specs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One spec per chart group that has data: ``{title, yaxis, series: [{name, x, y}]}``.

    A series keeps only the steps that logged its key (eval rows, the step-0 eval, skip others).
    Series with the same points are drawn once, and an all-zero chart gets a range of its own
    (:func:`envhub.report.series.shape_chart`).
    """
    keys = list(dict.fromkeys(k for row in rows for k in row if k != "step"))
    charts = []
    for title, yaxis, wanted in CHART_GROUPS:
        series = [_series(rows, key) for key in keys if wanted(key)]
        if series:
            charts.append(shape_chart({"title": title, "yaxis": yaxis, "series": series}))
    return charts


def _series(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    points = [(row["step"], row[key]) for row in rows if _finite(row.get(key))]
    return {"name": key, "x": [x for x, _ in points], "y": [y for _, y in points]}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def episode_view(
    trajectory: Trajectory,
    index: int,
    trainer_logprobs: list[float | None] | None = None,
    trained_known: bool = False,
) -> dict[str, Any]:
    """What the browser shows of one episode: conversation, scores, tokens (with the sampler's
    logprobs, and the trainer's where the run recorded them), drift and errors.

    ``trained`` says whether the step's update used the episode (it has the trainer's
    logprobs); ``None`` unless ``trained_known`` (the step saved the trainer's logprobs of
    some episode: a step that trained on nothing, or a backend that saves none, leaves it
    unknown)."""
    logprobs = trajectory.sampler_logprobs or []
    return {
        "index": index,
        "task": trajectory.task_index,
        "group": trajectory.group_id,
        "sample": trajectory.sample_index,
        "trained": trainer_logprobs is not None if trained_known else None,
        "reward": trajectory.reward,
        "components": trajectory.reward_components,
        "outcome": trajectory.outcome,
        "stop_reason": trajectory.stop_reason,
        "prompt_length": trajectory.prompt_length,
        # An episode with several roles: which actor this record is, and how it ended for it;
        # each message carries the actor whose turn produced it (``actor``).
        "role": trajectory.role,
        "role_result": trajectory.info.get("role_result") if trajectory.role else None,
        "messages": [m.model_dump(mode="json", exclude_none=True) for m in trajectory.messages],
        "token_ids": trajectory.token_ids or [],
        "loss_mask": trajectory.loss_mask or [],
        # 3 decimals keep a 10k-episode page small; the colour scale needs no more.
        "logprobs": [round(lp, 3) for lp in logprobs],
        "trainer_logprobs": [None if lp is None else round(lp, 3) for lp in trainer_logprobs]
        if trainer_logprobs
        else None,
        "drift": trajectory.token_drift,
        "errors": [e.model_dump(mode="json") for e in trajectory.errors],
    }


def step_block(
    trajectories: Iterable[Trajectory],
    decode: Decode | None,
    trainer_logprobs: dict[int, list[float | None]] | None = None,
) -> dict[str, Any]:
    """The episodes of one step and the text of every token id they use (empty without
    ``decode``: the page then shows ids). ``trainer_logprobs`` maps an episode's index to the
    trainer's logprob per token (:func:`read_trainer_logprobs`)."""
    found = trainer_logprobs or {}
    episodes = [episode_view(t, i, found.get(i), bool(found)) for i, t in enumerate(trajectories)]
    ids = sorted({i for e in episodes for i in e["token_ids"]})
    vocab = {str(i): decode(i) for i in ids} if decode else {}
    return {"episodes": episodes, "vocab": vocab}


def step_files(folder: Path) -> list[tuple[str, str, Path]]:
    """``(key, label, file)`` for each trajectories file of a run or an eval folder, in order:
    training steps first, then held-out evals."""
    if (folder / "trajectories.jsonl").is_file():  # an `envhub eval` folder
        return [("eval", "eval", folder / "trajectories.jsonl")]
    found = []
    for sub, prefix, label in (("", "step", "step"), ("eval", "eval", "eval at step")):
        for file in sorted((folder / "trajectories" / sub).glob("step-*.jsonl")):
            step = int(file.stem.removeprefix("step-"))
            found.append((f"{prefix}-{step}", f"{label} {step}", file))
    return found


def read_trainer_logprobs(file: Path) -> dict[int, list[float | None]]:
    """The trainer's logprobs saved beside a training step's trajectories file
    (``trajectories/trainer/step-N.jsonl``, written by the trainer), by trajectory index; none
    for eval files, steps that trained on nothing and backends that do not return them."""
    sidecar = file.parent / "trainer" / file.name
    if file.parent.name != "trajectories" or not sidecar.is_file():
        return {}
    rows = (json.loads(line) for line in sidecar.read_text().splitlines() if line.strip())
    return {row["trajectory"]: row["logprobs"] for row in rows}


def build(folder: Path, decode: Decode | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The document and the step blocks (by key) for a run folder or an `envhub eval` folder.

    Raises:
        ConfigError: ``folder`` holds neither metrics nor trajectories.
    """
    rows = read_metrics(folder / "metrics.jsonl")
    files = step_files(folder)
    if not rows and not files:
        raise ConfigError(
            f"{folder} holds no metrics.jsonl and no trajectories; give a folder written by "
            "`envhub train` or `envhub eval`"
        )
    blocks = {
        key: step_block(iter_trajectories(file), decode, read_trainer_logprobs(file))
        for key, _, file in files
    }
    steps = [step_entry(key, label, blocks[key]["episodes"]) for key, label, _ in files]
    kind = "eval" if (folder / "trajectories.jsonl").is_file() else "train"
    document = {
        "name": folder.resolve().name,
        "kind": kind,
        "config": _read_json(folder / "config.json"),
        "summary": _read_json(folder / "summary.json"),
        "charts": chart_specs(rows) if kind == "train" else _eval_charts(blocks["eval"]),
        "steps": steps,
        "first_trained": first_trained(steps, blocks),
        "decoded": decode is not None,
    }
    return document, blocks


def step_entry(key: str, label: str, views: list[dict[str, Any]]) -> dict[str, Any]:
    """A step of the browser's list: its episodes, counted as episodes (a multi-role
    episode's records, one per actor, once), and then how many records they made."""
    solo = sum(1 for v in views if v["role"] is None)
    shared = {(v["group"], v["task"], v["sample"]) for v in views if v["role"] is not None}
    entry = {"key": key, "label": label, "episodes": solo + len(shared)}
    if shared:
        entry["trajectories"] = len(views)
    return entry


def first_trained(steps: list[dict[str, Any]], blocks: dict[str, Any]) -> dict[str, Any] | None:
    """``{step, label, episode, task, group}`` of the first episode a training step trained on
    (one with the trainer's logprobs), which the browser shows first; ``None`` when there is
    none (an eval folder, a run that trained on nothing, or one saved without them)."""
    for step in steps:
        for episode in blocks[step["key"]]["episodes"]:
            if episode["trained"]:
                return {"step": step["key"], "label": step["label"], "episode": episode["index"],
                        "task": episode["task"], "group": episode["group"]}  # fmt: skip
    return None


def _eval_charts(block: dict[str, Any]) -> list[dict[str, Any]]:
    """An eval has no steps to plot over: its chart is each episode's reward."""
    rewards = [e["reward"] for e in block["episodes"]]
    series = {"name": "reward", "x": list(range(len(rewards))), "y": rewards, "mode": "markers"}
    return [
        {"title": "Reward per episode", "yaxis": "reward", "xaxis": "episode", "series": [series]}
    ]


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}
