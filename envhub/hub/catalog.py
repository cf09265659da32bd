"""``envhub catalog``: one self-contained HTML page of the Hub's env packages.

The packages are the ones ``envhub search`` lists (repos tagged ``envhub``). For each, the page
shows what its latest version's ``envhub.json`` says (description, envs with their kind and
tools, the check's verdict, the reward audit and the performance numbers), its versions (the
repo's version tags), the leaderboard of that version (:mod:`envhub.hub.leaderboard`, from the
results on ``main``) and the command that installs it. The data is one JSON document, built here;
the page (:mod:`envhub.report.catalog`) only draws it, searches and filters it.

A package that cannot be read (no version tag yet, a manifest the Hub lost) is listed under
``skipped`` with the reason, never fatal: one broken repo must not hide the rest.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from envhub.errors import HubError
from envhub.hub import client
from envhub.hub.search import HubPackage, search

WORKERS = 8
"""Packages read at once: each needs a few small Hub requests, so the wait is the network's."""


def build(
    query: str | None = None,
    *,
    author: str | None = None,
    limit: int = 1000,
    token: str | None = None,
) -> dict[str, Any]:
    """The catalog document of the env packages ``envhub search`` finds for ``query``."""
    from envhub.version import __version__

    listed = search(query, author=author, limit=limit, token=token)
    api = client.api(token)
    with ThreadPoolExecutor(WORKERS) as pool:
        read = list(pool.map(lambda p: _read(api, p), listed))
    return {
        "hub": client.endpoint(),
        "query": query,
        "author": author,
        "built": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "envhub_version": __version__,
        "packages": [entry for entry in read if "skipped" not in entry],
        "skipped": [entry for entry in read if "skipped" in entry],
    }


def _read(api: Any, package: HubPackage) -> dict[str, Any]:
    try:
        return entry(api, package)
    except HubError as e:
        return {"repo": package.repo_id, "skipped": str(e)}


def entry(api: Any, package: HubPackage) -> dict[str, Any]:
    """One package's part of the document (``{"repo", "skipped"}`` when it has no version)."""
    from envhub.hub.leaderboard import version_key
    from envhub.hub.publish import remote_manifest
    from envhub.hub.results import read_results

    repo = package.repo_id
    with client.hub_errors("list the versions", repo):
        tags = {t.name: t.target_commit for t in api.list_repo_refs(repo).tags}
    versions = sorted(tags, key=version_key, reverse=True)
    if not versions:
        return {"repo": repo, "skipped": "no published version (no version tag)"}
    latest = versions[0]
    manifest = remote_manifest(api, repo, tags[latest])
    if manifest is None:
        return {"repo": repo, "skipped": f"version {latest} has no envhub.json"}
    check = manifest.get("check") or {}
    envs = [_env(name, check) for name in sorted(manifest.get("envs") or {})]
    return {
        "repo": repo,
        "name": manifest.get("name", repo),
        "description": manifest.get("description", ""),
        "version": latest,
        "versions": versions,
        "updated": package.last_modified[:10],
        "private": package.private,
        "tags": [t for t in package.tags if t != client.TAG],
        "kinds": sorted({e["kind"] for e in envs if e["kind"]}),
        "tools": sorted({t for e in envs for t in e["tools"]}),
        "envs": envs,
        "check": _verdict(check),
        "performance": _performance(check),
        "leaderboard": _leaderboard(repo, read_results(repo, api=api), latest),
        "install": f"envhub install {repo}@{latest} --trust",
    }


def _env(name: str, check: dict[str, Any]) -> dict[str, Any]:
    """An env of the package: its kind and tools (``""`` and ``[]`` when pushed unchecked) and
    its reward audit's summary."""
    kind = (check.get("kinds") or {}).get(name) or {}
    audit = (check.get("audits") or {}).get(name)
    return {
        "name": name,
        "kind": kind.get("kind", ""),
        "tools": list(kind.get("tools", [])),
        "audit": None if audit is None else _audit(audit),
    }


def _audit(audit: dict[str, Any]) -> dict[str, Any]:
    findings = audit.get("findings") or []
    passed = bool(audit.get("passed"))
    policies = audit.get("played") or audit.get("policies") or []
    summary = (
        f"passed: {len(policies)} degenerate policies, none above the floor {audit.get('floor')}"
        if passed
        else f"FAILED: {len(findings)} finding(s)"
        + (f"; {audit['problem']}" if audit.get("problem") else "")
    )
    return {"passed": passed, "findings": len(findings), "summary": summary}


def _verdict(check: dict[str, Any]) -> dict[str, Any]:
    """The check's verdict: ``passed`` is ``None`` when the push skipped it."""
    if check.get("skipped") or "passed" not in check:
        return {"passed": None, "summary": "envhub check was skipped for this version"}
    results = check.get("results") or []
    failed = [r.get("name", "") for r in results if not r.get("passed", True)]
    summary = (
        f"passed every gate ({len(results)})"
        if check["passed"]
        else f"failed {len(failed)} gate(s): {', '.join(failed)}"
    )
    return {"passed": bool(check["passed"]), "summary": summary}


def _performance(check: dict[str, Any]) -> dict[str, Any] | None:
    """The performance card (columns, a row per env, the machine) or ``None``."""
    from envhub.evaluation.perf import machine_line
    from envhub.hub.card import PERFORMANCE_COLUMNS, performance_cells

    performance = check.get("performance") or {}
    envs = performance.get("envs") or {}
    if not envs:
        return None
    try:
        rows = [performance_cells(name, p) for name, p in sorted(envs.items())]
        machine = machine_line(performance.get("machine") or {})
    except (KeyError, TypeError):  # a manifest of another envhub version: leave the card out
        return None
    return {"columns": list(PERFORMANCE_COLUMNS), "rows": rows, "machine": machine}


def _leaderboard(repo: str, results: list[Any], version: str) -> dict[str, Any]:
    """The board of ``version`` as cells, each row's trajectories dataset (``None``: none
    pushed), and which other versions have results."""
    from envhub.hub.leaderboard import COLUMNS, board, cells, others_line

    data = board(repo, results, version)
    return {
        "version": version,
        "columns": list(COLUMNS),
        "rows": [cells(r) for r in data["rows"]],
        "models": [r["model"] for r in data["rows"]],
        "trajectories": [r["trajectories"] for r in data["rows"]],
        "others": others_line(data),
    }


def write_catalog(
    out: str | Path = "catalog.html",
    query: str | None = None,
    *,
    author: str | None = None,
    limit: int = 1000,
    token: str | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Build the catalog and write the page to ``out``; returns the path and the document."""
    from envhub.report.catalog import render

    document = build(query, author=author, limit=limit, token=token)
    target = Path(out)
    target.write_text(render(document), encoding="utf-8")
    return target, document
