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


def scored(training: Any, prompt: list[int], completion: list[int]) -> list[float]:
    """``training``'s logprobs of ``prompt + completion`` after the first token (its own
    ``forward``, as the sampler's tokens are checked against)."""
    tokens = prompt + completion
    datum = tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints(tokens[:-1]),
                               loss_fn_inputs={"target_tokens": tokens[1:]})  # fmt: skip
    output = training.forward([datum], "cross_entropy").result()
    return output.loss_fn_outputs[0]["logprobs"].to_numpy().tolist()


def two_versions(client: Any, training: Any, examples: list, adam: Any, prompt: list[int],
                 params: Any) -> dict[str, Any]:  # fmt: skip
    """``training`` stepped on ``examples`` and saved for sampling twice (``v1``, ``v2``),
    each version sampled (two rows, prompt logprobs too) right after its save and the samples
    scored by ``training`` at that version: per name its path, sampler, response and scores."""
    out: dict[str, Any] = {"client": client, "training": training}
    model_input = tinker.types.ModelInput.from_ints(prompt)
    for name in ("v1", "v2"):
        training.forward_backward(datums(examples), "cross_entropy").result()
        training.optim_step(adam).result()
        path = training.save_weights_for_sampler(name).result().path
        sampler = client.create_sampling_client(model_path=path).result()
        response = sampler.sample(model_input, 2, params, include_prompt_logprobs=True).result()
        scores = [scored(training, prompt, s.tokens) for s in response.sequences]
        out[name] = {"path": path, "sampler": sampler, "response": response, "scored": scores}
    return out

