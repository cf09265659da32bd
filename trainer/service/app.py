"""The HTTP routes of the training service: the Tinker SDK's (0.38) calls, on envhub's trainer.

Each handler reads the SDK's request, calls :class:`~envhub.trainer.service.state.ServiceState`
and writes the SDK's response; no training logic lives here. Long calls (``create_model``,
``forward_backward``, ``optim_step``, ``save_weights_for_sampler``, ``asample``) answer at once
with a future (``{"request_id": ...}``) that ``retrieve_future`` resolves
(:mod:`~envhub.trainer.service.futures`). Every route but ``healthz`` needs the service's key in
``X-API-Key`` (the header the SDK sends ``TINKER_API_KEY`` in); a wrong or missing key gets
401, which the SDK raises as ``tinker.AuthenticationError``. A request the service refuses
gets 400 with ``{"detail": ...}`` (the SDK's ``BadRequestError``).
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from envhub.errors import ConfigError, EngineDiedError
from envhub.trainer.service import wire
from envhub.trainer.service.checkpoints import page
from envhub.trainer.service.futures import TRY_AGAIN, Outcome
from envhub.trainer.service.settings import ServiceSettings
from envhub.trainer.service.state import ServiceState

log = logging.getLogger(__name__)

Handler = Callable[[ServiceState, Request], Awaitable[Any]]

_ADAM_DEFAULTS = {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12,
                  "weight_decay": 0.0, "grad_clip_norm": 0.0}  # fmt: skip
"""The SDK's ``AdamParams`` defaults, for fields a client leaves out."""

_CLIENT_CONFIG = {
    # plain httpx: the pyqwest transport is an optional speed-up the service does not need
    "use_pyqwest_transport": False,
    # one forward_backward request per call, so the trainer thread sees them in seq_id order
    "parallel_fwdbwd_chunks": False,
    "proto_compress_fwdbwd": False,
    # create_custom_loss uploads the traced loss; forward_backward_custom runs it here, in one
    # request (custom_losses.py)
    "custom_loss_server_side": True,
}


class ApiKeyMiddleware:
    """Refuses (401) every request without the service's key, except the health check."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.key = api_key.encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        """Pass the request on when its ``X-API-Key`` matches, else answer 401."""
        if scope["type"] == "http" and scope["path"] != "/api/v1/healthz":
            sent = dict(scope["headers"]).get(b"x-api-key", b"")
            if not hmac.compare_digest(sent, self.key):
                detail = "invalid API key: set TINKER_API_KEY to the key serve-trainer printed"
                await JSONResponse({"detail": detail}, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(settings: ServiceSettings) -> Any:
    """The ASGI app of the service (its state is ``app.state.service``)."""
    state = ServiceState(settings)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        await state.start()
        expiry = asyncio.create_task(_expire_sessions(state))
        yield
        expiry.cancel()
        await state.aclose()

    routes = [
        Route(f"/api/v1/{path}", _endpoint(state, handler), methods=[method])
        for method, path, handler in _ROUTES
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.service = state
    return ApiKeyMiddleware(app, settings.api_key)


async def _expire_sessions(state: ServiceState) -> None:
    """End silent sessions (:meth:`ServiceState.expire_sessions`), checking a few times per
    timeout."""
    period = min(state.settings.session_timeout_s / 4, 30.0)
    while True:
        await asyncio.sleep(period)
        try:
            await state.expire_sessions()
        except Exception:  # one failed release must not stop the next ones
            log.exception("ending silent sessions failed")


def _endpoint(state: ServiceState, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            result = await handler(state, request)
        except (ConfigError, KeyError, ValueError) as e:
            return JSONResponse({"detail": str(e)}, status_code=400)
        return result if isinstance(result, Response) else JSONResponse(result)

    return endpoint


# -- service and sessions -----------------------------------------------------------------


async def healthz(state: ServiceState, request: Request) -> dict:
    """The health check."""
    return {"status": "ok"}


async def client_config(state: ServiceState, request: Request) -> dict:
    """The SDK's feature flags for this server."""
    return _CLIENT_CONFIG


async def dynamic_config(state: ServiceState, request: Request) -> dict:
    """The SDK's refreshed flags: its defaults."""
    return {}


async def capabilities(state: ServiceState, request: Request) -> dict:
    """The served models."""
    models = [
        {"model_name": name, "max_context_length": state.settings.context_length,
         "trainable": True, "sampleable": True}
        for name in state.settings.served()
    ]  # fmt: skip
    return {"supported_models": models}


