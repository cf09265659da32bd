"""Checkpoints: atomic on disk, resumable bit for bit, exportable as a plain HF folder.

A checkpoint is one folder, ``root/step-000042/``::

    model/               ``save_pretrained`` output: safetensors, config, generation config and,
                         when given, the tokenizer, so the folder alone loads in transformers / vLLM;
                         with LoRA: the adapter, whose adapter_config.json names the base model
    optimizer.pt         ``optimizer.state_dict()``
    scheduler.pt         ``scheduler.state_dict()``, when there is a scheduler
    rng.pt               python, numpy, torch CPU and CUDA generator states (``capture_rng``)
    trainer_state.json   the loop's own state: step, data cursors, ...
    COMPLETE             written last: a manifest of every other file and its size

Everything is written into ``root/.tmp-step-000042-<pid>/``, fsynced, and renamed into place, so
a process killed at any moment (SIGKILL included) leaves either a complete checkpoint or a
``.tmp-`` folder that the next ``save`` deletes. ``root/latest`` names the checkpoint saved last,
which is the one to resume from even when a run was restarted from an older step; it is only a
hint: ``latest()`` trusts a folder only when its manifest matches the files on disk. Old
checkpoints are renamed to ``.tmp-`` names before they are deleted, for the same reason.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import random
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envhub.errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)

MARKER = "COMPLETE"
LATEST = "latest"
_FORMAT = 1
_STEP_DIR = re.compile(r"step-(\d+)")
_TMP_PID = re.compile(r"\.tmp-.*-(\d+)")
_WHAT_TO_DO = "delete it, or resume from another checkpoint (checkpoint.resume=PATH or =never)"
_SAME_SETTINGS = "resume with the model, LoRA and optimizer settings it was saved with"


# -- random number generators ------------------------------------------------------------------


def capture_rng() -> dict[str, Any]:
    """The state of every generator a training step may draw from.

    Returns:
        ``python`` (``random``), ``numpy`` (the global legacy generator), ``torch`` (CPU) and,
        when CUDA is available, ``cuda`` (one state per device). The values survive
        ``torch.save`` / ``torch.load(weights_only=True)``.
    """
    numpy = np.random.get_state(legacy=False)
    key, pos = numpy["state"]["key"].tolist(), numpy["state"]["pos"]  # weights_only refuses arrays
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {**numpy, "state": {"key": key, "pos": pos}},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put every generator back where ``capture_rng`` found it.

    Args:
        state: A dict from ``capture_rng``. CUDA states are restored on as many devices as both
            the state and this machine have; a mismatch is logged, not an error.
    """
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy = state["numpy"]
    key = np.asarray(numpy["state"]["key"], dtype=np.uint32)
    np.random.set_state({**numpy, "state": {"key": key, "pos": numpy["state"]["pos"]}})
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda")
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cuda is not None and len(cuda) != available:
        log.warning("CUDA RNG states for %d devices, this machine has %d", len(cuda), available)
    for device, device_state in enumerate((cuda or [])[:available]):
        torch.cuda.set_rng_state(device_state.cpu(), device)


