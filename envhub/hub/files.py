"""Which files of a package go to the Hub, and the hashes that pin them.

A push uploads the package folder minus secrets and junk; what it leaves out is reported, never
silently dropped. Every uploaded file's sha256 goes into ``envhub.json`` (the manifest) with one
*content hash* over them, so an install can check that it got exactly what was pushed, and a
re-push of a version can tell "same content" from "different content".

The content hash covers every file except the card (``README.md``, regenerated with the check
report at each push) and the manifest itself: ``sha256`` of the lines ``"<sha256>  <path>\\n"``
sorted by path.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "envhub.json"
CARD = "README.md"
RESULTS = "results"
"""The repo folder of results; ``envhub push`` keeps it, ``envhub install`` leaves it out."""
FORMAT = 1
"""Version of the manifest format."""

# Secrets: never uploaded, whatever the package's own ignore rules say.
SECRET_PATTERNS = (
    ".env", ".env.*", "*.env", ".envrc", ".netrc", ".pypirc", ".npmrc", "*.pem", "*.key", "*.p12",
    "*.pfx", "id_rsa*", "id_ed25519*", "id_ecdsa*", "*.token", "token", "token.txt", "*secret*",
    "credentials*", ".git-credentials", "*.keystore", ".huggingface", "hf_token",
)  # fmt: skip
# Junk: version control, environments, caches, build output, editor files.
JUNK_DIRS = (
    ".git", ".hg", ".svn", ".venv", "venv", "env", ".tox", ".nox", "__pycache__", ".pytest_cache",
    ".ruff_cache", ".mypy_cache", ".ipynb_checkpoints", ".idea", ".vscode", "build", "dist",
    "*.egg-info", "node_modules", "outputs", "wandb", ".cache",
)  # fmt: skip
JUNK_FILES = ("*.pyc", "*.pyo", ".DS_Store", "*.swp", "*~", MANIFEST, "envhub.lock")
MAX_FILE_BYTES = 10 * 1024 * 1024
"""Larger files are left out: data that big belongs in a dataset repo the env loads."""


@dataclass
class Selection:
    """The files a push uploads and the ones it leaves out, with why."""

    files: list[str] = field(default_factory=list)
    """Paths relative to the package folder, ``/``-separated, sorted."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(path, reason) of each file or folder left out."""


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name.lower(), p) for p in patterns)


def select_files(root: Path) -> Selection:
    """The files of the package at ``root`` that may be uploaded."""
    selection = Selection()
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(_matches(part, JUNK_DIRS) for part in relative.parts[:-1]):
            continue  # inside a folder already reported
        name = relative.as_posix()
        if path.is_dir():
            if _matches(path.name, JUNK_DIRS):
                selection.skipped.append(
                    (name + "/", "junk (version control, environment, cache or build output)")
                )
            continue
        if path.is_symlink():
            selection.skipped.append((name, "symbolic link"))
        elif _matches(path.name, SECRET_PATTERNS):
            selection.skipped.append((name, "looks like a secret"))
        elif _matches(path.name, JUNK_FILES):
            selection.skipped.append((name, "junk"))
        elif path.stat().st_size > MAX_FILE_BYTES:
            selection.skipped.append((name, f"larger than {MAX_FILE_BYTES // 2**20} MiB"))
        else:
            selection.files.append(name)
    return selection


def sha256_file(path: Path) -> str:
    """The hex sha256 of the file at ``path``, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_hashes(root: Path, files: list[str]) -> dict[str, str]:
    """``{path: sha256}`` of ``files`` under ``root``."""
    return {name: sha256_file(root / name) for name in sorted(files)}


def content_hash(hashes: dict[str, str]) -> str:
    """The content hash of a set of file hashes (the card and manifest left out)."""
    lines = "".join(
        f"{digest}  {name}\n"
        for name, digest in sorted(hashes.items())
        if name not in (CARD, MANIFEST)
    )
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def build_manifest(
    name: str,
    version: str,
    envs: dict[str, str],
    hashes: dict[str, str],
    check: dict[str, Any],
    description: str = "",
) -> dict[str, Any]:
    """The ``envhub.json`` written next to the package files on the Hub (``description``: the
    pyproject's, which the Hub catalog shows)."""
    from envhub.version import __version__

    return {
        "format": FORMAT,
        "name": name,
        "version": version,
        "description": description,
        "envs": dict(sorted(envs.items())),
        "content_hash": content_hash(hashes),
        "files": hashes,
        "check": check,
        "pushed_with": f"envhub {__version__}",
    }


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest at ``path`` (the caller checks it exists)."""
    return json.loads(path.read_text(encoding="utf-8"))