async def create_session(state: ServiceState, request: Request) -> dict:
    """Open a session."""
    return {"type": "create_session", "session_id": state.new_session()}


async def heartbeat(state: ServiceState, request: Request) -> dict | Response:
    """Keep a session alive; 410 for one that has ended (the SDK then stops heartbeating)."""
    session_id = (await request.json())["session_id"]
    if not state.heartbeat(session_id):
        timeout = state.settings.session_timeout_s
        detail = (
            f"session {session_id} has ended (closed, or no heartbeat for {timeout:g} s); "
            "start a new ServiceClient"
        )
        return JSONResponse({"detail": detail}, status_code=410)
    return {"type": "session_heartbeat"}


async def finish_session(state: ServiceState, request: Request) -> dict:
    """Close a session and free its models and samplers (what it saved stays)."""
    await state.end_session(request.path_params["session_id"])
    return {}


async def telemetry(state: ServiceState, request: Request) -> dict:
    """The SDK's telemetry, accepted and dropped: nothing leaves this machine."""
    return {"status": "accepted"}


# -- training -----------------------------------------------------------------------------


async def create_model(state: ServiceState, request: Request) -> dict:
    """Build a training model (a future of ``CreateModelResponse``)."""
    from envhub.trainer.service.training import LoraSpec

    body = await request.json()
    state.check_base_model(body["base_model"])
    lora_config = body.get("lora_config")
    lora = None
    if lora_config is not None:
        lora = LoraSpec(lora_config["rank"], lora_config.get("train_attn", True),
                        lora_config.get("train_mlp", True))  # fmt: skip
    seed = (lora_config or {}).get("seed") or 0
    model_id = state.model_id(body.get("session_id"), body.get("model_seq_id"))

    async def work() -> Outcome:
        await state.in_trainer(state.create_model, model_id, body["base_model"], lora, seed,
                               body.get("user_metadata"))  # fmt: skip
        return Outcome({"type": "create_model", "model_id": model_id})

    return {"request_id": state.futures.submit(work())}


async def get_info(state: ServiceState, request: Request) -> dict:
    """What a training model is (``GetInfoResponse``)."""
    model_id = (await request.json())["model_id"]
    model = state.model(model_id)
    return {
        "type": "get_info", "model_id": model_id, "model_name": model.name,
        "model_data": {"arch": "llama", "model_name": model.name,
                       "tokenizer_id": state.tokenizer_id(model.name)},
        "is_lora": model.lora is not None,
        "lora_rank": None if model.lora is None else model.lora.rank,
    }  # fmt: skip


async def forward_backward(state: ServiceState, request: Request) -> dict:
    """Score a batch and add its gradients (protobuf in, a future of protobuf out)."""
    if wire.PROTO not in request.headers.get("content-type", ""):
        raise ConfigError("forward_backward takes the SDK's protobuf body")
    decoded = wire.read_forward_request(await request.body())
    model = state.model(decoded.model_id)
    custom = None
    if decoded.loss_fn == "custom":
        custom = state.custom_loss(decoded.model_id, decoded.loss_fn_config)

    async def work() -> Outcome:
        outputs, metrics = await state.in_trainer(model.forward, decoded, custom)
        return Outcome(wire.forward_output(outputs, metrics), proto=True)

    return {"request_id": state.futures.submit(work()), "model_id": decoded.model_id}


async def create_custom_loss(state: ServiceState, request: Request) -> dict:
    """Store an uploaded loss, rebuilt from the allow-lists (a future of its ``loss_id``)."""
    loss_id = state.add_custom_loss(await request.json())

    async def work() -> Outcome:
        return Outcome({"type": "create_custom_loss", "loss_id": loss_id})

    return {"request_id": state.futures.submit(work())}


async def optim_step(state: ServiceState, request: Request) -> dict:
    """Apply the accumulated gradients with this call's Adam parameters."""
    body = await request.json()
    if "adam_params" not in body:
        raise ConfigError("only Adam steps are served (adam_params)")
    adam = _ADAM_DEFAULTS | body["adam_params"]
    model = state.model(body["model_id"])

    async def work() -> Outcome:
        metrics = await state.in_trainer(model.optim_step, adam)
        return Outcome({"type": "optim_step", "metrics": metrics})

    return {"request_id": state.futures.submit(work()), "model_id": body["model_id"]}


_ephemeral = itertools.count(1)


