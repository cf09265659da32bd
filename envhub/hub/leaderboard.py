"""Leaderboards of an env package: its Hub results (:mod:`envhub.hub.results`), one env
version at a time, best mean reward first.

Results of different versions are never ranked together: a board is of one version (the
highest that has results unless asked), and says which other versions have results.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from envhub.hub.results import EvalResult

ADD_ONE = "`envhub eval OWNER/NAME@VERSION -u URL --push`"


def version_key(version: str) -> tuple[int, Any]:
    """A sort key of versions: PEP 440 order, names that are not versions first."""
    from packaging.version import InvalidVersion, Version

    try:
        return (1, Version(version))
    except InvalidVersion:
        return (0, version)


def versions(results: Sequence[EvalResult]) -> dict[str, int]:
    """``{version: results}``, highest version first."""
    counts = Counter(r.env.version for r in results)
    return {v: counts[v] for v in sorted(counts, key=version_key, reverse=True)}


def ranked(results: Sequence[EvalResult], version: str) -> list[EvalResult]:
    """The results of ``version``, by mean reward, then pass@1, then the earliest first."""
    mine = [r for r in results if r.env.version == version]
    first = sorted(mine, key=lambda r: r.date)
    return sorted(first, key=lambda r: (r.reward.value, _pass1(r)), reverse=True)


def _pass1(result: EvalResult) -> float:
    return result.pass_at[1].value if 1 in result.pass_at else 0.0


def row(rank: int, result: EvalResult) -> dict[str, Any]:
    """One leaderboard row as JSON."""
    return {
        "rank": rank,
        "model": result.model,
        "model_revision": result.model_revision,
        "reward_mean": result.reward.value,
        "reward_ci95": list(result.reward.ci95) if result.reward.ci95 else None,
        "pass_at": {
            str(k): {"value": e.value, "ci95": list(e.ci95) if e.ci95 else None}
            for k, e in sorted(result.pass_at.items())
        },
        "episodes": result.episodes,
        "tasks": result.tasks,
        "samples_per_task": result.samples_per_task,
        "sampling": result.sampling,
        "by": result.by,
        "pushed_by": result.pushed_by,
        "date": result.date,
        "commit": result.env.commit,
        "envhub_version": result.envhub_version,
        "config_sha256": result.config_sha256,
        "file": result.path(),
        "trajectories": result.trajectories.url if result.trajectories else None,
    }


def board(repo_id: str, results: Sequence[EvalResult], version: str | None = None) -> dict:
    """The leaderboard of ``version`` (default: the highest with results) as JSON:
    ``{"repo", "version", "versions": {version: results}, "rows": [...]}``."""
    counts = versions(results)
    chosen = version or next(iter(counts), None)
    rows = [row(i, r) for i, r in enumerate(ranked(results, chosen or ""), 1)]
    return {"repo": repo_id, "version": chosen, "versions": counts, "rows": rows}


COLUMNS = ("#", "model", "mean reward (95% CI)", "pass@1", "pass@k", "episodes", "sampling",
           "by", "date")  # fmt: skip


def cells(data: dict[str, Any]) -> list[str]:
    """A JSON row's cells, under :data:`COLUMNS`."""
    model = data["model"] + (f"@{data['model_revision']}" if data["model_revision"] else "")
    passes = data["pass_at"]
    top = max(passes, key=int) if passes else None
    sampling, by = data["sampling"], data["by"]
    if by != data["pushed_by"]:
        by += f" (pushed by {data['pushed_by']})"
    return [
        str(data["rank"]),
        model,
        _estimate(data["reward_mean"], data["reward_ci95"]),
        _estimate(**passes["1"]) if "1" in passes else "-",
        f"pass@{top} {_estimate(**passes[top])}" if top and top != "1" else "-",
        f"{data['episodes']} ({data['tasks']} x {data['samples_per_task']})",
        ", ".join(f"{k} {sampling[k]}" for k in ("temperature", "top_p") if k in sampling) or "-",
        by,
        data["date"][:10],
    ]


def _estimate(value: float, ci95: list[float] | None) -> str:
    return f"{value:.3f}" + (f" [{ci95[0]:.3f}, {ci95[1]:.3f}]" if ci95 else "")


def others_line(data: dict[str, Any]) -> str:
    """Which other versions have results, or ``""``."""
    others = [f"{v} ({n})" for v, n in data["versions"].items() if v != data["version"]]
    return f"Results of other versions: {', '.join(others)}." if others else ""


def card_section(results: Sequence[EvalResult], version: str) -> str:
    """The card's leaderboard section (markdown) for ``version``."""
    data = board("", results, version)
    lines = [f"## Leaderboard of version {version}\n"]
    if data["rows"]:
        lines.append(f"| {' | '.join(COLUMNS)} |\n|{'---|' * len(COLUMNS)}")
        lines += [f"| {' | '.join(cells(r))} |" for r in data["rows"]]
    else:
        lines.append(f"No results for version {version} yet.")
    other = others_line(data)
    lines.append(
        ("\n" + other + " " if other else "\n")
        + f"Add a result with {ADD_ONE} (`envhub leaderboard` shows this table)."
    )
    return "\n".join(lines) + "\n"
