"""The checkpoint manager: save, find, load and rotate the ``step-*`` folders under one root."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from envhub.errors import CheckpointError, ConfigError
from envhub.trainer.checkpoint.files import (
    clean_stale,
    remove,
    replace_dir,
    staging,
    write_text_atomic,
)
from envhub.trainer.checkpoint.manifest import (
    LATEST,
    WHAT_TO_DO,
    check_complete,
    is_complete,
    seal,
)
from envhub.trainer.checkpoint.model_state import load_into, load_model, save_model, torch_load
from envhub.trainer.checkpoint.rng import capture_rng, restore_rng

# One logger for the package, named as before it was split into modules (see ``rng``).
log = logging.getLogger(__package__)

_STEP_DIR = re.compile(r"step-(\d+)")


class CheckpointManager:
    """Saves, finds, loads and rotates the checkpoints under one folder.

    Args:
        root: The folder holding ``step-*`` checkpoints (created on the first save).
        keep_last: How many complete checkpoints to keep; the one just saved always stays.
    """

    def __init__(self, root: str | Path, keep_last: int = 2) -> None:
        if keep_last < 1:
            raise ConfigError(f"keep_last must be at least 1, got {keep_last}")
        self.root = Path(root)
        self.keep_last = keep_last

    def save(
        self,
        step: int,
        *,
        model: Any,
        optimizer: Any = None,
        scheduler: Any = None,
        trainer_state: dict[str, Any],
        tokenizer: Any = None,
        critic: dict[str, Any] | None = None,
    ) -> Path:
        """Write checkpoint ``step`` atomically, point ``latest`` at it, then rotate old ones.

        Args:
            step: The number of optimizer updates done; names the folder ``step-%06d``.
            model: A transformers ``PreTrainedModel`` or a ``peft.PeftModel`` (adapter saved),
                or a :class:`~envhub.trainer.checkpoint.model_state.ShardedModel` that saves
                itself with its optimizer (the Megatron backend's).
            optimizer: A torch optimizer, or ``None`` when ``model`` holds it.
            scheduler: An LR scheduler, or ``None``.
            trainer_state: JSON-serialisable loop state; ``load`` returns it (tuples as lists).
            tokenizer: Saved into ``model/`` when given, making that folder servable.
            critic: A critic's ``model`` (an HF model), ``optimizer`` and ``scheduler``,
                saved under ``critic/`` the same way (PPO's value model).

        Returns:
            The checkpoint folder.
        """
        rng = capture_rng()  # first, before anything below could draw a random number
        if not isinstance(step, int) or step < 0:
            raise ConfigError(f"checkpoint step must be a non-negative int, got {step!r}")
        try:
            state_json = json.dumps(trainer_state, indent=2)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"trainer_state must be JSON-serialisable: {e}") from None
        self.root.mkdir(parents=True, exist_ok=True)
        clean_stale(self.root, ".tmp-*")
        name = _step_name(step)
        try:
            with staging(self.root / f".tmp-{name}-{os.getpid()}") as tmp:
                save_model(model, tokenizer, tmp / "model")
                if optimizer is not None:
                    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
                if scheduler is not None:
                    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
                if critic is not None:
                    _save_critic(critic, tmp / CRITIC)
                torch.save(rng, tmp / "rng.pt")
                (tmp / "trainer_state.json").write_text(state_json + "\n", encoding="utf-8")
                seal(tmp, step)
                final = self.root / name
                replace_dir(tmp, final)
            write_text_atomic(self.root / LATEST, name + "\n")
        except Exception as e:  # a full disk shows as OSError, torch's RuntimeError, safetensors'
            raise CheckpointError(self._unwritable(name, e)) from e
        self._rotate(keep=final)
        return final

    def _unwritable(self, name: str, error: Exception) -> str:
        """Why checkpoint ``name`` was not written, what is left and what to do."""
        try:
            free = f"{shutil.disk_usage(self.root).free / 2**20:,.0f} MiB free there"
        except OSError:
            free = "its free space unknown"
        last = self.latest()
        kept = f"the last checkpoint, {last.name}, is intact" if last else "no checkpoint yet"
        return (
            f"could not write checkpoint {name} in {self.root} ({type(error).__name__}: "
            f"{error}); {free}. Nothing half-written is left and {kept}: free some space (or "
            "lower checkpoint.keep_last) and rerun the same command to resume"
        )

    def list(self) -> list[Path]:
        """Complete checkpoints, oldest step first."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if _STEP_DIR.fullmatch(p.name) and is_complete(p)]
        return sorted(found, key=lambda p: int(p.name.removeprefix("step-")))

    def latest(self) -> Path | None:
        """The checkpoint to resume from, never a partial one.

        Returns:
            The one ``latest`` names if it is complete, else the complete one with the highest
            step, else ``None``.
        """
        pointer = self.root / LATEST
        if pointer.is_file():
            named = self.root / pointer.read_text(encoding="utf-8").strip()
            if _STEP_DIR.fullmatch(named.name) and is_complete(named):
                return named
            log.warning("%s names no complete checkpoint; using the newest complete one", pointer)
        complete = self.list()
        return complete[-1] if complete else None

    def load(
        self,
        path: str | Path,
        *,
        model: Any,
        optimizer: Any = None,
        scheduler: Any = None,
        critic: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Load a checkpoint into live objects and restore the RNG states.

        Args:
            path: A checkpoint folder (``step-*``), e.g. from ``latest()``.
            model: The model to fill in place, built like the one saved (LoRA included).
            optimizer: Filled when given; it must be built over the same parameters.
            scheduler: Filled when given.
            critic: A critic's ``model``, ``optimizer`` and ``scheduler`` to fill from
                ``critic/``, built like the ones saved.

        Returns:
            The ``trainer_state`` given to ``save``.

        Raises:
            CheckpointError: The folder is missing, incomplete, corrupt or from another model.
        """
        path = Path(path)
        check_complete(path)
        load_model(model, path / "model")
        if optimizer is not None:
            load_into(optimizer, path / "optimizer.pt", "optimizer")
        if scheduler is not None:
            if not (path / "scheduler.pt").exists():
                raise CheckpointError(f"{path} was saved without an LR scheduler; resume with one")
            load_into(scheduler, path / "scheduler.pt", "scheduler")
        if critic is not None:
            _load_critic(critic, path / CRITIC)
        try:
            restore_rng(torch_load(path / "rng.pt"))
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{path}/rng.pt is unusable ({e}); {WHAT_TO_DO}") from None
        return json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))

    def _rotate(self, keep: Path) -> None:
        """Keep ``keep`` and the newest ``keep_last - 1`` other complete checkpoints; drop the
        rest, and any ``step-*`` folder that is not complete."""
        complete = self.list()
        others = [p for p in complete if p != keep]
        doomed = others[: max(0, len(others) - (self.keep_last - 1))]
        doomed += [p for p in self.root.glob("step-*") if p not in complete and p != keep]
        for path in doomed:
            trash = self.root / f".tmp-del-{path.name}-{os.getpid()}"
            os.replace(path, trash)  # one atomic step: a kill mid-delete leaves only a .tmp- folder
            remove(trash)


CRITIC = "critic"
"""The folder of a checkpoint that holds the critic (``model/``, ``optimizer.pt``,
``scheduler.pt``)."""


def _save_critic(critic: dict[str, Any], folder: Path) -> None:
    save_model(critic["model"], None, folder / "model")  # a sharded one saves its optimizer
    for name in ("optimizer", "scheduler"):
        if critic.get(name) is not None:
            torch.save(critic[name].state_dict(), folder / f"{name}.pt")


def _load_critic(critic: dict[str, Any], folder: Path) -> None:
    if not folder.is_dir():
        raise CheckpointError(
            f"{folder.parent} holds no critic (it was saved by a run without one): resume with "
            "the algorithm it was saved with, or start a new run (checkpoint.resume=never)"
        )
    load_model(critic["model"], folder / "model")
    for name in ("optimizer", "scheduler"):
        if critic.get(name) is not None:
            load_into(critic[name], folder / f"{name}.pt", f"critic {name}")


def _step_name(step: int) -> str:
    return f"step-{step:06d}"