async def save_weights_for_sampler(state: ServiceState, request: Request) -> dict:
    """Save the weights for sampling, by name, or unnamed with a sampling session on them."""
    body = await request.json()
    model_id, name = body["model_id"], body.get("path")
    state.model(model_id)

    async def work() -> Outcome:
        saved = name or f"session-{next(_ephemeral)}"
        path = await state.in_trainer(state.save_for_sampler, model_id, saved)
        if name is not None:
            return Outcome({"type": "save_weights_for_sampler", "path": path})
        session = state.new_sampling_session(None, path, model_id.split(":", 1)[0])
        return Outcome({"type": "save_weights_for_sampler", "sampling_session_id": session})

    return {"request_id": state.futures.submit(work()), "model_id": model_id}


async def save_weights(state: ServiceState, request: Request) -> dict:
    """Save the training state (weights and optimizer) as a checkpoint, by name."""
    body = await request.json()
    model_id = body["model_id"]
    state.model(model_id)
    name = body.get("path") or f"state-{next(_ephemeral)}"
    overwrite, metadata = body.get("overwrite", False), body.get("user_metadata")

    async def work() -> Outcome:
        path = await state.in_trainer(state.save_state, model_id, name, overwrite, metadata)
        return Outcome({"type": "save_weights", "path": path})

    return {"request_id": state.futures.submit(work()), "model_id": model_id}


async def load_weights(state: ServiceState, request: Request) -> dict:
    """Load a checkpoint into a model, or (``session_id`` and ``model_seq_id``, no model yet)
    create the model the checkpoint's run trained and load it."""
    body = await request.json()
    path, optimizer = body["path"], bool(body.get("optimizer"))
    state.store.resolve(path, "weights")  # refused now, not in the future
    if body.get("model_id"):
        model_id = body["model_id"]
        state.model(model_id)
        load = (state.load_state, model_id, path, optimizer)
    else:
        model_id = state.model_id(body.get("session_id"), body.get("model_seq_id"))
        load = (state.create_from_state, model_id, path, optimizer, body.get("base_model"))

    async def work() -> Outcome:
        await state.in_trainer(*load)
        return Outcome({"type": "load_weights", "path": path, "model_id": model_id})

    return {"request_id": state.futures.submit(work()), "model_id": model_id}


# -- checkpoints and runs -----------------------------------------------------------------


async def list_checkpoints(state: ServiceState, request: Request) -> dict:
    """A training run's checkpoints (``CheckpointsListResponse``)."""
    run_id = request.path_params["run_id"]
    state.store.run(run_id)
    return {"checkpoints": state.store.checkpoints(run_id)}


async def list_user_checkpoints(state: ServiceState, request: Request) -> dict:
    """Every run's checkpoints, newest first, a page at a time."""
    found = [c for run in state.store.run_ids() for c in state.store.checkpoints(run)]
    found.sort(key=lambda c: c["time"], reverse=True)
    items, cursor = page(found, *_page_params(request))
    return {"checkpoints": items, "cursor": cursor}


async def get_training_run(state: ServiceState, request: Request) -> dict:
    """One training run (``TrainingRun``)."""
    return state.store.training_run(request.path_params["run_id"])


async def list_training_runs(state: ServiceState, request: Request) -> dict:
    """The training runs in the service's folder, newest first, a page at a time."""
    runs, cursor = page(state.store.run_ids()[::-1], *_page_params(request))
    return {"training_runs": [state.store.training_run(r) for r in runs], "cursor": cursor}


async def weights_info(state: ServiceState, request: Request) -> dict:
    """What a checkpoint needs to be loaded (``WeightsInfoResponse``)."""
    path = (await request.json())["tinker_path"]
    kind = "sampler_weights" if "/sampler_weights/" in path else "weights"
    run_id, _ = state.store.resolve(path, kind)
    record = state.store.run(run_id)
    lora = record["lora"]
    if lora is None:
        return {"base_model": record["base_model"], "is_lora": False}
    return {"base_model": record["base_model"], "is_lora": True, "lora_rank": lora["rank"],
            "train_unembed": False, "train_mlp": lora["train_mlp"],
            "train_attn": lora["train_attn"]}  # fmt: skip


def _page_params(request: Request) -> tuple[int, int]:
    params = request.query_params
    return int(params.get("limit", 20)), int(params.get("offset", 0))


# -- sampling -----------------------------------------------------------------------------


async def create_sampling_session(state: ServiceState, request: Request) -> dict:
    """Open a sampling session on saved weights (``model_path``) or a base model."""
    body = await request.json()
    session = state.new_sampling_session(body.get("base_model"), body.get("model_path"),
                                         body.get("session_id"))  # fmt: skip
    return {"type": "create_sampling_session", "sampling_session_id": session}


