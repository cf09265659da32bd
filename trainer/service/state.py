"""What the service holds: sessions, training models, sampling sessions and saved weights.

Training work (model creation, ``forward_backward``, ``optim_step``, saving) runs on one
trainer thread, in the order the requests arrived: the SDK sends a training client's requests
one after the other (its ``seq_id`` order), so their futures resolve in that order. Sampling
runs on the samplers' own engines, beside training.

Names: a session id is ``session-<random hex>``, new with every service, and a model id the
SDK's ``<session id>:train:<model seq id>`` (the SDK computes it itself when it creates a model
by loading a checkpoint). Runs and checkpoints live on disk under ``state_dir``
(:mod:`~envhub.trainer.service.checkpoints`), so a service started again on the same folder
lists, samples and resumes from them.

When a session ends (the SDK's ``close``, or no heartbeat for ``session_timeout_s``: the SDK
sends one every 10 s while its client lives) the memory it holds goes: its training models (a LoRA
model's adapter leaves the shared base, and the base goes with its last adapter), its uploaded
losses, and the samplers its sampling sessions loaded that no other session samples. What it
saved stays on disk.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import itertools
import logging
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from envhub.errors import ConfigError
from envhub.trainer.service.checkpoints import Store
from envhub.trainer.service.futures import Futures
from envhub.trainer.service.settings import ServiceSettings

log = logging.getLogger(__name__)


@dataclass
class Session:
    """A client's session (one ``ServiceClient``)."""

    id: str
    last_heartbeat: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class SamplingSession:
    """What a sampling session samples: a base model, or saved weights (``model_path``)."""

    id: str
    base_model: str
    model_path: str | None
    folder: str
    """The folder its sampler loads: a base model's, or a saved version's
    (:mod:`~envhub.trainer.service.versions`)."""
    owner: str | None = None
    """The session that opened it (None: not known); it ends with that session."""


