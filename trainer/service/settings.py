"""How to run the training service (torch-free: the CLI builds it before anything loads)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from envhub.defaults import LOOPBACK, SMOLLM2_ID


def new_api_key() -> str:
    """A fresh key in the SDK's format (it refuses keys without the ``tml-`` prefix)."""
    return "tml-" + secrets.token_urlsafe(24)


class ServiceSettings(BaseModel):
    """The service's settings."""

    model_config = ConfigDict(frozen=True)

    models: tuple[str, ...] = (SMOLLM2_ID,)
    """The base models clients may train and sample, by the names they send: Hub ids, local
    HF folders, or ``smollm2-135m`` (each resolved by envhub's model registry); or
    ``NAME=MODEL``: clients send ``NAME`` and get ``MODEL`` (a loop written for a model this
    machine cannot hold runs on a small one, e.g. ``meta-llama/Llama-3.2-1B=smollm2-135m``)."""
    api_key: str = Field(default_factory=new_api_key)
    """The key clients send (``TINKER_API_KEY``); requests without it are refused."""
    state_dir: Path = Field(default_factory=lambda: Path("outputs/serve-trainer"))
    """Where saved weights go (``<model id>/sampler_weights/<name>``)."""
    device: str = "auto"
    """Where models train and sample: ``auto`` (a CUDA GPU when there is one), ``cpu``, ``cuda``."""
    host: str = LOOPBACK
    port: int = 8010
    """Beside ``envhub serve-model``'s 8000, so both can run at once."""
    long_poll_s: float = Field(10.0, gt=0)
    """How long a ``retrieve_future`` waits for its result before answering ``try_again``."""
    session_timeout_s: float = Field(300.0, gt=0)
    """A session whose client sent no heartbeat for this long (the SDK sends one every 10 s)
    is ended as if closed: a crashed client's models and samplers are freed; what it saved
    stays."""
    context_length: int = 2048
    """The context length reported for each model."""
    sampler: Literal["hf", "vllm"] = "hf"
    """What samples: ``hf`` (envhub's HF engine in this process, a model per saved version) or
    ``vllm`` (a vLLM engine per base model, each saved LoRA version an adapter loaded into it;
    an engine per full-weight training model, each version's weights loaded into it;
    :mod:`~envhub.trainer.service.vllm_sampling`)."""
    vllm_max_lora_rank: int = Field(32, ge=1, le=512)
    """The largest LoRA rank the vLLM sampler serves (its engines' ``--max-lora-rank``)."""
    vllm_max_full_weight_engines: int = Field(2, ge=1)
    """The most vLLM engines of full-weight training models at once (one per model, its
    versions' weights switched in; past it the least recently used idle one stops)."""
    backend: Literal["torch", "megatron"] = "torch"
    """What trains: ``torch`` (envhub's torch backend in this process; LoRA and full weights)
    or ``megatron`` (full-weight models on megatron-core ranks that Ray places, one group of
    ranks per model; LoRA refused; :mod:`~envhub.trainer.service.megatron_training`). The
    service then owns Ray for its whole life, and Ray places the vLLM sampler's engines too."""
    full_weights: bool = False
    """Train every weight of each model a client creates, whatever LoRA rank it asks for (the
    SDK asks for one with every model it creates): how an SDK loop, the cookbook's included,
    trains on ``backend: megatron``, which has no LoRA. The model's info says ``is_lora``
    false."""
    tensor_parallel: int = Field(1, ge=1)
    """With ``backend: megatron``: the ranks each layer is split over (tensor parallelism)."""
    pipeline_parallel: int = Field(1, ge=1)
    """With ``backend: megatron``: the pipeline stages the layers are split into. Data
    parallelism fills the GPUs left (one rank on a CPU)."""

    def served(self) -> dict[str, str]:
        """The served models: the name clients send -> the model envhub loads."""
        pairs = (m.split("=", 1) if "=" in m else (m, m) for m in self.models)
        return {name: model for name, model in pairs}
