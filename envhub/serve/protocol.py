"""The wire protocol of ``envhub serve``, shared by the server and ``RemoteEnv``.

Every frame (a WebSocket text frame, or the body of an HTTP ``POST``) is one JSON object. A
request names its operation and carries an id the client chose (a UUID)::

    {"id": "5f0c...", "op": "create", "env_args": {"max_turns": 3}}
    {"id": "9a41...", "op": "reset", "session": "s-...", "seed": 0, "options": null}
    {"id": "c2d7...", "op": "step", "session": "s-...", "action": "<tool_call>...</tool_call>"}
    {"id": "...", "op": "truncate", "session": "s-...", "reason": "max_tokens"}
    {"id": "...", "op": "info" | "tools" | "close", "session": "s-..."}

and the reply repeats the id::

    {"id": "9a41...", "ok": true, "result": {...}}
    {"id": "9a41...", "ok": false, "error": {"code": 404, "type": "unknown_session", ...}}

Requests are idempotent by id: the server keeps each session's recent answers, so a retry gets
the first answer (or waits for it) and never runs the operation twice. A session's requests may
also carry ``seq``, a number the client counts up from 1 per session (``RemoteEnv`` does): the
server remembers which numbers it has started (a window of :data:`SEQ_WINDOW` below the highest,
a bitmap), so a retry that comes after any number of newer requests, once its answer has left
the small answer cache, is still recognised: it gets a 409 ``stale_retry`` error and the env is
not stepped again. Requests without ``seq`` are recognised while their answer is cached.

An error's ``code`` follows HTTP (the status of an HTTP reply); ``type`` is an error kind below,
or the class of the exception the env raised (code 500). The server reads every request within
bounds (:mod:`envhub.serve.bounds`): a malformed one gets an error on its own id, never a closed
connection.

Values that are not plain JSON (messages, tool calls, error records in ``info``, tuples, numpy
arrays, dicts with non-string keys) travel tagged, so that they come back as the same types
(:mod:`envhub.serve.codec`; :func:`encode`, :func:`decode`, :func:`dumps` and :func:`batches`
are re-exported here). Floats keep ``inf`` and ``nan`` (JSON's ``Infinity``/``NaN``).

When the served env is a ``TaskEnv``, the answers to ``reset``, ``step`` and ``truncate`` carry an
:class:`EpisodeView`: what changed in ``env.state`` (the messages appended, with the assistant
turns' parsed tool calls; turn and token counts, metrics, stop reason), so that a client can keep
a copy of the episode's state as the rollout runner reads it on a local env.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from envhub.serve.codec import MODELS as MODELS
from envhub.serve.codec import TAG as TAG
from envhub.serve.codec import batches as batches
from envhub.serve.codec import decode as decode
from envhub.serve.codec import dumps as dumps
from envhub.serve.codec import encode as encode
from envhub.serve.settings import MAX_ARRAY_BYTES, MAX_DEPTH, MAX_ITEMS
from envhub.types import EnvRef

# -- error kinds (``ErrorInfo.type`` for errors of the protocol rather than of the env) -------

BAD_REQUEST = "bad_request"
UNAUTHORIZED = "unauthorized"
TOO_LARGE = "too_large"
WRONG_ENV = "wrong_env"
UNKNOWN_SESSION = "unknown_session"
CAPACITY = "capacity"
SHUTTING_DOWN = "shutting_down"
STALE_RETRY = "stale_retry"

# -- requests -------------------------------------------------------------------------------


class _Request(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1, max_length=200)
    """Chosen by the client, unique per request (a UUID); a retry reuses it."""


class CreateRequest(_Request):
    """Open a session: one env instance, made with the server's env args updated by these."""

    op: Literal["create"]
    env_args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for the env's constructor (encoded values)."""


SEQ_WINDOW = 1024
"""How far below a session's highest ``seq`` the server still tells started numbers from new
ones (older numbers count as started: a retry that late is refused, never run)."""


class _SessionRequest(_Request):
    session: str = Field(min_length=1, max_length=200)
    """The id that ``create`` returned."""
    seq: int | None = Field(None, ge=1, lt=2**63)
    """The request's number in its session (1, 2, ...; a retry repeats it), or ``None``."""


class ResetRequest(_SessionRequest):
    """Start an episode: ``env.reset(seed=seed, options=options)``."""

    op: Literal["reset"]
    seed: int | None = None
    options: Any = None
    """Encoded options (a dict or ``null``)."""


class StepRequest(_SessionRequest):
    """One assistant turn: ``env.step(action)``."""

    op: Literal["step"]
    action: Any
    """The encoded action: a string, a ``Message`` or an ``AssistantTurn``."""


class TruncateRequest(_SessionRequest):
    """End a ``TaskEnv``'s episode from outside and score it: ``env.atruncate(reason)``."""

    op: Literal["truncate"]
    reason: str = Field(min_length=1, max_length=200)
    """Why the episode was cut (the trajectory's ``stop_reason``), e.g. ``"max_tokens"``."""


