"""Full-weight versions on the vLLM sampler: one engine per training model, whose weights are
switched to the version each request samples.

A model that trains every weight (no LoRA; the torch or the Megatron backend) saves each
sampler version as a whole HF folder (:mod:`~envhub.trainer.service.versions`). An engine per
version would cost a start (a minute on a CPU) and a copy of the model each, so a training
model (its run id) gets one engine, started on the first request from the version it asks for.
A request for another version first loads that version's weights into the running engine
through envhub's weight sync (:mod:`envhub.trainer.weight_sync`: the transfer ``envhub train``
uses to update its vLLM engines, here fed from the version's safetensors instead of a
trainer), then drops the prefix cache (its KV was computed with the old weights) and checks
the engine's logprobs of the weight-sync check's fixed sequence against those the training
model wrote beside the version (:func:`~envhub.trainer.service.versions.save_reference`; the
version the engine starts from is checked too), with ``envhub train``'s
:class:`~envhub.trainer.weight_sync.verify.Verifier` and tolerance: a mismatch fails the
request with a :class:`~envhub.errors.WeightSyncError` and the next request loads it again.

- **Turns by version** (:class:`VersionTurns`): requests of the loaded version run together
  (vLLM batches them); a request for another version waits until they have ended, and
  requests that came after it wait their turn, so one version's requests never see another's
  weights and no version waits forever.
- **A cap** (``ServiceSettings.vllm_max_full_weight_engines``): starting an engine beyond it
  stops the least recently used idle one (waiting for one to go idle if all are serving).
- **Lifetime**: an engine stops with the service, when the last session that sampled its
  model's versions ends (:meth:`FullWeightEngines.drop`; requests without a sampling session
  leave it to the cap), and is replaced on the next request when it died.
- **Identity of a version**: its folder and the folder's inode and mtime, because saving again
  under the same name replaces the folder: the engine loads the new weights.

The weights travel through a shared-memory file (``envhub_shm``, :data:`TRANSFER`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from envhub.errors import EngineDiedError, EngineError, EngineUnavailableError
from envhub.trainer.service.settings import ServiceSettings
from envhub.trainer.service.versions import REFERENCE_FILE, folder_stamp, run_of
from envhub.trainer.service.vllm_engine import Engine, VLLMSampler
from envhub.trainer.service.wire import Sequence

log = logging.getLogger(__name__)

BUCKET_BYTES = 256 << 20
"""Bytes of weights one transfer bucket holds (whole decoder layers; a bigger one alone)."""

TRANSFER = "envhub_shm"
"""The weight transfer: the weights come from a file on the service's host, and the engine is
a child of the service there, so a shared-memory file serves a CPU or a GPU engine alike, and
the service needs no GPU of its own (with the Megatron backend its ranks hold them)."""

Key = tuple[str, int, int]
"""A saved version as loaded: its folder, the folder's inode and its mtime (ns)."""


def version_key(folder: str | Path) -> Key:
    """What identifies the weights in ``folder`` (a folder saved again gets a new key)."""
    return (str(folder), *folder_stamp(folder))


def folder_weights(folder: Path) -> Iterator[tuple[str, Any]]:
    """The tensors of the HF folder ``folder`` in checkpoint names, one decoder layer after
    another (memory-mapped: one tensor read at a time)."""
    from contextlib import ExitStack

    from safetensors import safe_open
    from vllm.distributed.weight_transfer.base import layerwise_groups

    with ExitStack() as stack:
        files = [stack.enter_context(safe_open(str(path), framework="pt"))
                 for path in sorted(folder.glob("*.safetensors"))]  # fmt: skip
        where = {name: f for f in files for name in f.keys()}  # noqa: SIM118
        # the transfer takes whole layers in vLLM's order; a file's keys are sorted as text
        # (layer 10 before layer 2)
        for group in layerwise_groups(list(where)):
            for name in group:
                yield name, where[name].get_tensor(name)


class VersionTurns:
    """Turns on one engine by version (see the module docstring).

    Args:
        loaded: The version the engine holds now.
    """

    def __init__(self, loaded: Key) -> None:
        self.loaded: Key | None = loaded
        """The version whose weights the engine holds (None: a switch failed midway)."""
        self._changed = asyncio.Condition()
        self._active = 0
        self._waiting: list[tuple[object, Key]] = []
        """Requests not yet admitted, first come first: (their ticket, their version)."""

    def idle(self) -> bool:
        """Whether no request runs or waits."""
        return not self._active and not self._waiting

    @asynccontextmanager
    async def holding(
        self, version: Key, switch: Callable[[Key], Awaitable[None]]
    ) -> AsyncIterator[None]:
        """Hold a turn on ``version``: once it is loaded (``switch(version)`` loads it when
        the engine holds another, with no request running) and no earlier request waits for
        another version."""
        ticket = object()
        async with self._changed:
            self._waiting.append((ticket, version))
            try:
                await self._changed.wait_for(lambda: self._may_enter(ticket, version))
                if version != self.loaded:
                    self.loaded = None  # until the switch completes
                    await switch(version)
                    self.loaded = version
            finally:
                self._waiting = [w for w in self._waiting if w[0] is not ticket]
                self._changed.notify_all()
            self._active += 1
        try:
            yield
        finally:
            async with self._changed:
                self._active -= 1
                self._changed.notify_all()

    def _may_enter(self, ticket: object, version: Key) -> bool:
        for other, wanted in self._waiting:
            if other is ticket:
                break
            if wanted != version:  # an earlier request for another version goes first
                return False
        return version == self.loaded or not self._active