# -- the manager -------------------------------------------------------------------------------


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
    ) -> Path:
        """Write checkpoint ``step`` atomically, point ``latest`` at it, then rotate old ones.

        Args:
            step: The number of optimizer updates done; names the folder ``step-%06d``.
            model: A transformers ``PreTrainedModel`` or a ``peft.PeftModel`` (adapter saved),
                or a sharded model that saves itself (``save_checkpoint(folder)`` and
                ``load_checkpoint(folder)``, with its optimizer: the Megatron backend's).
            optimizer: A torch optimizer, or ``None`` when ``model`` holds it.
            scheduler: An LR scheduler, or ``None``.
            trainer_state: JSON-serialisable loop state; ``load`` returns it (tuples as lists).
            tokenizer: Saved into ``model/`` when given, making that folder servable.

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
        _clean_stale(self.root, ".tmp-*")
        name = _step_name(step)
        with _staging(self.root / f".tmp-{name}-{os.getpid()}") as tmp:
            _save_model(model, tokenizer, tmp / "model")
            if optimizer is not None:
                torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            if scheduler is not None:
                torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            torch.save(rng, tmp / "rng.pt")
            (tmp / "trainer_state.json").write_text(state_json + "\n", encoding="utf-8")
            _seal(tmp, step)
            final = self.root / name
            _replace_dir(tmp, final)
        _write_text_atomic(self.root / LATEST, name + "\n")
        self._rotate(keep=final)
        return final

    def list(self) -> list[Path]:
        """Complete checkpoints, oldest step first."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if _STEP_DIR.fullmatch(p.name) and _is_complete(p)]
        return sorted(found, key=lambda p: int(p.name.removeprefix("step-")))

    def latest(self) -> Path | None:
        """The checkpoint to resume from: the one ``latest`` names if it is complete, else the
        complete one with the highest step, else ``None``. Never a partial checkpoint."""
        pointer = self.root / LATEST
        if pointer.is_file():
            named = self.root / pointer.read_text(encoding="utf-8").strip()
            if _STEP_DIR.fullmatch(named.name) and _is_complete(named):
                return named
            log.warning("%s names no complete checkpoint; using the newest complete one", pointer)
        complete = self.list()
        return complete[-1] if complete else None

    def load(
        self, path: str | Path, *, model: Any, optimizer: Any = None, scheduler: Any = None
    ) -> dict[str, Any]:
        """Load a checkpoint into live objects and restore the RNG states.

        Args:
            path: A checkpoint folder (``step-*``), e.g. from ``latest()``.
            model: The model to fill in place, built like the one saved (LoRA included).
            optimizer: Filled when given; it must be built over the same parameters.
            scheduler: Filled when given.

        Returns:
            The ``trainer_state`` given to ``save``.

        Raises:
            CheckpointError: The folder is missing, incomplete, corrupt or from another model.
        """
        path = Path(path)
        _check_complete(path)
        _load_model(model, path / "model")
        if optimizer is not None:
            _load_into(optimizer, path / "optimizer.pt", "optimizer")
        if scheduler is not None:
            if not (path / "scheduler.pt").exists():
                raise CheckpointError(f"{path} was saved without an LR scheduler; resume with one")
            _load_into(scheduler, path / "scheduler.pt", "scheduler")
        try:
            restore_rng(_torch_load(path / "rng.pt"))
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"{path}/rng.pt is unusable ({e}); {_WHAT_TO_DO}") from None
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
            _remove(trash)


# -- export ------------------------------------------------------------------------------------


def export_hf(
    model: Any, tokenizer: Any, target: str | Path, *, dtype: torch.dtype | str | None = None
) -> Path:
    """Write ``model`` as a plain HF folder (safetensors) that transformers and vLLM load.

    A LoRA ``PeftModel`` is merged on a copy (the live model keeps its adapter). The folder is
    written next to ``target`` and renamed into place; an existing model folder at ``target`` is
    replaced, anything else there is refused.

    Args:
        model: A transformers ``PreTrainedModel`` or a ``peft.PeftModel``.
        tokenizer: Saved alongside when not ``None``.
        target: The folder to create or replace.
        dtype: Cast the exported weights (e.g. ``torch.bfloat16`` or ``"bfloat16"``); the live
            model is not touched.

    Returns:
        ``target``.
    """
    target = Path(target)
    dtype = getattr(torch, dtype, dtype) if isinstance(dtype, str) else dtype
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise ConfigError(f"export dtype must be a torch dtype or its name, got {dtype!r}")
    return _write_atomically(target, lambda tmp: _write_hf(model, tokenizer, tmp, dtype))


