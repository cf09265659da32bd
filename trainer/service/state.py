"""What the service holds: sessions, training models, sampling sessions and saved weights.

Training work (model creation, ``forward_backward``, ``optim_step``, saving) runs on one
trainer thread, in the order the requests arrived: the SDK sends a training client's requests
one after the other (its ``seq_id`` order), so their futures resolve in that order. Sampling
runs on the samplers' own engines, beside training.

Names: a model id is ``model-<n>``; weights saved for sampling live at
``tinker://<model id>/sampler_weights/<name>`` and, on disk, in
``<state_dir>/<model id>/sampler_weights/<name>`` (an HF folder).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.errors import ConfigError
from envhub.trainer.service.futures import Futures
from envhub.trainer.service.settings import ServiceSettings

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_PATH = re.compile(r"^tinker://(?P<model>[^/]+)/sampler_weights/(?P<name>[^/]+)$")


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
    """The HF folder its sampler loads."""


class ServiceState:
    """The service's state and the trainer thread (see the module docstring)."""

    def __init__(self, settings: ServiceSettings) -> None:
        from envhub.trainer.service.sampling import Samplers

        self.settings = settings
        self.futures = Futures()
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, Any] = {}
        """Training models (:class:`~envhub.trainer.service.training.TrainingModel`) by id."""
        self.sampling_sessions: dict[str, SamplingSession] = {}
        self.samplers = Samplers(settings.device)
        self._trainer = ThreadPoolExecutor(1, thread_name_prefix="envhub-service-trainer")
        self._ids = itertools.count(1)

    # -- sessions ---------------------------------------------------------------------------

    def new_session(self) -> str:
        """Open a session; return its id."""
        session = Session(f"session-{next(self._ids)}")
        self.sessions[session.id] = session
        return session.id

    def heartbeat(self, session_id: str) -> None:
        """Note that ``session_id``'s client is alive.

        Raises:
            KeyError: No such session.
        """
        self.sessions[session_id].last_heartbeat = time.monotonic()

    # -- training ---------------------------------------------------------------------------

    def in_trainer(self, fn: Any, *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` on the trainer thread, after the work queued before it."""
        return asyncio.get_running_loop().run_in_executor(self._trainer, fn, *args)

    def check_base_model(self, name: str) -> None:
        """Raise ConfigError unless ``name`` is a model this service serves."""
        if name not in self.settings.models:
            served = ", ".join(self.settings.models)
            raise ConfigError(f"base model {name!r} is not served here; served: {served}")

    def create_model(self, base_model: str, lora: Any, seed: int) -> str:
        """Build a training model (on the trainer thread); return its id."""
        from envhub.trainer.service.training import TrainingModel

        self.check_base_model(base_model)
        model = TrainingModel(base_model, lora, seed, self.settings.device)
        model_id = f"model-{next(self._ids)}"
        self.models[model_id] = model
        return model_id

    def model(self, model_id: str) -> Any:
        """The training model ``model_id``.

        Raises:
            ConfigError: No such model.
        """
        if model_id not in self.models:
            raise ConfigError(f"no training model {model_id!r}")
        return self.models[model_id]

    def save_for_sampler(self, model_id: str, name: str) -> str:
        """Write ``model_id``'s weights for sampling under ``name``; return its tinker path."""
        if not _NAME.match(name):
            raise ConfigError(
                f"weights name {name!r}: use letters, digits, '.', '_' and '-' (at most 128)"
            )
        folder = self.settings.state_dir / model_id / "sampler_weights" / name
        self.model(model_id).export(folder)
        return f"tinker://{model_id}/sampler_weights/{name}"

    # -- sampling ---------------------------------------------------------------------------

    def folder_of(self, model_path: str) -> Path:
        """The HF folder of a ``tinker://`` path this service wrote.

        Raises:
            ConfigError: Not such a path, or nothing saved there.
        """
        match = _PATH.match(model_path)
        if match is None:
            raise ConfigError(
                f"model_path {model_path!r} is not tinker://<model id>/sampler_weights/<name>"
            )
        folder = self.settings.state_dir / match["model"] / "sampler_weights" / match["name"]
        if not (folder / "config.json").is_file():
            raise ConfigError(f"nothing is saved at {model_path}")
        return folder

    def new_sampling_session(self, base_model: str | None, model_path: str | None) -> str:
        """Open a sampling session on saved weights or a base model; return its id."""
        from envhub.trainer.models import resolve_model

        if model_path is not None:
            folder = str(self.folder_of(model_path))
            model_id = _PATH.match(model_path)["model"]  # type: ignore[index]
            base = base_model or self.model(model_id).name
        elif base_model is not None:
            self.check_base_model(base_model)
            base, folder = base_model, resolve_model(base_model)
        else:
            raise ConfigError("a sampling session needs a model_path or a base_model")
        session = SamplingSession(f"sampler-{next(self._ids)}", base, model_path, folder)
        self.sampling_sessions[session.id] = session
        return session.id

    def sampling_session(self, session_id: str) -> SamplingSession:
        """The sampling session ``session_id``.

        Raises:
            ConfigError: No such session.
        """
        if session_id not in self.sampling_sessions:
            raise ConfigError(f"no sampling session {session_id!r}")
        return self.sampling_sessions[session_id]

    async def aclose(self) -> None:
        """Cancel pending requests, stop the samplers and the trainer thread."""
        self.futures.cancel_all()
        await self.samplers.aclose()
        self._trainer.shutdown(wait=True, cancel_futures=True)
