"""What produced a run: every distinct env and sampler its trajectories record.

Each trajectory carries its own :class:`~envhub.types.EnvRef` (name, version, Hub commit) and
:class:`~envhub.types.SamplerRef` (engine, model, version, sampling settings, chat template's
hash); a run's manifest lists the distinct ones, so that one file says what a run was made with.
``envhub eval`` puts it in ``config.json``; ``envhub train`` keeps ``manifest.json`` in the run
folder, updated every step.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from envhub.types import Trajectory


def manifest(trajectories: Iterable[Trajectory]) -> dict[str, list[dict[str, Any]]]:
    """``{"env_refs": [...], "samplers": [...]}``: each distinct env and sampler (as JSON
    objects), in order of first appearance."""
    envs: list[dict[str, Any]] = []
    samplers: list[dict[str, Any]] = []
    for t in trajectories:
        _add(envs, t.env.model_dump(mode="json"))
        if t.sampler is not None:
            _add(samplers, t.sampler.model_dump(mode="json"))
    return {"env_refs": envs, "samplers": samplers}


def update_manifest(path: str | Path, trajectories: Iterable[Trajectory]) -> None:
    """Add what ``trajectories`` were made with to the manifest file at ``path`` (written
    when missing; entries already there stay first)."""
    path = Path(path)
    known = json.loads(path.read_text()) if path.exists() else {"env_refs": [], "samplers": []}
    new = manifest(trajectories)
    for key in ("env_refs", "samplers"):
        for entry in new[key]:
            _add(known.setdefault(key, []), entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(known, indent=2) + "\n")


def _add(entries: list[dict[str, Any]], entry: dict[str, Any]) -> None:
    if entry not in entries:
        entries.append(entry)