class WeightLoader:
    """Loads a saved version's weights into a running engine through envhub's weight sync
    (connected on first use; vLLM's trainer-side engine then sends each version).

    Args:
        engine: The engine (started with ``weight_transfer=transfer``).
        transfer: The weight transfer's name.
    """

    def __init__(self, engine: Engine, transfer: str) -> None:
        from envhub.trainer.weight_sync.routes import VLLMRoutes

        assert engine.http is not None, "start the engine first"
        self.engine = engine
        self.transfer = transfer
        self.routes = VLLMRoutes(str(engine.http.base_url))
        self._folder: Path | None = None
        self._sender: Any = None
        self._verifier: Any = None
        self.checks = 0
        """Versions checked against their training model's logprobs."""

    def _weights(self) -> Iterator[tuple[str, Any]]:
        """The current folder's tensors (what each send reads)."""
        assert self._folder is not None
        return folder_weights(self._folder)

    async def load(self, folder: Path) -> float:
        """Send the weights in ``folder`` and drop the prefix cache; the seconds it took.

        Raises:
            EngineDiedError: The engine stopped answering (the caller's retry replaces it).
        """
        started = time.perf_counter()
        self._folder = folder
        try:
            if self._sender is None:
                loop = asyncio.get_running_loop()
                self._sender = await asyncio.to_thread(self._connect, loop)
            await asyncio.to_thread(self._sender.send)
            await self.routes.reset_prefix_cache()
        except EngineError as e:
            # a killed engine core leaves the API server answering HTTP 500 until it exits
            if isinstance(e, EngineUnavailableError) or not await self.engine.healthy():
                self.engine.failed = True
                raise EngineDiedError(f"the vLLM sampler of {self.engine.model} died: {e}") from e
            raise
        await self.check(folder)
        return time.perf_counter() - started

    async def check(self, folder: Path) -> dict[str, float]:
        """The engine's logprobs of the fixed sequence against those its training model saved
        with the version in ``folder``; nothing for a version saved without them.

        Returns:
            ``sync/logprob_diff_max`` and ``sync/logprob_diff_mean``.

        Raises:
            WeightSyncError: The difference is beyond the engine dtype's tolerance.
        """
        reference = folder / REFERENCE_FILE
        if not reference.is_file():
            return {}
        saved = json.loads(reference.read_text())
        if self._verifier is None:
            self._verifier = await asyncio.to_thread(self._make_verifier, folder)
        self._verifier.ids = saved["ids"]  # the sequence its training model scored
        self.checks += 1
        gaps = await self._verifier.check([_Scorer(self.engine)], saved["logprobs"], self.checks)
        log.info("%s on the vLLM sampler: logprobs within %.2g of its training model's", folder,
                 gaps["sync/logprob_diff_max"])  # fmt: skip
        return gaps

    def _make_verifier(self, folder: Path) -> Any:
        from transformers import AutoTokenizer

        from envhub.trainer.weight_sync.verify import (
            Verifier,
            checked_statistic,
            default_tolerance,
        )

        dtype = self.engine.dtype
        tokenizer = AutoTokenizer.from_pretrained(folder)
        return Verifier(tokenizer, tolerance=default_tolerance(dtype),
                        statistic=checked_statistic(dtype))  # fmt: skip

    def _connect(self, loop: asyncio.AbstractEventLoop) -> Any:
        """Join the engine's weight transfer (blocking: in a worker thread)."""
        from envhub.trainer.weight_sync import TransferPlan
        from envhub.trainer.weight_sync.driver import connect_driver

        plan = TransferPlan(self.transfer, BUCKET_BYTES, self.engine.dtype, (self.routes.url,))
        return connect_driver(plan, self._weights, [self.routes], loop, "127.0.0.1")

    async def aclose(self) -> None:
        """Release the transfer (its shared file) and the routes' client."""
        if self._sender is not None:
            self._sender.close()
            self._sender = None
        await self.routes.aclose()


class _Scorer:
    """An engine as the verifier asks: each token's logprob after the first (temperature 1)."""

    def __init__(self, engine: Engine) -> None:
        self.sampler = VLLMSampler(engine, None)

    async def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """vLLM's logprobs of ``ids[1:]``."""
        return (await self.sampler.prompt_logprobs(ids, None))[1:]


