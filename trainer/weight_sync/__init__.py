"""The weights' path from the trainer to vLLM, all of it in this folder.

After every optimizer step the rollout engine (``engines.vllm.VLLMEngine.update_weights``) asks
for a :class:`WeightSender` once and then calls its ``send`` each step::

    backend.weights() / the ranks' shards          what is sent (HF names, one tensor at a time)
      -> trainer_side.BackendWeightSource          cast to the engines' dtype, staged on a device
      -> vLLM's TrainerWeightTransferEngine        of the transfer in use: transfers/<name>.py
      -> clients.FanoutClient                      each call to every engine at once
      -> WeightReceiver per engine                 the driver's transports, or routes.VLLMRoutes
      -> verify.Verifier                           vLLM's logprobs must match the trainer's

- **Who sends.** :mod:`.driver`: the driver's process (the torch backend, whose weights live
  there; or a relay). :mod:`.ranks`: the trainer ranks (the Megatron backend): rank 0 sends
  straight to the engines while every rank gathers, unless it cannot reach them
  (``ranks.relay_reason``). A backend chooses through ``TrainBackend.weight_sender(plan)``.
- **How the bytes move.** :mod:`.transfers`, one module per transfer, found by name:
  ``envhub_shm`` (a shared-memory file on the engines' host, any CPU or GPU; its vLLM side is
  :mod:`.shm_backend`, a vLLM plugin), ``ipc`` (CUDA IPC to an engine on the sender's GPU) and
  ``nccl`` (to GPUs elsewhere, across nodes).
- **The typed seam.** :mod:`.plan`: :class:`TransferPlan`, :class:`WeightSender`,
  :class:`WeightReceiver`, :class:`Transfer`, :class:`SentWeights`. Light: no torch, no vLLM.

A new transfer that vLLM implements is one new file, ``transfers/<name>.py`` defining
``TRANSFER``; one that needs its own vLLM side also needs that side as a plugin module (as
:mod:`.shm_backend` is) and its entry point in ``pyproject.toml``.
"""

from envhub.trainer.weight_sync.plan import (
    SenderSide,
    SentWeights,
    Transfer,
    TransferPlan,
    WeightReceiver,
    WeightSender,
)

__all__ = [
    "SenderSide",
    "SentWeights",
    "Transfer",
    "TransferPlan",
    "WeightReceiver",
    "WeightSender",
]
