"""``envhub.lock``: the exact env packages a project uses, so a training config reproduces them.

One JSON object per Hub repo: the revision asked for, the version and commit it resolved to, and
the content hash checked at install. ``envhub install`` (no argument) installs every entry at its
commit and refuses any whose content no longer matches; ``envhub.make("owner/name@...")``
resolves through the lock when it has the repo.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from envhub.errors import ConfigError

LOCK_FILE = "envhub.lock"
FORMAT = 1


@dataclass(frozen=True)
class LockEntry:
    """One installed package, pinned."""

    repo_id: str
    revision: str
    """What was asked for: a version, a branch or a commit."""
    version: str
    commit: str
    content_hash: str
    envs: list[str] = field(default_factory=list)
    distribution: str = ""

    def matches(self, revision: str | None) -> bool:
        """Whether this entry pins the answer to a request for ``revision`` (``None``: any)."""
        return revision is None or revision in (self.revision, self.version, self.commit)


def read_lock(path: str | Path = LOCK_FILE) -> dict[str, LockEntry]:
    """The entries of the lock file at ``path`` by repo id (empty when there is no file)."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {
            repo_id: LockEntry(repo_id=repo_id, **entry)
            for repo_id, entry in data["packages"].items()
        }
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{path} is not a valid envhub lock file ({type(e).__name__}: {e}); "
            "delete it and install again"
        ) from e


def write_entry(entry: LockEntry, path: str | Path = LOCK_FILE) -> None:
    """Add or replace ``entry`` in the lock file (written whole, then renamed into place)."""
    path = Path(path)
    entries = {**read_lock(path), entry.repo_id: entry}
    packages = {
        repo_id: {k: v for k, v in asdict(e).items() if k != "repo_id"}
        for repo_id, e in sorted(entries.items())
    }
    text = json.dumps({"format": FORMAT, "packages": packages}, indent=2) + "\n"
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(text, encoding="utf-8")
    os.replace(staging, path)
