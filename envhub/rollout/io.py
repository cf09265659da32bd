"""Trajectories on disk: one JSON object per line, written as episodes finish."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO

from envhub.types import Trajectory


class TrajectoryWriter:
    """Appends trajectories to a JSONL file, flushing each line so a crash loses nothing written."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = self.path.open("a", encoding="utf-8")
        self.count = 0

    def write(self, trajectory: Trajectory) -> None:
        """Append ``trajectory`` as one JSON line and flush it to the file."""
        self._file.write(trajectory.model_dump_json() + "\n")
        self._file.flush()
        self.count += 1

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_trajectories(path: str | Path) -> Iterator[Trajectory]:
    """Read trajectories back, one per non-empty line."""
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield Trajectory.model_validate_json(line)


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """Every trajectory in the JSONL file at ``path``, in file order."""
    return list(iter_trajectories(path))
