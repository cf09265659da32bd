"""The manifest: ``COMPLETE``, written last, lists every other file of a checkpoint and its size.

A checkpoint counts only when its manifest matches the files on disk, so a folder that a crash,
a full disk or a stray edit left short is refused with a message saying what is wrong.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from envhub.errors import CheckpointError
from envhub.trainer.checkpoint.files import fsync, fsync_tree, write_synced

# One logger for the package, named as before it was split into modules (see ``rng``).
log = logging.getLogger(__package__)

MARKER = "COMPLETE"
"""The manifest's file name inside a checkpoint folder."""
LATEST = "latest"
"""The file in the checkpoints' root naming the checkpoint saved last."""
WHAT_TO_DO = "delete it, or resume from another checkpoint (checkpoint.resume=PATH or =never)"
"""The advice that ends every message about an unusable checkpoint."""
_FORMAT = 1


def seal(folder: Path, step: int) -> None:
    """Fsync every file, then write the manifest and fsync the folders.

    After this returns, a power cut cannot leave ``COMPLETE`` without the data it vouches for.

    Args:
        folder: The staged checkpoint folder, every other file already written.
        step: Recorded in the manifest.
    """
    files = {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*"))}
    files = {rel: size for rel, size in files.items() if (folder / rel).is_file()}
    fsync_tree(folder)
    write_synced(folder / MARKER, json.dumps({"format": _FORMAT, "step": step, "files": files}))
    fsync(folder)


def check_complete(path: Path) -> None:
    """Raise ``CheckpointError`` saying what is wrong unless ``path`` is a complete checkpoint.

    Args:
        path: The checkpoint folder.

    Raises:
        CheckpointError: ``path`` is missing, has no readable manifest, or a file differs from it.
    """
    if not path.is_dir():
        raise CheckpointError(
            f"no checkpoint at {path}; pass a step-* folder of a run's checkpoints"
        )
    try:
        manifest = json.loads((path / MARKER).read_text(encoding="utf-8"))
        files = manifest["files"]
    except FileNotFoundError:
        if (path / LATEST).is_file():
            raise CheckpointError(
                f"{path} holds checkpoints; pass one of its step-* folders"
            ) from None
        raise CheckpointError(
            f"{path} is not a complete checkpoint (no {MARKER}); {WHAT_TO_DO}"
        ) from None
    except (ValueError, KeyError, TypeError):
        raise CheckpointError(f"{path / MARKER} is unreadable; {WHAT_TO_DO}") from None
    for rel, size in files.items():
        file = path / rel
        actual = file.stat().st_size if file.is_file() else None
        if actual != size:
            found = "missing" if actual is None else f"{actual} bytes, expected {size}"
            raise CheckpointError(f"{path} is corrupt: {rel} is {found}; {WHAT_TO_DO}")


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a complete checkpoint; why not is logged at debug level.

    Args:
        path: The checkpoint folder.

    Returns:
        ``True`` when :func:`check_complete` finds nothing wrong.
    """
    try:
        check_complete(path)
    except CheckpointError as e:
        log.debug("skipping %s: %s", path, e)
        return False
    return True
