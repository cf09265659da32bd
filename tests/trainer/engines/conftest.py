"""Shared by the engine tests: a torch backend and its vLLM engine on one event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any


class EngineSetup:
    """The torch backend and the vLLM engine a ``TrainConfig`` makes, driven on one event loop
    (as a training run drives them)."""

    def __init__(self, config: Any) -> None:
        from envhub.trainer.backends.torch_backend import TorchBackend
        from envhub.trainer.engines.vllm import make_vllm_engine

        self.config = config
        self.backend = TorchBackend(config)
        self.engine = make_vllm_engine(config, self.backend)
        self.loop = asyncio.new_event_loop()

    def run(self, coroutine: Any) -> Any:
        """Run ``coroutine`` to its end on the setup's loop."""
        return self.loop.run_until_complete(coroutine)

    def started(self) -> Iterator[EngineSetup]:
        """Start the engine, yield the setup, then stop the engine and close the loop (the
        body of a module fixture)."""
        self.run(self.engine.start())
        try:
            yield self
        finally:
            self.run(self.engine.aclose())
            self.loop.close()