async def get_sampler(state: ServiceState, request: Request) -> dict:
    """What a sampling session samples (``GetSamplerResponse``)."""
    session = state.sampling_session(request.path_params["sampler_id"])
    return {"sampler_id": session.id, "base_model": session.base_model,
            "model_path": session.model_path}  # fmt: skip


async def asample(state: ServiceState, request: Request) -> dict:
    """Sample completions of a prompt (a future of a protobuf ``SampleResponse``)."""
    body = await request.json()
    for unsupported in ("topk_prompt_logprobs", "topk_sample_logprobs",
                        "target_prompt_logprobs", "prompt_alt_tokens_k"):  # fmt: skip
        if body.get(unsupported):
            raise ConfigError(f"{unsupported} is not served yet")
    if body.get("sampling_session_id"):
        folder = state.sampling_session(body["sampling_session_id"]).folder
    else:
        _, folder = state.sampled(body.get("base_model"), body.get("model_path"))
    prompt = _prompt_tokens(body["prompt"])
    num_samples = int(body.get("num_samples", 1))
    with_prompt, last_n = bool(body.get("prompt_logprobs")), body.get("prompt_logprobs_last_n")
    if last_n is not None and not 1 <= last_n < len(prompt):
        raise ConfigError(f"prompt_logprobs_last_n must be in 1..{len(prompt) - 1}")

    async def work() -> Outcome:
        for tries_left in (1, 0):  # a sampler engine that died under it: once more, on a new one
            sampler = await state.samplers.get(folder)
            try:
                sequences = await sampler.sample(prompt, num_samples, body["sampling_params"])
                scored = await sampler.prompt_logprobs(prompt, last_n) if with_prompt else None
            except EngineDiedError:
                if not tries_left:
                    raise
                continue
            return Outcome(wire.sample_output(sequences, scored), proto=True)
        raise AssertionError("unreachable")

    request_id = state.futures.submit(work())
    ids = [f"{request_id}-{i}" for i in range(num_samples)]
    return {"request_id": request_id, "sample_sequence_ids": ids}


def _prompt_tokens(prompt: dict) -> list[int]:
    tokens: list[int] = []
    for chunk in prompt["chunks"]:
        if chunk.get("type", "encoded_text") != "encoded_text":
            raise ConfigError("only text chunks are served (no images or audio)")
        tokens.extend(chunk["tokens"])
    return tokens


# -- futures ------------------------------------------------------------------------------


async def retrieve_future(state: ServiceState, request: Request) -> Response:
    """A request's result, after waiting up to ``long_poll_s`` for it; else ``try_again``."""
    body = await request.json()
    try:
        outcome = await state.futures.retrieve(body["request_id"], state.settings.long_poll_s)
    except KeyError:
        return JSONResponse({"detail": f"no request {body['request_id']!r}"}, status_code=404)
    if outcome is None:
        return JSONResponse(TRY_AGAIN | {"request_id": body["request_id"]})
    if outcome.proto:
        return Response(outcome.body, media_type=wire.PROTO)
    return JSONResponse(outcome.body)


_ROUTES: list[tuple[str, str, Handler]] = [
    ("GET", "healthz", healthz),
    ("POST", "client/config", client_config),
    ("POST", "client/dynamic_config", dynamic_config),
    ("GET", "get_server_capabilities", capabilities),
    ("POST", "create_session", create_session),
    ("POST", "session_heartbeat", heartbeat),
    ("POST", "sessions/{session_id}/finish", finish_session),
    ("POST", "telemetry", telemetry),
    ("POST", "create_model", create_model),
    ("POST", "get_info", get_info),
    ("POST", "forward_backward", forward_backward),
    ("POST", "create_custom_loss", create_custom_loss),
    ("POST", "optim_step", optim_step),
    ("POST", "save_weights_for_sampler", save_weights_for_sampler),
    ("POST", "save_weights", save_weights),
    ("POST", "load_weights", load_weights),
    ("GET", "training_runs", list_training_runs),
    ("GET", "training_runs/{run_id}", get_training_run),
    ("GET", "training_runs/{run_id}/checkpoints", list_checkpoints),
    ("GET", "checkpoints", list_user_checkpoints),
    ("POST", "weights_info", weights_info),
    ("POST", "create_sampling_session", create_sampling_session),
    ("GET", "samplers/{sampler_id}", get_sampler),
    ("POST", "asample", asample),
    ("POST", "retrieve_future", retrieve_future),
]
"""Every route served: (method, path under ``/api/v1/``, handler)."""
