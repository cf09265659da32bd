"""The Hub card of an env package: the package README with Hub metadata and the check report.

The YAML front matter gains the ``envhub`` tag and ``library_name: envhub`` (the Hub indexes
both, ``envhub search`` filters on the tag); the body gains a section, between markers so that
the next push replaces it, with the install command and the ``envhub check`` report.

When ``envhub check`` measured the envs (:mod:`envhub.evaluation.perf`), the section gains a
performance table with the machine it ran on, and the front matter the same numbers under
``envhub: {performance: {machine: ..., envs: {NAME: ...}}}``: the Hub returns the front matter
in its listings (``cardData``), so ``envhub search`` shows them without downloading packages.
"""

from __future__ import annotations

from typing import Any

import yaml

from envhub.hub.client import TAG

BEGIN = "<!-- envhub:begin (written by envhub push; edits here are replaced) -->"
END = "<!-- envhub:end -->"
CARD_LEADERBOARD = "<!-- envhub:leaderboard (written by envhub push and eval --push) -->"
LEADERBOARD_END = "<!-- envhub:leaderboard:end -->"


def split_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """(metadata, body) of a README; no front matter gives ``({}, text)``."""
    if not text.startswith("---"):
        return {}, text
    block, sep, body = text[3:].partition("\n---")
    if not sep:
        return {}, text
    meta = yaml.safe_load(block) or {}
    return (meta if isinstance(meta, dict) else {}), body.lstrip("-").lstrip("\n")


def render_card(
    readme: str,
    *,
    repo_id: str,
    version: str,
    envs: dict[str, str],
    description: str,
    report_markdown: str | None,
    performance: dict[str, Any] | None = None,
    machine: dict[str, Any] | None = None,
    leaderboard: str | None = None,
) -> str:
    """The README.md uploaded for a package.

    ``performance`` (env name -> :class:`envhub.evaluation.perf.Performance`) and ``machine``
    come from the check report; without them the card has no performance numbers.
    ``leaderboard`` is the leaderboard section (:func:`envhub.hub.leaderboard.card_section`);
    without it the card has none, and ``envhub eval --push`` leaves the card as it is.
    """
    meta, body = split_front_matter(_without(readme, CARD_LEADERBOARD, LEADERBOARD_END))
    tags = [str(t) for t in meta.get("tags") or []]
    meta["tags"] = [TAG, *(t for t in tags if t != TAG)]
    meta["library_name"] = "envhub"
    _performance_metadata(meta, performance or {}, machine or {})
    if BEGIN in body:
        before, _, rest = body.partition(BEGIN)
        body = before.rstrip("\n") + "\n" + rest.partition(END)[2].lstrip("\n")
    body = body.rstrip("\n") or f"# {repo_id}\n\n{description}"
    report = report_markdown or "`envhub check` was skipped for this version (`--skip-check`).\n"
    section = (
        f"{BEGIN}\n## Install with envhub\n\n"
        f"```bash\nenvhub install {repo_id}@{version} --trust\n```\n\n"
        f"Envs: {', '.join(f'`{n}`' for n in sorted(envs))}. "
        f'In Python: `envhub.make("{repo_id}@{version}", trust_remote_code=True)`.\n\n'
        f"### Checks of version {version}\n\n{report}"
        f"{_performance_table(version, performance or {}, machine or {})}{END}\n"
    )
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True)
    card = f"---\n{front}---\n\n{body}\n\n{section}"
    return with_leaderboard(card, leaderboard) if leaderboard else card


def _without(text: str, begin: str, end: str) -> str:
    """``text`` less the section from ``begin`` to ``end`` (markers included), if it has one."""
    if begin not in text:
        return text
    before, _, rest = text.partition(begin)
    return before.rstrip("\n") + "\n" + rest.partition(end)[2].lstrip("\n")


def with_leaderboard(card: str, section: str) -> str:
    """``card`` with its leaderboard section replaced by ``section`` (added at the end when it
    has none)."""
    block = f"{CARD_LEADERBOARD}\n{section.rstrip()}\n{LEADERBOARD_END}\n"
    if CARD_LEADERBOARD not in card:
        return f"{card.rstrip()}\n\n{block}"
    before, _, rest = card.partition(CARD_LEADERBOARD)
    return before + block + rest.partition(LEADERBOARD_END)[2].lstrip("\n")


def _performance_metadata(
    meta: dict[str, Any], performance: dict[str, Any], machine: dict[str, Any]
) -> None:
    """Put the numbers under ``envhub.performance`` in the front matter; without numbers, take
    out any stale ones (a README copied from an earlier card)."""
    ours = meta.get("envhub") if isinstance(meta.get("envhub"), dict) else {}
    ours.pop("performance", None)
    if performance:
        ours["performance"] = {"machine": machine, "envs": performance}
    if ours:
        meta["envhub"] = ours
    else:
        meta.pop("envhub", None)


PERFORMANCE_COLUMNS = (
    "env", "policy", "episodes", "episodes/s", "reset p50", "step p50", "step p99",
    "CPU / episode", "peak RSS", "sandbox cold start",
)  # fmt: skip


def _performance_table(version: str, performance: dict[str, Any], machine: dict[str, Any]) -> str:
    if not performance:
        return ""
    from envhub.evaluation.perf import machine_line

    rows = "".join(
        f"| {' | '.join(performance_cells(name, p))} |\n"
        for name, p in sorted(performance.items())
    )
    return (
        f"\n### Performance of version {version}\n\n"
        f"Measured by `envhub check` on the pushing machine: {machine_line(machine)}. "
        "Each env is played by its scripted policy (`reference`; `null`, the empty reply, where "
        "it has none); step times are `env.step` alone, rewards included.\n\n"
        f"| {' | '.join(PERFORMANCE_COLUMNS)} |\n|{'---|' * len(PERFORMANCE_COLUMNS)}\n{rows}"
    )


def performance_cells(name: str, p: dict[str, Any]) -> list[str]:
    """One env's performance numbers as the cells under :data:`PERFORMANCE_COLUMNS`."""
    from envhub.evaluation.perf import format_ms, format_rate

    return [
        name,
        p["policy"],
        str(p["episodes"]),
        format_rate(p["episodes_per_s"]),
        *(format_ms(p[key]) for key in ("reset_p50_ms", "step_p50_ms", "step_p99_ms")),
        format_ms(p["cpu_ms_per_episode"]),
        "—" if p["peak_rss_mb"] is None else f"{p['peak_rss_mb']:g} MiB",
        format_ms(p["sandbox"]["cold_start_ms"]) if p["sandbox"] else "—",
    ]
