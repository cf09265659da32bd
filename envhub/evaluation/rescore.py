"""Re-score stored trajectories with another env version, without generating again.

``envhub rescore RESULTS --env REF`` reads the trajectories of an eval folder
(``trajectories.jsonl``), a training run (``trajectories/step-*.jsonl``) or one JSONL file,
replays each episode through the env ``REF`` (:mod:`envhub.rollout.replay`: reset with the
stored seed and task, step with the stored assistant turns), recomputes its rubric, group
rewards per group included, and writes the re-scored trajectories to a new folder with the same
layout. The originals are never touched.

Each re-scored trajectory carries ``REF``'s :class:`~envhub.types.EnvRef` and, under
``info["rescore"]``, what it had before: ``env``, ``reward``, ``reward_components``, and the
replay's ``divergence`` (``None`` when every env reply matched the stored one). Not re-scored,
and copied with ``info["rescore"]`` = ``{"skipped": "failed" | "other_env", "why": ...}``:

- episodes that failed before their end (``stop_reason`` ``error`` or ``timeout``): there is no
  end to score; they still join their group's replay, so that group rewards see the group the
  runner saw;
- episodes of another env than ``REF``'s (a run over several envs): counted; when no episode
  is of ``REF``'s env at all, nothing is written and :class:`~envhub.errors.ConfigError` says
  which envs the results hold.

The env is made with the arguments the results were made with (``env_args`` of an eval's
``config.json``; the matching ``envs`` entry of a training run's), which ``env_args`` here
extend or override.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from envhub.env import Env
from envhub.errors import ConfigError
from envhub.rewards.rubric import add_group_scores
from envhub.rollout.io import TrajectoryWriter, read_trajectories
from envhub.rollout.replay import Replay, replay_episode
from envhub.types import EnvRef, Trajectory

_RUNNER_METRICS = ("turns", "completion_tokens", "total_tokens")
"""Metrics the runner counts itself (the rest are the env's, and are recomputed)."""
BIGGEST = 5
"""How many of the largest reward changes a report lists."""


@dataclass(frozen=True)
class Results:
    """Where stored trajectories are."""

    kind: Literal["eval", "train", "file"]
    root: Path
    """The folder ``files`` are relative to."""
    files: list[Path]


def find_results(path: Path) -> Results:
    """The trajectory files of an eval folder, a training run folder or a single JSONL file.

    Raises:
        ConfigError: ``path`` is none of those.
    """
    if path.is_file():
        return Results("file", path.parent, [Path(path.name)])
    if (path / "trajectories.jsonl").is_file():
        return Results("eval", path, [Path("trajectories.jsonl")])
    steps = sorted((path / "trajectories").glob("step-*.jsonl"))
    if steps:
        return Results("train", path, [s.relative_to(path) for s in steps])
    raise ConfigError(
        f"{path} holds no trajectories: give an `envhub eval` folder (trajectories.jsonl), an "
        "`envhub train` run folder (trajectories/step-*.jsonl) or a .jsonl file"
    )


def stored_env_args(results: Results, env: str) -> dict[str, Any]:
    """The env arguments the results were made with: an eval's ``env_args``; for a training run,
    the ``args`` of its ``envs`` entry named ``env``, or of its only entry; else none."""
    config = _config_of(results)
    if "env_args" in config:
        return dict(config["env_args"] or {})
    specs = config.get("envs") or []
    named = [s for s in specs if s.get("name") == env]
    chosen = named or (specs if len(specs) == 1 else [])
    return dict(chosen[0].get("args") or {}) if chosen else {}


def _config_of(results: Results) -> dict[str, Any]:
    """``config.json`` of the eval or run the results belong to (a step file's run is two
    folders up), or ``{}``."""
    for folder in (results.root, results.root.parent):
        path = folder / "config.json"
        if path.is_file():
            return json.loads(path.read_text())
    return {}


class Change(BaseModel):
    """One episode's reward before and after."""

    where: str
    """``FILE:LINE`` (line from 0, as ``envhub show -e`` counts)."""
    task_index: int
    sample_index: int
    before: float
    after: float


class Divergence(BaseModel):
    """An episode whose replay met env replies other than the stored ones."""

    where: str
    task_index: int
    sample_index: int
    detail: str


class RescoreReport(BaseModel):
    """What re-scoring changed (saved as ``rescore.json`` next to the new trajectories)."""

    env: EnvRef
    """The env the trajectories were re-scored with."""
    scored_by: list[EnvRef]
    """The envs that had scored the re-scored episodes."""
    episodes: int
    rescored: int
    changed: int
    """Re-scored episodes whose reward changed."""
    components_changed: int
    """Re-scored episodes whose reward components changed (any of them, or which there are)."""
    reward_before: float
    """Mean reward of the re-scored episodes, before."""
    reward_after: float
    components: dict[str, tuple[float | None, float | None]]
    """Each component's mean over the re-scored episodes, before and after (``None``: absent)."""
    biggest_changes: list[Change]
    divergences: list[Divergence]
    failed: int
    """Episodes not re-scored because they failed before their end."""
    other_env: int
    """Episodes not re-scored because another env made them."""
    output: str


async def rescore_groups(
    groups: list[list[Trajectory]], factory: Callable[[], Env], concurrency: int = 8
) -> tuple[EnvRef, list[list[Trajectory]]]:
    """The env's ref (with its Hub commit), and each group's trajectories re-scored with envs
    from ``factory`` (``concurrency`` groups at a time, each on one env) or copied with the
    reason they were not."""
    pool = _EnvPool(factory, concurrency)
    try:
        probe = await pool.make()  # a bad reference or argument fails here, before any replay
        name, ref = probe.ref.name, _env_ref(probe)
        rescored = await asyncio.gather(*(_rescore_group(pool, g, name, ref) for g in groups))
        return ref, list(rescored)
    finally:
        pool.close()


async def _rescore_group(
    pool: _EnvPool, group: list[Trajectory], name: str, ref: EnvRef
) -> list[Trajectory]:
    if group[0].env.name != name:
        return [_skipped(t, "other_env", f"made by env {t.env.name}, not {name}") for t in group]
    # In sample order, as the runner scored the group (group rewards may depend on it).
    order = sorted(range(len(group)), key=lambda i: group[i].sample_index)
    replays: list[Replay] = [Replay()] * len(group)
    async with pool.env() as env:
        for i in order:
            replays[i] = await replay_episode(env, group[i])
        await add_group_scores(env, [replays[i] for i in order])
    return [
        _skipped(t, "failed", f"failed before its end ({t.stop_reason})")
        if t.stop_reason in ("error", "timeout")
        else _rescored(t, replay, ref)
        for t, replay in zip(group, replays, strict=True)
    ]


def _rescored(t: Trajectory, replay: Replay, ref: EnvRef) -> Trajectory:
    metrics = replay.metrics | {k: t.metrics[k] for k in _RUNNER_METRICS if k in t.metrics}
    before = {
        "env": t.env.model_dump(mode="json"),
        "reward": t.reward,
        "reward_components": dict(t.reward_components),
        "divergence": replay.divergence,
    }
    return t.model_copy(
        update={
            "env": ref,
            "reward": 0.0 if replay.failed else replay.reward,  # as the runner scores failures
            "reward_components": replay.components,
            "errors": replay.errors,
            "terminated": replay.terminated,
            "truncated": replay.truncated or replay.failed,
            "stop_reason": replay.stop_reason,
            "metrics": metrics,
            "info": {**t.info, "rescore": before},
        }
    )


def _skipped(t: Trajectory, kind: str, why: str) -> Trajectory:
    return t.model_copy(update={"info": {**t.info, "rescore": {"skipped": kind, "why": why}}})


def _env_ref(env: Env) -> EnvRef:
    from envhub.hub.provenance import env_ref  # with the Hub commit it was installed from

    return env_ref(env)


class _EnvPool:
    """Up to ``size`` envs in use at once, made when first needed and reused."""

    def __init__(self, factory: Callable[[], Env], size: int) -> None:
        if size < 1:
            raise ConfigError(f"concurrency must be at least 1, got {size}")
        self.factory = factory
        self.idle: list[Env] = []
        self.made: list[Env] = []
        self.slots = asyncio.Semaphore(size)

    async def make(self) -> Env:
        """A new env, idle in the pool."""
        env = await asyncio.to_thread(self.factory)
        self.made.append(env)
        self.idle.append(env)
        return env

    @asynccontextmanager
    async def env(self) -> AsyncIterator[Env]:
        """An env for one group, back in the pool afterwards."""
        async with self.slots:
            if not self.idle:
                await self.make()
            env = self.idle.pop()
            try:
                yield env
            finally:
                self.idle.append(env)

    def close(self) -> None:
        """Close every env made."""
        for env in self.made:
            env.close()


# -- results folders ------------------------------------------------------------------------------


def rescore_results(
    results: Path,
    factory: Callable[[], Env],
    output: Path,
    concurrency: int = 8,
) -> RescoreReport:
    """Re-score the trajectories at ``results`` with envs from ``factory``; write them, in the
    same layout, under ``output`` (with ``rescore.json``, and an eval's ``summary.json``).

    Raises:
        ConfigError: ``results`` holds no trajectories, ``output`` is not empty, or no episode
            is of the env's kind.
    """
    source = find_results(results)
    if output.exists() and any(output.iterdir()):
        raise ConfigError(f"{output} is not empty; give another --output")
    stored = {f: read_trajectories(source.root / f) for f in source.files}
    groups: dict[tuple[Path, str], list[Trajectory]] = {}
    for file, trajectories in stored.items():
        for t in trajectories:
            groups.setdefault((file, t.group_id), []).append(t)
    if not groups:
        raise ConfigError(f"{results} holds no trajectories (its files are empty)")
    ref, rescored = asyncio.run(rescore_groups(list(groups.values()), factory, concurrency))
    # Back into each file's order: a group's trajectories keep their order within it.
    by_group = {key: iter(group) for key, group in zip(groups, rescored, strict=True)}
    new = {f: [next(by_group[(f, t.group_id)]) for t in ts] for f, ts in stored.items()}
    report = build_report(stored, new, ref, output)
    if report.other_env == report.episodes:
        made_by = sorted({t.env.name for ts in stored.values() for t in ts})
        raise ConfigError(
            f"no episode in {results} is of env {report.env.name}: they are of {', '.join(made_by)}"
        )
    _write(source, new, report, output)
    return report


def _write(
    source: Results, new: dict[Path, list[Trajectory]], report: RescoreReport, output: Path
) -> None:
    for file, trajectories in new.items():
        with TrajectoryWriter(output / file) as writer:
            for t in trajectories:
                writer.write(t)
    if source.kind == "eval":
        from envhub.evaluation import summarize

        saved = source.root / "summary.json"
        threshold = (
            json.loads(saved.read_text()).get("pass_threshold", 1.0) if saved.is_file() else 1.0
        )
        summary = summarize(new[source.files[0]], threshold)
        (output / "summary.json").write_text(summary.model_dump_json(indent=2))
    (output / "rescore.json").write_text(report.model_dump_json(indent=2))


def build_report(
    stored: dict[Path, list[Trajectory]],
    new: dict[Path, list[Trajectory]],
    env: EnvRef,
    output: Path,
) -> RescoreReport:
    """Compare the stored trajectories with their re-scored copies (same files, same order)."""
    pairs = [
        (f"{file}:{line}", old, now)
        for file in stored
        for line, (old, now) in enumerate(zip(stored[file], new[file], strict=True))
    ]
    done = [(w, old, now) for w, old, now in pairs if "skipped" not in now.info["rescore"]]
    skipped = [now.info["rescore"].get("skipped") for _, _, now in pairs]
    changed = [(w, old, now) for w, old, now in done if old.reward != now.reward]
    return RescoreReport(
        env=env,
        scored_by=_distinct(old.env for _, old, _ in done),
        episodes=len(pairs),
        rescored=len(done),
        changed=len(changed),
        components_changed=sum(
            old.reward_components != now.reward_components for _, old, now in done
        ),
        reward_before=_mean([old.reward for _, old, _ in done]),
        reward_after=_mean([now.reward for _, _, now in done]),
        components=_component_means(done),
        biggest_changes=_biggest(changed),
        divergences=[
            Divergence(
                where=w,
                task_index=now.task_index,
                sample_index=now.sample_index,
                detail=now.info["rescore"]["divergence"],
            )
            for w, _, now in done
            if now.info["rescore"]["divergence"]
        ],  # fmt: skip
        failed=skipped.count("failed"),
        other_env=skipped.count("other_env"),
        output=str(output),
    )


def _biggest(changed: list[tuple[str, Trajectory, Trajectory]]) -> list[Change]:
    ranked = sorted(changed, key=lambda c: -abs(c[2].reward - c[1].reward))[:BIGGEST]
    return [
        Change(where=w, task_index=old.task_index, sample_index=old.sample_index,
               before=old.reward, after=now.reward)
        for w, old, now in ranked
    ]  # fmt: skip


def _component_means(
    done: list[tuple[str, Trajectory, Trajectory]],
) -> dict[str, tuple[float | None, float | None]]:
    names = list(dict.fromkeys(
        n for _, old, now in done for n in [*old.reward_components, *now.reward_components]
    ))  # fmt: skip

    def mean(side: int, name: str) -> float | None:
        values = [
            p[side].reward_components[name] for p in done if name in p[side].reward_components
        ]
        return _mean(values) if values else None

    return {n: (mean(1, n), mean(2, n)) for n in names}


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _distinct(refs: Iterable[EnvRef]) -> list[EnvRef]:
    return list(dict.fromkeys(refs))


# -- the report in words ---------------------------------------------------------------------------


def report_lines(report: RescoreReport) -> list[str]:
    """The report as the lines ``envhub rescore`` prints."""
    env = _name(report.env)
    before = ", ".join(_name(r) for r in report.scored_by) or "-"
    lines = [
        f"rescored {report.rescored} of {report.episodes} episodes with {env} (scored by {before})",
        f"reward: {_delta(report.reward_before, report.reward_after)}",
        *(f"  {n}: {_delta(b, a)}" for n, (b, a) in report.components.items()),
        f"changed: {report.changed} rewards, {report.components_changed} component sets "
        f"(of {report.rescored} episodes)",
    ]
    if report.biggest_changes:
        lines.append("biggest changes:")
        lines += [
            f"  {c.where} (task {c.task_index}, sample {c.sample_index}): "
            f"{_delta(c.before, c.after)}"
            for c in report.biggest_changes
        ]
    lines.append(f"replay diverged: {len(report.divergences)} episodes")
    lines += [
        f"  {d.where} (task {d.task_index}, sample {d.sample_index}): {d.detail}"
        for d in report.divergences[:BIGGEST]
    ]
    if report.failed or report.other_env:
        lines.append(
            f"not rescored: {report.failed} failed before their end, "
            f"{report.other_env} of another env"
        )
    lines.append(f"saved: {report.output}")
    return lines


def _name(ref: EnvRef) -> str:
    commit = f" ({ref.commit[:12]})" if ref.commit else ""
    return f"{ref.name} {ref.version}{commit}" if ref.version else ref.name + commit


def _delta(before: float | None, after: float | None) -> str:
    """``1.000 -> 0.500 (-0.500)``; a missing side is ``-``."""
    text = f"{_number(before)} -> {_number(after)}"
    if before is not None and after is not None and after != before:
        text += f" ({after - before:+.3f})"
    return text


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