class ServiceState:
    """The service's state and the trainer thread (see the module docstring)."""

    def __init__(self, settings: ServiceSettings) -> None:
        from envhub.trainer.service.sampling import Samplers

        self.settings = settings
        self.futures = Futures()
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, Any] = {}
        """Training models (:class:`~envhub.trainer.service.training.TrainingModel`) by id."""
        self.bases: dict[str, Any] = {}
        """The base model each served model's LoRA adapters share
        (:class:`~envhub.trainer.service.adapters.SharedBase`), by the model envhub loads."""
        self.sampling_sessions: dict[str, SamplingSession] = {}
        self.custom_losses: dict[str, Any] = {}
        """Uploaded losses (:class:`~envhub.trainer.service.custom_losses.CustomLoss`) by id:
        ``<session id>:loss:<seq id>``, usable by that session's models."""
        if settings.sampler == "vllm":
            from envhub.trainer.service.vllm_sampling import VLLMSamplers

            self.samplers: Any = VLLMSamplers(settings)
        else:
            self.samplers = Samplers(settings)
        self.store = Store(settings.state_dir)
        self._trainer = ThreadPoolExecutor(1, thread_name_prefix="envhub-service-trainer")
        self._ids = itertools.count(1)
        self.owns_ray = False
        """Whether :meth:`start` started Ray (:meth:`aclose` then shuts it down)."""

    async def start(self) -> None:
        """Start Ray (or join this process's) when the models train on it
        (``backend: megatron``): the service owns it for its whole life, so the ranks of a
        model whose session ends, or a sampler engine that stops, leave it up for the others
        (they shut down only what they started, and Ray is started before them)."""
        if self.settings.backend == "megatron":
            from envhub.trainer.service.megatron_training import start_ray

            self.owns_ray = await asyncio.to_thread(start_ray, self.settings)

    # -- sessions ---------------------------------------------------------------------------

    def new_session(self) -> str:
        """Open a session; return its id."""
        session = Session(f"session-{secrets.token_hex(6)}-{next(self._ids)}")
        self.sessions[session.id] = session
        return session.id

    def heartbeat(self, session_id: str) -> bool:
        """Note that ``session_id``'s client is alive; False when the session has ended
        (closed, or expired) or never was."""
        session = self.sessions.get(session_id)
        if session is not None:
            session.last_heartbeat = time.monotonic()
        return session is not None

    async def expire_sessions(self) -> list[str]:
        """End the sessions whose client sent no heartbeat for ``session_timeout_s`` (a client
        that crashed or lost the network), as a ``close`` would; return their ids."""
        limit = time.monotonic() - self.settings.session_timeout_s
        silent = [s.id for s in self.sessions.values() if s.last_heartbeat < limit]
        for session_id in silent:
            log.warning(
                "session %s sent no heartbeat for %.0f s: ended, its models freed (what it "
                "saved stays)", session_id, self.settings.session_timeout_s,
            )  # fmt: skip
            await self.end_session(session_id)
        return silent

    async def end_session(self, session_id: str) -> None:
        """Close ``session_id`` and free what it holds in memory (see the module docstring):
        its models once the work queued for them is done, then its samplers."""
        self.sessions.pop(session_id, None)
        mine = f"{session_id}:"
        for loss_id in [k for k in self.custom_losses if k.startswith(mine)]:
            del self.custom_losses[loss_id]
        models = [self.models.pop(m) for m in list(self.models) if m.startswith(mine)]
        await self.in_trainer(self._free_models, models)
        ended = [s for s in self.sampling_sessions.values() if s.owner == session_id]
        for session in ended:
            del self.sampling_sessions[session.id]
        still_sampled = {s.folder for s in self.sampling_sessions.values()}
        for folder in {s.folder for s in ended} - still_sampled:
            await self.samplers.drop(folder)

    def _free_models(self, models: list[Any]) -> None:
        """Take ``models``' adapters off their shared bases and drop a base left with none
        (on the trainer thread, after the work queued for them)."""
        for model in models:
            model.close()
            shared = model.shared
            if shared is None:
                continue
            shared.remove(model.adapter)
            if not shared.adapters:
                self.bases = {k: b for k, b in self.bases.items() if b is not shared}
        models.clear()
        gc.collect()  # tensors held in reference cycles would wait for the next collection

    # -- training ---------------------------------------------------------------------------

    def in_trainer(self, fn: Any, *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` on the trainer thread, after the work queued before it."""
        return asyncio.get_running_loop().run_in_executor(self._trainer, fn, *args)

    def check_base_model(self, name: str) -> None:
        """Raise ConfigError unless ``name`` is a model this service serves."""
        if name not in self.settings.served():
            served = ", ".join(self.settings.served())
            raise ConfigError(f"base model {name!r} is not served here; served: {served}")

    def model_id(self, session_id: str | None, model_seq_id: int | None) -> str:
        """The id of a session's ``model_seq_id``-th model, as the SDK derives it."""
        if session_id is None or model_seq_id is None:  # a client that does not say
            return f"session-{secrets.token_hex(6)}:train:{next(self._ids)}"
        return f"{session_id}:train:{model_seq_id}"

    def create_model(self, model_id: str, base_model: str, lora: Any, seed: int,
                     user_metadata: dict | None = None) -> str:  # fmt: skip
        """Build a training model (on the trainer thread) and record its run; return its id."""
        from envhub.trainer.service.training import TrainingModel

        self.check_base_model(base_model)
        if model_id in self.models:
            raise ConfigError(f"model {model_id!r} exists already")
        if lora is not None and self.settings.full_weights:
            log.info("%s trains every weight (the service's full_weights), not a rank-%d "
                     "LoRA", model_id, lora.rank)  # fmt: skip
            lora = None
        target = self.settings.served()[base_model]
        base = None if lora is None else self.bases.get(target)
        if self.settings.backend == "megatron":
            from envhub.trainer.service.megatron_training import MegatronTrainingModel

            model: Any = MegatronTrainingModel(target, lora, seed, self.settings, base_model)
        else:
            model = TrainingModel(target, lora, seed, self.settings.device, base_model, base)
        if model.shared is not None:
            self.bases.setdefault(target, model.shared)
        spec = None if lora is None else dataclasses.asdict(lora)
        self.store.record_run(model_id, base_model, spec, user_metadata)
        self.models[model_id] = model
        return model_id

    def add_custom_loss(self, body: dict) -> str:
        """Rebuild an uploaded loss (a ``CreateCustomLossRequest``); return its id.

        Raises:
            ConfigError: An operation the service does not run (see ``custom_losses``).
        """
        from envhub.trainer.service.custom_losses import build

        loss = build(body["name"], body["inputs"], body["graph"])
        loss_id = f"{body['session_id']}:loss:{body['custom_loss_seq_id']}"
        self.custom_losses[loss_id] = loss
        return loss_id

    def custom_loss(self, model_id: str, config: dict) -> Any:
        """The uploaded loss ``config["loss_id"]`` names, for a request to ``model_id``.

        Raises:
            ConfigError: No ``loss_id``, no such loss, or another session's.
        """
        loss_id = str(config.get("loss_id", ""))
        if loss_id not in self.custom_losses:
            raise ConfigError(
                f"loss_fn 'custom' needs the loss_id of a created loss, got {loss_id!r}"
            )
        if model_id.split(":", 1)[0] != loss_id.split(":", 1)[0]:
            raise ConfigError(f"loss {loss_id!r} belongs to another session than {model_id!r}")
        return self.custom_losses[loss_id]

    def save_state(self, model_id: str, name: str, overwrite: bool = True,
                   user_metadata: dict | None = None) -> str:  # fmt: skip
        """Save ``model_id``'s training state (optimizer included) as ``name``; return its
        tinker path (``tinker://<model id>/weights/<name>``)."""
        model = self.model(model_id)
        meta = {"steps": model.steps, "user_metadata": user_metadata}
        return self.store.write(model_id, "weights", name, model.save_state, overwrite, meta)

    def load_state(self, model_id: str, path: str, optimizer: bool) -> None:
        """Load the training state at tinker ``path`` into ``model_id`` (with the optimizer's
        state or a fresh optimizer)."""
        import json

        model = self.model(model_id)
        _, folder = self.store.resolve(path, "weights")
        model.load_state(folder, optimizer)
        model.steps = json.loads((folder / "checkpoint.json").read_text())["steps"]

    def create_from_state(self, model_id: str, path: str, optimizer: bool,
                          base_model: str | None) -> str:  # fmt: skip
        """Build ``model_id`` like the run that saved ``path`` and load that state into it."""
        from envhub.trainer.service.training import LoraSpec

        run_id, _ = self.store.resolve(path, "weights")
        record = self.store.run(run_id)
        lora = None if record["lora"] is None else LoraSpec(**record["lora"])
        self.create_model(model_id, base_model or record["base_model"], lora, 0,
                          record.get("user_metadata"))  # fmt: skip
        self.load_state(model_id, path, optimizer)
        return model_id

    def tokenizer_id(self, base_model: str) -> str:
        """Where the SDK loads ``base_model``'s tokenizer from: the served model's folder (a
        local one needs no Hub)."""
        from envhub.trainer.models import resolve_model

        return resolve_model(self.settings.served()[base_model])

    def model(self, model_id: str) -> Any:
        """The training model ``model_id``.

        Raises:
            ConfigError: No such model.
        """
        if model_id not in self.models:
            session = model_id.split(":", 1)[0]
            why = "" if session in self.sessions else (
                f": its session has ended (closed, or no heartbeat for "
                f"{self.settings.session_timeout_s:g} s); what it saved loads into a new one"
            )  # fmt: skip
            raise ConfigError(f"no training model {model_id!r}{why}")
        return self.models[model_id]

    def save_for_sampler(self, model_id: str, name: str) -> str:
        """Write ``model_id``'s weights for sampling under ``name``: a LoRA model's adapter
        alone, a full-weight model's HF folder (:mod:`~envhub.trainer.service.versions`);
        return its tinker path."""
        from envhub.trainer.service.versions import save_adapter, save_reference

        model = self.model(model_id)
        meta = {"steps": model.steps}

        def fill(folder: Any) -> None:
            if model.shared is None:
                model.export(folder)
                save_reference(model, folder)  # what the vLLM sampler checks its load against
            else:
                save_adapter(model, folder)

        return self.store.write(model_id, "sampler_weights", name, fill, True, meta)

    # -- sampling ---------------------------------------------------------------------------

    def new_sampling_session(self, base_model: str | None, model_path: str | None,
                             owner: str | None = None) -> str:  # fmt: skip
        """Open a sampling session of session ``owner`` on saved weights or a base model;
        return its id."""
        base, folder = self.sampled(base_model, model_path)
        session = SamplingSession(f"sampler-{next(self._ids)}", base, model_path, folder, owner)
        self.sampling_sessions[session.id] = session
        return session.id

    def sampled(self, base_model: str | None, model_path: str | None) -> tuple[str, str]:
        """The base model and the folder a sampler of saved weights (``model_path``) or of a
        base model loads (a one-off request opens no sampling session: nothing to free).

        Raises:
            ConfigError: Neither given, no such saved weights, or a base model not served.
        """
        from envhub.trainer.models import resolve_model

        if model_path is not None:
            run_id, saved = self.store.resolve(model_path, "sampler_weights")
            return base_model or self.store.run(run_id)["base_model"], str(saved)
        if base_model is not None:
            self.check_base_model(base_model)
            return base_model, resolve_model(self.settings.served()[base_model])
        raise ConfigError("a sampling session needs a model_path or a base_model")

    def sampling_session(self, session_id: str) -> SamplingSession:
        """The sampling session ``session_id``.

        Raises:
            ConfigError: No such session.
        """
        if session_id not in self.sampling_sessions:
            raise ConfigError(f"no sampling session {session_id!r}")
        return self.sampling_sessions[session_id]

    async def aclose(self) -> None:
        """Cancel pending requests, stop the samplers, the trainer thread and the models, then
        Ray if :meth:`start` started it."""
        self.futures.cancel_all()
        await self.samplers.aclose()
        self._trainer.shutdown(wait=True, cancel_futures=True)
        for model in self.models.values():  # a Megatron model's ranks are Ray actors
            model.close()
        if self.owns_ray:
            from envhub.trainer.cluster.run import stop_ray

            self.owns_ray = False
            stop_ray(True)
