"""The service's folder: training runs and their checkpoints on disk, and the SDK's listings.

Everything the service saves lives under ``state_dir``, so a service started again on the same
folder lists, samples and resumes what an earlier one saved::

    <state_dir>/<model id>/run.json                     the training run (base model, LoRA)
    <state_dir>/<model id>/weights/<name>/              save_state: training state
        trainable.safetensors                           the trained tensors (the adapter's)
        optimizer.pt                                    AdamW's state (moments, step counts)
        checkpoint.json                                 steps taken, time, user metadata
    <state_dir>/<model id>/sampler_weights/<name>/      save_weights_for_sampler:
        adapter/                                        a LoRA model's adapter (PEFT's format)
        config.json, model.safetensors, ...             or a full-weight model's HF folder
        checkpoint.json                                 steps taken, time

A checkpoint is written to a ``.tmp-`` folder beside its place, fsynced and renamed into it
(:mod:`envhub.trainer.checkpoint.files`), so a service killed mid-save leaves no half
checkpoint, and listings skip the dot folders. Its tinker path is
``tinker://<model id>/weights/<name>`` (or ``sampler_weights``), as the SDK parses them.

Torch-free: listings read JSON and folder names only.
"""

from __future__ import annotations

import json
import os
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from envhub.errors import ConfigError

KINDS = {"weights": "training", "sampler_weights": "sampler"}
"""Folder of each kind of checkpoint -> the SDK's ``checkpoint_type``."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_PATH = re.compile(r"^tinker://(?P<run>[^/]+)/(?P<kind>weights|sampler_weights)/(?P<name>[^/]+)$")
RUN_FILE = "run.json"
CHECKPOINT_FILE = "checkpoint.json"


class Store:
    """Training runs and checkpoints under ``root`` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # -- paths ----------------------------------------------------------------------------

    def folder(self, run_id: str, kind: str, name: str) -> Path:
        """Where checkpoint ``name`` of ``kind`` (``weights``, ``sampler_weights``) lives.

        Raises:
            ConfigError: A name the service does not write.
        """
        if not _NAME.match(name):
            raise ConfigError(
                f"checkpoint name {name!r}: use letters, digits, '.', '_' and '-' (at most 128)"
            )
        return self.root / run_id / kind / name

    def resolve(self, path: str, kind: str) -> tuple[str, Path]:
        """The run id and folder of the saved checkpoint at tinker ``path`` of ``kind``.

        Raises:
            ConfigError: Not such a path, or nothing saved there.
        """
        match = _PATH.match(path)
        if match is None or match["kind"] != kind:
            raise ConfigError(f"{path!r} is not tinker://<model id>/{kind}/<name>")
        folder = self.root / match["run"] / kind / match["name"]
        if not (folder / CHECKPOINT_FILE).is_file():  # every kind, old stores' too, has one
            raise ConfigError(f"nothing is saved at {path}")
        return match["run"], folder

    # -- runs -----------------------------------------------------------------------------

    def record_run(self, run_id: str, base_model: str, lora: dict | None,
                   user_metadata: dict | None) -> None:  # fmt: skip
        """Write the run's ``run.json`` (its base model and LoRA settings)."""
        record = {"base_model": base_model, "lora": lora, "user_metadata": user_metadata,
                  "created": time.time()}  # fmt: skip
        _write_json(self.root / run_id / RUN_FILE, record)

    def run(self, run_id: str) -> dict[str, Any]:
        """The run's record.

        Raises:
            ConfigError: No such run in this folder.
        """
        path = self.root / run_id / RUN_FILE
        if not path.is_file():
            raise ConfigError(f"no training run {run_id!r}")
        return json.loads(path.read_text())

    def run_ids(self) -> list[str]:
        """Every run in the folder, oldest first."""
        runs = [p.parent for p in self.root.glob(f"*/{RUN_FILE}")]
        return [p.name for p in sorted(runs, key=lambda p: (p / RUN_FILE).stat().st_mtime)]

    # -- checkpoints ----------------------------------------------------------------------

    def write(self, run_id: str, kind: str, name: str, fill: Any, overwrite: bool = True,
              meta: dict | None = None) -> str:  # fmt: skip
        """Save a checkpoint: ``fill(folder)`` writes its files into a temporary folder, which
        then takes the checkpoint's place; return its tinker path.

        Raises:
            ConfigError: It exists and ``overwrite`` is off.
        """
        from envhub.trainer.checkpoint.files import clean_stale, fsync_tree, replace_dir, staging

        target = self.folder(run_id, kind, name)
        if target.exists() and not overwrite:
            raise ConfigError(f"a checkpoint {name!r} exists; pass overwrite=True to replace it")
        clean_stale(target.parent, f".tmp-{name}-*")
        with staging(target.parent / f".tmp-{name}-{os.getpid()}") as tmp:
            fill(tmp)
            _write_json(tmp / CHECKPOINT_FILE, {"time": time.time(), **(meta or {})})
            fsync_tree(tmp)
            replace_dir(tmp, target)
        return f"tinker://{run_id}/{kind}/{name}"

    def checkpoints(self, run_id: str) -> list[dict[str, Any]]:
        """The run's checkpoints as the SDK's ``Checkpoint`` documents, oldest first."""
        found = []
        for kind, checkpoint_type in KINDS.items():
            for folder in (self.root / run_id / kind).glob("*"):
                if folder.name.startswith(".") or not (folder / CHECKPOINT_FILE).is_file():
                    continue
                meta = json.loads((folder / CHECKPOINT_FILE).read_text())
                found.append({
                    "checkpoint_id": f"{kind}/{folder.name}",
                    "checkpoint_type": checkpoint_type,
                    "time": _iso(meta["time"]),
                    "tinker_path": f"tinker://{run_id}/{kind}/{folder.name}",
                    "size_bytes": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()),
                    "user_metadata": meta.get("user_metadata"),
                })  # fmt: skip
        return sorted(found, key=lambda c: c["time"])

    def training_run(self, run_id: str) -> dict[str, Any]:
        """The run as the SDK's ``TrainingRun`` document."""
        record = self.run(run_id)
        checkpoints = self.checkpoints(run_id)
        last = {kind: [c for c in checkpoints if c["checkpoint_type"] == kind]
                for kind in KINDS.values()}  # fmt: skip
        modified = (self.root / run_id).stat().st_mtime
        return {
            "training_run_id": run_id, "base_model": record["base_model"],
            "model_owner": "local", "is_lora": record["lora"] is not None,
            "lora_rank": (record["lora"] or {}).get("rank"),
            "last_request_time": max([_iso(modified)] + [c["time"] for c in checkpoints]),
            "last_checkpoint": (last["training"] or [None])[-1],
            "last_sampler_checkpoint": (last["sampler"] or [None])[-1],
            "user_metadata": record.get("user_metadata"),
        }  # fmt: skip


def page(items: list[Any], limit: int, offset: int) -> tuple[list[Any], dict[str, int]]:
    """``items[offset:offset + limit]`` and the SDK's ``Cursor`` of that page."""
    return items[offset : offset + limit], {"offset": offset, "limit": limit,
                                            "total_count": len(items)}  # fmt: skip


def _iso(timestamp: float) -> str:
    """A time as ISO 8601 in UTC, always to the microsecond (so the strings sort as times)."""
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).isoformat(timespec="microseconds")


def _write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1))
