"""What the service's tests share: a service in a thread of the test process, and datums."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import tinker

from envhub.defaults import LOOPBACK, free_port


class Running:
    """A service on 127.0.0.1 in a thread of the test process."""

    def __init__(self, state_dir: Path, **settings: Any) -> None:
        import uvicorn

        from envhub.trainer.service import ServiceSettings, build_app

        self.settings = ServiceSettings(
            state_dir=state_dir, device="cpu", port=free_port(), long_poll_s=2, **settings
        )
        self.app = build_app(self.settings)
        config = uvicorn.Config(self.app, host=LOOPBACK, port=self.settings.port,
                                log_level="warning", lifespan="on")  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "no start"
            time.sleep(0.02)
        self.url = f"http://{LOOPBACK}:{self.settings.port}"
        self.clients: list[Any] = []

    def client(self, api_key: str | None = None) -> Any:
        """A ``tinker.ServiceClient`` of this service, closed by :meth:`stop`."""
        client = tinker.ServiceClient(base_url=self.url, api_key=api_key or self.settings.api_key)
        self.clients.append(client)
        return client

    def stop(self) -> None:
        """Close this service's clients, then stop it.

        A client left open keeps heartbeating; once the service is gone its retries draw
        jitter from Python's global ``random`` in the SDK's thread, which broke later tests
        that restore and compare that generator (tests/trainer/test_checkpoint.py)."""
        for client in self.clients:
            try:
                client.close("success").result(timeout=30)
            except Exception:  # a refused client (a wrong key) has no session to finish
                pass
        self.server.should_exit = True
        self.thread.join(timeout=30)


def datums(examples: list[tuple[list[int], list[int]]]) -> list[Any]:
    """Tinker datums of ``examples``: the completions trained, each token weighing
    1 / (completion tokens of the batch), which makes Tinker's summed loss the token mean that
    envhub's supervised update minimises."""
    total = sum(len(c) for _, c in examples)
    out = []
    for prompt, completion in examples:
        full = prompt + completion
        weights = [0.0] * (len(prompt) - 1) + [1.0 / total] * len(completion)
        out.append(tinker.types.Datum(
            model_input=tinker.types.ModelInput.from_ints(full[:-1]),
            loss_fn_inputs={"target_tokens": full[1:], "weights": weights},
        ))  # fmt: skip
    return out


def full_weight_client(client: Any, base_model: str) -> Any:
    """A ``tinker.TrainingClient`` of a model that trains every weight, from ``client`` (a
    ``ServiceClient``). The SDK's public calls always send a LoRA config, so this sends the
    SDK's own ``CreateModelRequest`` without one through the SDK's connection and futures, then
    builds the training client as ``create_lora_training_client`` does."""
    from tinker.lib.api_future_impl import _APIFuture
    from tinker.lib.client_connection_pool_type import ClientConnectionPoolType
    from tinker.lib.public_interfaces.training_client import TrainingClient, fetch_training_info

    holder = client.holder
    seq_id = holder.get_training_client_id()

    async def create() -> Any:
        request = tinker.types.CreateModelRequest(
            session_id=holder.get_session_id(), model_seq_id=seq_id, base_model=base_model,
            lora_config=None, optimizer_config=tinker.types.AdamOptimizerConfig(),
        )  # fmt: skip
        start = time.time()
        with holder.aclient(ClientConnectionPoolType.TRAIN) as api:
            future = await api.models.create(request=request)
        created = await _APIFuture(tinker.types.CreateModelResponse, holder, future,
                                   request_start_time=start, request_type="CreateModel",
                                   ).result_async()  # fmt: skip
        info = await fetch_training_info(holder, created.model_id)
        return TrainingClient(holder, model_seq_id=seq_id, model_id=created.model_id, info=info)

    return holder.run_coroutine_threadsafe(create()).result()
