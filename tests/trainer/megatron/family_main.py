"""One trainer rank for the model-family tests (run under ``torchrun``): builds the Megatron
shard of the HF model in MODEL_DIR under tensor parallelism TP, exports it back to HF
tensors and scores one sequence; rank 0 saves both to ``OUT``.
Usage: ``torchrun --nproc-per-node TP family_main.py MODEL_DIR OUT TP``."""

from __future__ import annotations

import os
import sys

import torch

from envhub.trainer.batch import Sample, collate
from envhub.trainer.megatron.worker import MegatronWorker, WorkerSpec

IDS = list(range(3, 40))


def main(model_dir: str, out: str, tp: int) -> None:
    worker = MegatronWorker(WorkerSpec(model_dir, tp, 1))
    weights = worker.hf_state_dict()
    batch = collate([Sample(IDS, [1] * len(IDS), [0.0] * len(IDS), 0.0, 0)], [0], pad_id=0)
    logprobs = worker.logprobs([batch], temperature=1.0)
    if os.environ["RANK"] == "0":
        torch.save({"weights": weights, "logprobs": logprobs[0][0]}, out)
    worker.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