class FullWeightEngine:
    """One training model's engine, its turns and its weight loader.

    Args:
        engine: The started engine.
        loaded: The version it started from.
        transfer: The weight transfer it was started with.
    """

    def __init__(self, engine: Engine, loaded: Key, transfer: str) -> None:
        self.engine = engine
        self.turns = VersionTurns(loaded)
        self.loader = WeightLoader(engine, transfer)
        self.folders: set[str] = set()
        """The versions sampled through it since it started (a session's end drops them)."""
        self.switches: list[float] = []
        """Seconds each switch of version took."""

    async def switch(self, version: Key) -> None:
        """Load ``version``'s weights (in its turns: no request runs)."""
        seconds = await self.loader.load(Path(version[0]))
        self.switches.append(seconds)
        log.info("the vLLM sampler of run %s loaded %s in %.2f s", run_of(version[0]),
                 version[0], seconds)  # fmt: skip

    async def aclose(self) -> None:
        """Release the transfer, then stop the engine's process group."""
        try:
            await self.loader.aclose()
        finally:
            await self.engine.aclose()


class FullWeightEngines:
    """The engines of full-weight training models, by run id, least recently used first.

    Args:
        settings: The service's settings (the cap, the device).
    """

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self.engines: OrderedDict[str, FullWeightEngine] = OrderedDict()
        self.transfer = TRANSFER
        self.start_seconds: list[float] = []
        """Seconds each engine took to start."""
        self._starting: Engine | None = None
        """The engine being started (the service's stop stops it too)."""
        self._lock = asyncio.Lock()

    async def get(self, folder: str) -> FullWeightSampler:
        """The sampler of the version in ``folder`` on its model's engine (started on first
        use, or again if it died; the least recently used idle one stopped beyond the cap)."""
        run = run_of(folder)
        async with self._lock:
            found = self.engines.get(run)
            if found is not None and not found.engine.alive():
                log.warning("the vLLM sampler of run %s died (its log: %s); starting a new one",
                            run, found.engine.server.log_path)  # fmt: skip
                await self.engines.pop(run).aclose()
                found = None
            if found is None:
                await self._make_room()
                found = await self._start(folder)
                self.engines[run] = found
            self.engines.move_to_end(run)
            found.folders.add(folder)
        return FullWeightSampler(found, version_key(folder))

    async def _start(self, folder: str) -> FullWeightEngine:
        started = time.perf_counter()
        engine = self._starting = Engine(folder, self.settings, weight_transfer=self.transfer)
        found = None
        try:
            await engine.start()
            found = FullWeightEngine(engine, version_key(folder), self.transfer)
            await found.loader.check(Path(folder))
        except BaseException:
            await (engine.aclose() if found is None else found.aclose())
            raise
        finally:
            self._starting = None
        self.start_seconds.append(time.perf_counter() - started)
        log.info("started a vLLM sampler for run %s from %s in %.1f s", run_of(folder), folder,
                 self.start_seconds[-1])  # fmt: skip
        return found

    async def _make_room(self) -> None:
        """Stop least recently used idle engines until one more fits under the cap."""
        while len(self.engines) >= self.settings.vllm_max_full_weight_engines:
            idle = next((run for run, e in self.engines.items() if e.turns.idle()), None)
            if idle is None:
                # every engine is serving: requests end on their own, so one goes idle soon
                await asyncio.sleep(0.05)
                continue
            log.info("stopping the vLLM sampler of run %s (least recently used, the cap is %d)",
                     idle, self.settings.vllm_max_full_weight_engines)  # fmt: skip
            await self.engines.pop(idle).aclose()

    async def drop(self, folder: str) -> None:
        """Forget ``folder`` (no session samples it any more); stop its model's engine once it
        serves no version a session sampled, and no request runs on it."""
        run = run_of(folder)
        async with self._lock:
            found = self.engines.get(run)
            if found is None:
                return
            found.folders.discard(folder)
            if not found.folders and found.turns.idle():
                await self.engines.pop(run).aclose()

    async def aclose(self) -> None:
        """Stop every engine (and one being started)."""
        if self._starting is not None:
            await self._starting.aclose()
        engines, self.engines = list(self.engines.values()), OrderedDict()
        for found in engines:
            await found.aclose()


class FullWeightSampler(VLLMSampler):
    """A full-weight version on its model's engine: each request in that version's turn.

    Args:
        found: The model's engine.
        version: The version sampled.
    """

    def __init__(self, found: FullWeightEngine, version: Key) -> None:
        super().__init__(found.engine, None)
        self.found = found
        self.version = version

    async def sample(
        self, prompt: list[int], num_samples: int, params: dict[str, Any]
    ) -> list[Sequence]:
        """As :meth:`VLLMSampler.sample`, with this version's weights loaded."""
        async with self.found.turns.holding(self.version, self.found.switch):
            return await super().sample(prompt, num_samples, params)

    async def prompt_logprobs(self, prompt: list[int], last_n: int | None) -> list[float]:
        """As :meth:`VLLMSampler.prompt_logprobs`, with this version's weights loaded."""
        async with self.found.turns.holding(self.version, self.found.switch):
            return await super().prompt_logprobs(prompt, last_n)