def export_hf_weights(weights: dict[str, torch.Tensor], source: str | Path, target: str | Path) -> Path:
    """Write ``weights`` (HF names, tied ones once) as an HF folder next to the ``source``
    model folder's config, generation config and tokenizer files; atomically, and refusing a
    non-model folder at ``target``, as :func:`export_hf` does. For backends whose model is not
    a transformers module (the Megatron backend's shards)."""

    def write(folder: Path) -> None:
        from safetensors.torch import save_file

        for item in Path(source).iterdir():
            if item.is_file() and not item.name.endswith(_WEIGHT_SUFFIXES) and item.name != "model.safetensors.index.json":
                shutil.copy2(item, folder / item.name)
        save_file({name: t.contiguous() for name, t in weights.items()}, folder / "model.safetensors", metadata={"format": "pt"})

    return _write_atomically(Path(target), write)


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def _write_atomically(target: Path, write: Any) -> Path:
    """Run ``write(folder)`` on a temporary folder next to ``target``, then rename it into
    place (replacing a model folder there, refusing anything else)."""
    _check_replaceable(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(target.parent, f".tmp-*{target.name}-*")
    with _staging(target.parent / f".tmp-{target.name}-{os.getpid()}") as tmp:
        write(tmp)
        _fsync_tree(tmp)
        _replace_dir(tmp, target)
    return target


def _write_hf(model: Any, tokenizer: Any, folder: Path, dtype: torch.dtype | None) -> None:
    if _is_peft(model):
        # on a copy: merging in place would change the live model
        merged = copy.deepcopy(model).merge_and_unload()
        if dtype is not None:
            merged.to(dtype)
        merged.save_pretrained(folder)
    elif dtype is None or dtype == model.dtype:
        model.save_pretrained(folder)
    else:
        model.save_pretrained(folder, state_dict=_cast_state(model.state_dict(), dtype))
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        config["dtype"] = str(dtype).removeprefix("torch.")  # save_pretrained wrote the live one
        (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


def _cast_state(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Floating tensors cast to ``dtype``; tied tensors stay one tensor, so saving still drops
    the duplicate instead of failing on two copies."""
    cast: dict[int, torch.Tensor] = {}
    out = {}
    for name, tensor in state.items():
        if not tensor.is_floating_point():
            out[name] = tensor
            continue
        key = tensor.untyped_storage().data_ptr() + tensor.storage_offset()
        if key not in cast:
            cast[key] = tensor.detach().to(dtype)
        out[name] = cast[key]
    return out


def _check_replaceable(target: Path) -> None:
    if not target.exists():
        return
    is_model = (target / "config.json").is_file() or (target / "adapter_config.json").is_file()
    if not is_model and (target.is_file() or any(target.iterdir())):
        raise ConfigError(
            f"{target} exists and is not a model folder: pick another path or delete it"
        )


# -- model weights -----------------------------------------------------------------------------


def _is_peft(model: Any) -> bool:
    peft = sys.modules.get("peft")  # a PeftModel cannot exist unless peft was imported
    return peft is not None and isinstance(model, peft.PeftModel)


def _save_model(model: Any, tokenizer: Any, folder: Path) -> None:
    if hasattr(model, "save_checkpoint"):  # sharded: every rank writes its part
        model.save_checkpoint(folder)
    else:
        model.save_pretrained(folder)  # a PeftModel writes only its adapter and adapter_config.json
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


def _load_model(model: Any, folder: Path) -> None:
    if hasattr(model, "load_checkpoint"):  # sharded: it checks the folder and raises CheckpointError
        model.load_checkpoint(folder)
        return
    has_adapter = (folder / "adapter_config.json").exists()
    if _is_peft(model) != has_adapter:
        saved, live = ("a LoRA adapter", "none") if has_adapter else ("a full model", "LoRA")
        raise CheckpointError(f"{folder} holds {saved} but the model has {live}; {_SAME_SETTINGS}")
    if has_adapter:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        result = set_peft_model_state_dict(model, load_file(folder / "adapter_model.safetensors"))
        if result.unexpected_keys:
            unexpected = result.unexpected_keys[:3]
            raise CheckpointError(f"{folder}: the model lacks {unexpected}; {_SAME_SETTINGS}")
        return
    _load_full_state(model, _read_safetensors(folder), folder)


def _read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder} has no .safetensors weights; {_WHAT_TO_DO}")
    state: dict[str, torch.Tensor] = {}
    for file in files:  # one file, or the shards save_pretrained splits a large model into
        state.update(load_file(file))
    return state


def _load_full_state(model: torch.nn.Module, state: dict[str, torch.Tensor], folder: Path) -> None:
    """Copy ``state`` into ``model`` in place; a key that is absent is fine only when it is tied
    to a loaded one (``save_pretrained`` writes ``lm_head`` once, as the embedding)."""
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatches raise even when strict=False
        raise CheckpointError(f"{folder} does not fit this model: {e}") from None
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors |= dict(model.named_buffers(remove_duplicate=False))
    loaded = {id(tensors[name]) for name in state if name in tensors}
    untied = [name for name in result.missing_keys if id(tensors.get(name)) not in loaded]
    if result.unexpected_keys or untied:
        unexpected = result.unexpected_keys[:3]
        raise CheckpointError(
            f"{folder} does not fit this model: lacks {untied[:3]}, has {unexpected}"
        )


def _load_into(target: Any, file: Path, what: str) -> None:
    try:
        target.load_state_dict(_torch_load(file))
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{file} does not fit this {what} ({e}); {_SAME_SETTINGS}") from None


def _torch_load(file: Path) -> Any:
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # unpickling errors come in many types
        raise CheckpointError(f"cannot read {file} ({e!r}); {_WHAT_TO_DO}") from None


# -- the manifest ------------------------------------------------------------------------------


def _seal(folder: Path, step: int) -> None:
    """fsync every file, then write the manifest and fsync the folders: after this returns,
    a power cut cannot leave ``COMPLETE`` without the data it vouches for."""
    files = {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*"))}
    files = {rel: size for rel, size in files.items() if (folder / rel).is_file()}
    _fsync_tree(folder)
    _write_synced(folder / MARKER, json.dumps({"format": _FORMAT, "step": step, "files": files}))
    _fsync(folder)


def _check_complete(path: Path) -> None:
    """Raise ``CheckpointError`` saying what is wrong unless ``path`` is a complete checkpoint."""
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
            f"{path} is not a complete checkpoint (no {MARKER}); {_WHAT_TO_DO}"
        ) from None
    except (ValueError, KeyError, TypeError):
        raise CheckpointError(f"{path / MARKER} is unreadable; {_WHAT_TO_DO}") from None
    for rel, size in files.items():
        file = path / rel
        actual = file.stat().st_size if file.is_file() else None
        if actual != size:
            found = "missing" if actual is None else f"{actual} bytes, expected {size}"
            raise CheckpointError(f"{path} is corrupt: {rel} is {found}; {_WHAT_TO_DO}")


def _is_complete(path: Path) -> bool:
    try:
        _check_complete(path)
    except CheckpointError as e:
        log.debug("skipping %s: %s", path, e)
        return False
    return True


# -- files -------------------------------------------------------------------------------------


def _step_name(step: int) -> str:
    return f"step-{step:06d}"


@contextlib.contextmanager
def _staging(tmp: Path) -> Iterator[Path]:
    """A fresh temporary folder, removed if the block fails (a kill leaves it to
    ``_clean_stale``)."""
    _remove(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        _remove(tmp)
        raise


def _clean_stale(folder: Path, pattern: str) -> None:
    """Delete ``.tmp-`` leftovers of saves that died (their process is gone) or failed."""
    for entry in folder.glob(pattern):
        match = _TMP_PID.fullmatch(entry.name)
        pid = int(match.group(1)) if match else None
        if pid is not None and pid != os.getpid() and _process_alive(pid):
            continue  # another live process is writing there
        log.info("removing %s, left by an interrupted save", entry)
        _remove(entry)


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``; an existing ``dst`` is first renamed aside, then deleted
    (``os.replace`` cannot replace a non-empty folder)."""
    old = dst.parent / f".tmp-old-{dst.name}-{os.getpid()}"
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    _fsync(dst.parent)
    _remove(old)


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.parent / f".tmp-{path.name}-{os.getpid()}"
    _write_synced(tmp, text)
    os.replace(tmp, path)
    _fsync(path.parent)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_tree(root: Path) -> None:
    for directory, _, names in os.walk(root, topdown=False):
        for name in names:
            _fsync(Path(directory) / name)
        _fsync(Path(directory))


def _fsync(path: Path) -> None:
    if os.name == "nt" and path.is_dir():  # Windows cannot open a folder to fsync it
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        pass
    return True
