"""Training as a service: the Tinker API's routes on envhub's trainer.

A loop written against the official ``tinker`` SDK (sample, score, ``forward_backward``,
``optim_step``, ``save_weights_for_sampler``) runs on envhub's torch backend (or, for
full-weight models, its Megatron backend: ``ServiceSettings.backend``) when the SDK is pointed
here (``TINKER_BASE_URL``, ``TINKER_API_KEY``). The service is one layer above the
trainer, beside the CLI: it drives the backend's parts and adds nothing below it.

Modules: ``settings`` (what to serve, torch-free), ``app`` (the routes and the key check),
``state`` (sessions, models, samplers, the trainer thread), ``checkpoints`` (runs and
checkpoints on disk, and their listings), ``futures`` (the asynchronous
retrieve protocol), ``training`` (one model: forward/backward and Adam steps),
``megatron_training`` (the same verbs for a full-weight model on Megatron ranks), ``adapters``
(several LoRA adapters on one shared base), ``losses`` (Tinker's built-in losses),
``custom_losses`` (losses uploaded with ``create_custom_loss``, rebuilt from an allow-list),
``sampling`` (samplers on saved weights), ``vllm_sampling`` (the
same on a vLLM engine per base model, LoRA versions as adapters) and ``wire`` (the SDK's
protobuf bodies). ``envhub serve-trainer`` runs it.
"""

from __future__ import annotations

from envhub.trainer.service.settings import ServiceSettings, new_api_key

__all__ = ["ServiceSettings", "build_app", "new_api_key"]


def build_app(settings: ServiceSettings):  # noqa: ANN201 - Starlette loads only on call
    """The service's ASGI app (see :func:`envhub.trainer.service.app.build_app`)."""
    from envhub.trainer.service.app import build_app as build

    return build(settings)
