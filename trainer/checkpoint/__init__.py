"""Checkpoints: atomic on disk, resumable bit for bit, exportable as a plain HF folder.

A checkpoint is one folder, ``root/step-000042/``::

    model/               ``save_pretrained`` output: safetensors, config, generation config and,
                         when given, the tokenizer, so the folder alone loads in transformers/vLLM;
                         with LoRA: the adapter, whose adapter_config.json names the base model
    optimizer.pt         ``optimizer.state_dict()``
    scheduler.pt         ``scheduler.state_dict()``, when there is a scheduler
    rng.pt               python, numpy, torch CPU and CUDA generator states (``capture_rng``)
    trainer_state.json   the loop's own state (a ``RunState``): step, task cursors, buffers, ...
    COMPLETE             written last: a manifest of every other file and its size

Everything is written into ``root/.tmp-step-000042-<pid>/``, fsynced, and renamed into place, so
a process killed at any moment (SIGKILL included) leaves either a complete checkpoint or a
``.tmp-`` folder that the next ``save`` deletes. ``root/latest`` names the checkpoint saved last,
which is the one to resume from even when a run was restarted from an older step; it is only a
hint: ``latest()`` trusts a folder only when its manifest matches the files on disk. Old
checkpoints are renamed to ``.tmp-`` names before they are deleted, for the same reason.

The modules, each importing only those listed before it:

    files         atomic file operations: staging folders, fsync, rename into place
    manifest      ``COMPLETE``: sealing a checkpoint and checking it is whole
    rng           ``capture_rng`` / ``restore_rng``
    model_state   saving and loading the model (``ShardedModel``: one that saves itself)
    manager       ``CheckpointManager``
    run_state     what a training run's checkpoint holds: ``RunState``, ``RunParts`` (every
                  stateful part through one Protocol), ``RunCheckpoints`` (save, resume)
    export        ``export_hf`` / ``export_hf_weights``
"""

from envhub.trainer.checkpoint.export import export_hf, export_hf_weights
from envhub.trainer.checkpoint.manager import CheckpointManager
from envhub.trainer.checkpoint.manifest import LATEST, MARKER
from envhub.trainer.checkpoint.model_state import ShardedModel
from envhub.trainer.checkpoint.rng import capture_rng, restore_rng

__all__ = [
    "LATEST",
    "MARKER",
    "CheckpointManager",
    "ShardedModel",
    "capture_rng",
    "export_hf",
    "export_hf_weights",
    "restore_rng",
]