class InfoRequest(_SessionRequest):
    """What the session's env is: :class:`EnvInfo`."""

    op: Literal["info"]


class ToolsRequest(_SessionRequest):
    """The env's OpenAI tool schemas (they may change between episodes)."""

    op: Literal["tools"]


class CloseRequest(_SessionRequest):
    """Close the session and its env (closing an unknown session is not an error)."""

    op: Literal["close"]


Request = Annotated[
    CreateRequest
    | ResetRequest
    | StepRequest
    | TruncateRequest
    | InfoRequest
    | ToolsRequest
    | CloseRequest,
    Field(discriminator="op"),
]
REQUEST: TypeAdapter[Request] = TypeAdapter(Request)
OPS = ("create", "reset", "step", "truncate", "info", "tools", "close")


def step_request(request_id: str, session: str, action: Any, seq: int | None) -> dict[str, Any]:
    """A ``step`` request, ready for :func:`dumps`: what ``StepRequest(...).model_dump()`` gives,
    without a model per request (the client's hot path); without ``seq`` when it is ``None``
    (a server that takes no request numbers refuses the field)."""
    request = {"id": request_id, "op": "step", "session": session, "seq": seq}
    if seq is None:
        del request["seq"]
    request["action"] = encode(action)
    return request


def reset_request(
    request_id: str,
    session: str,
    seed: int | None,
    options: dict[str, Any] | None,
    seq: int | None,
) -> dict[str, Any]:
    """A ``reset`` request, ready for :func:`dumps` (see :func:`step_request`)."""
    request = {"id": request_id, "op": "reset", "session": session, "seq": seq}
    if seq is None:
        del request["seq"]
    return {**request, "seed": seed, "options": encode(options)}


def parse_request(payload: Any) -> Request:
    """The typed request in a decoded frame.

    Raises:
        RequestError: Not an object, an unknown ``op``, or missing or malformed fields.
    """
    if not isinstance(payload, dict):
        raise RequestError(400, BAD_REQUEST, "a frame must be a JSON object")
    if payload.get("op") not in OPS:
        raise RequestError(
            400, BAD_REQUEST, f"unknown op {payload.get('op')!r}; expected one of {', '.join(OPS)}"
        )
    try:
        return REQUEST.validate_python(payload)
    except ValidationError as e:
        raise RequestError(400, BAD_REQUEST, f"{payload['op']} request: {_first(e)}") from None


