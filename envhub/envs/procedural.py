"""Procedural task sets: tasks generated on demand, each a pure function of (seed, index).

Nothing is downloaded or stored: task ``i`` is rebuilt from a private ``random.Random`` seeded
with ``"<name>-<seed>-<i>"`` whenever it is read, so any task can be read alone, in any order,
in any process, and always comes out the same (string seeds are hashed with SHA-512 by
``random``, independently of ``PYTHONHASHSEED``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

TaskMaker = Callable[[random.Random], dict[str, Any]]


class ProceduralTasks(Sequence[dict[str, Any]]):
    """``size`` tasks, task ``i`` being ``make_task(random.Random(f"{name}-{seed}-{i}"))``.

    Args:
        name: Namespace of the generator, so that two generators with the same seed differ.
        make_task: Builds one task (a dict with ``question``/``prompt``, ``answer``, ``info``)
            from a random generator it may draw from freely.
        size: Number of tasks.
        seed: Selects a different set of tasks from the same generator.
    """

    def __init__(self, name: str, make_task: TaskMaker, size: int = 1000, seed: int = 0) -> None:
        if size < 1:
            raise ValueError(f"a task set needs at least one task, got size={size}")
        self.name, self.make_task, self.size, self.seed = name, make_task, size, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:  # type: ignore[override]
        if not 0 <= index < self.size:
            raise IndexError(index)
        return self.make_task(random.Random(f"{self.name}-{self.seed}-{index}"))

    def __repr__(self) -> str:
        return f"ProceduralTasks({self.name!r}, size={self.size}, seed={self.seed})"