def _first(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"][1:]) or "request"
    more = error.error_count() - 1
    return f"`{where}`: {first['msg']}" + (f" (and {more} more)" if more else "")


# -- replies --------------------------------------------------------------------------------


class RequestError(Exception):
    """A request the server refuses or could not carry out; becomes an error reply."""

    def __init__(self, code: int, type: str, message: str) -> None:
        super().__init__(message)
        self.code, self.type, self.message = code, type, message


class ErrorInfo(BaseModel):
    """Why a request failed."""

    model_config = ConfigDict(frozen=True)

    code: int
    """HTTP-style status: 400 bad request, 401 no or wrong token, 404 unknown session or env,
    409 a stale retry, 413 a frame or value too large, 500 the env raised, 503 the server is
    full or shutting down."""
    type: str
    """An error kind (``bad_request``, ``unknown_session``, ...) or the env's exception class."""
    message: str


class Reply(BaseModel):
    """The answer to one request."""

    model_config = ConfigDict(frozen=True)

    id: str | None
    """The request's id (``None`` when the frame was unreadable)."""
    ok: bool
    result: dict[str, Any] | None = None
    error: ErrorInfo | None = None


def ok_reply(request_id: str, result: BaseModel | dict[str, Any]) -> dict[str, Any]:
    """A success reply, ready for :func:`dumps` (``result``: a result model, or its dump)."""
    data = result if isinstance(result, dict) else result.model_dump(mode="json")
    return {"id": request_id, "ok": True, "result": data}


def error_reply(request_id: str | None, error: RequestError) -> dict[str, Any]:
    """An error reply, ready for :func:`dumps`."""
    info = ErrorInfo(code=error.code, type=error.type, message=error.message)
    return {"id": request_id, "ok": False, "error": info.model_dump()}


def step_result(
    observation: Any,
    reward: Any,
    terminated: Any,
    truncated: Any,
    info: Any,
    remaining_tokens: Any,
    state: dict[str, Any] | None,
) -> dict[str, Any]:
    """``StepResult(...).model_dump(mode="json")`` of encoded values and a :func:`episode_state`.

    When every value already has the type the model would keep (a Python ``int`` or ``float``
    reward, ``bool`` flags: the common case), the fields are the dump as they are, without a
    model per step (the server's hot path); anything else (a numpy reward, an ``int`` flag, a
    wrong type) goes through the model, which converts it or raises as it always did.
    """
    fields = {
        "observation": observation,
        "reward": reward,
        "terminated": terminated,
        "truncated": truncated,
        "info": info,
        "remaining_tokens": remaining_tokens,
        "state": state,
    }
    plain = (
        type(reward) in _NUMBER
        and type(terminated) is bool
        and type(truncated) is bool
        and (remaining_tokens is None or type(remaining_tokens) is int)
    )
    return fields if plain else StepResult(**fields).model_dump(mode="json")


def episode_state(
    start: int,
    messages: list[Any],
    observation_follows: bool,
    turn: Any,
    tokens: Any,
    metrics: dict[Any, Any],
    stop_reason: Any,
    reward_components: dict[Any, Any],
) -> dict[str, Any]:
    """``EpisodeView(...).model_dump(mode="json")``, the fields as they are when the counters
    are plain ``int``/``float`` values under string keys (as :func:`step_result`; else through
    the model)."""
    fields = {
        "start": start,
        "messages": messages,
        "observation_follows": observation_follows,
        "turn": turn,
        "tokens": tokens,
        "metrics": dict(metrics),
        "stop_reason": stop_reason,
        "reward_components": dict(reward_components),
    }
    plain = (
        type(turn) is int
        and type(tokens) is int
        and (stop_reason is None or type(stop_reason) is str)
        and _plain_numbers(metrics)
        and _plain_numbers(reward_components)
    )
    return fields if plain else EpisodeView(**fields).model_dump(mode="json")


_NUMBER = (int, float)


def _plain_numbers(values: dict[Any, Any]) -> bool:
    return all(type(k) is str and type(v) in _NUMBER for k, v in values.items())


class Limits(BaseModel):
    """What the server accepts."""

    model_config = ConfigDict(frozen=True)

    max_message_bytes: int
    """The largest frame (request) the server reads."""
    session_ttl: float
    """Seconds of inactivity after which a session is closed."""
    max_depth: int = MAX_DEPTH
    """Nesting levels a request's value (action, options, env args) may have."""
    max_items: int = MAX_ITEMS
    """List elements, dict entries and array elements a request's value may hold."""
    max_array_bytes: int = MAX_ARRAY_BYTES
    """Bytes the numpy arrays of a request's value may take."""
    request_numbers: bool = False
    """The server takes ``seq`` on a session's requests (a server that takes none refuses the
    field and leaves this out: its clients send none)."""


class EnvInfo(BaseModel):
    """What a client needs to know about the served env."""

    model_config = ConfigDict(frozen=True)

    ref: EnvRef
    """Name, version and (for Hub packages) commit, as recorded on trajectories."""
    reward_range: tuple[float, float]
    pass_threshold: float
    audit_floor: float | None = None
    max_turns: int | None = None
    """The turn budget of a ``TaskEnv`` (``None`` for envs without one)."""
    max_tokens: int | None = None
    tool_schemas: list[dict[str, Any]] | None = None
    multi_role: bool = False
    """Whether the env's episodes are matches between several actors (``Env.multi_role``)."""
    observation_space: str
    action_space: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    """The env's ``metadata`` (encoded)."""


class Created(BaseModel):
    """The result of ``create``."""

    session: str
    info: EnvInfo
    limits: Limits


class EpisodeView(BaseModel):
    """What changed in a ``TaskEnv``'s ``env.state`` with one answer (the whole state after
    ``reset``). Messages are appended to the state as an episode goes; a client's copy takes
    ``messages`` at index ``start`` (a retried answer thus applies once)."""

    start: int
    """Where ``messages`` go in ``state.messages`` (how many the client has already)."""
    messages: list[Any]
    """The messages appended since the last answer (encoded), but for the observation."""
    observation_follows: bool
    """The answer's observation comes after ``messages`` (it was appended to the state too);
    it is not sent twice."""
    turn: int
    tokens: int
    metrics: dict[str, int | float]
    """The state's counters: ``tool_calls``, ``tool_errors``, ..."""
    stop_reason: str | None
    reward_components: dict[str, int | float]


class ResetResult(BaseModel):
    """The result of ``reset``: the observation and info (encoded), and the episode's tools."""

    observation: Any
    info: Any
    tool_schemas: list[dict[str, Any]] | None = None
    remaining_tokens: int | None = None
    state: EpisodeView | None = None
    """The episode's state, when the env is a ``TaskEnv``."""


class StepResult(BaseModel):
    """The result of ``step``: the env's five values (observation and info encoded)."""

    observation: Any
    reward: int | float
    terminated: bool
    truncated: bool
    info: Any
    remaining_tokens: int | None = None
    state: EpisodeView | None = None
    """What the step changed in the episode's state, when the env is a ``TaskEnv``."""


class TruncateResult(BaseModel):
    """The result of ``truncate``: the episode's score and final info (encoded)."""

    reward: int | float
    info: Any
    state: EpisodeView | None = None


class ToolsResult(BaseModel):
    """The result of ``tools``."""

    tool_schemas: list[dict[str, Any]] | None


class InfoResult(BaseModel):
    """The result of ``info``."""

    info: EnvInfo


class Closed(BaseModel):
    """The result of ``close``: whether this request closed the session."""

    closed: bool
