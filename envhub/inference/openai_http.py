"""An engine for any OpenAI-compatible HTTP server: ``vllm serve``, SGLang, hosted APIs.

Two paths:

- **tokens** (vLLM): the chat template is rendered by the server's ``/tokenize`` endpoint, and
  turns are generated with ``/v1/completions`` from token ids, returning the sampled ids and
  logprobs. The client needs no tokenizer, and what it records is exactly what was sampled.
- **chat**: ``/v1/chat/completions`` with messages and only standard OpenAI fields, so it works
  with any server, strict hosted APIs included. Text (and logprobs) only: no token record.

``mode="auto"`` picks tokens when the server has ``/tokenize``. Requests are limited to
``max_concurrency`` at a time and retried with backoff on connection errors, 429 and 5xx; a
server that stays unreachable raises :class:`EngineUnavailableError` saying what to check.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from typing import Any, Literal

import httpx

from envhub.errors import ConfigError, EngineError, EngineUnavailableError
from envhub.inference.base import GenerateRequest, Generation, InferenceEngine, SamplingParams
from envhub.inference.messages import wire_message as _wire_message
from envhub.types import Message, SamplerRef, ToolCall, template_sha256

_RETRY_STATUS = {429, 500, 502, 503, 504}
_TRANSPORT_ERRORS = (httpx.TransportError,)


class OpenAIEngine(InferenceEngine):
    """Talks to an OpenAI-compatible server.

    Args:
        base_url: Server root, with or without ``/v1`` (e.g. ``http://127.0.0.1:8000``).
        model: Model name to request; ``None`` asks the server (its first model).
        api_key: Sent as a bearer token; defaults to ``EMPTY`` (what vLLM expects without
            --api-key).
        mode: ``auto``, ``tokens`` or ``chat`` (see the module docstring).
        max_concurrency: Requests in flight at once (per event loop).
        timeout: Seconds per HTTP request.
        max_retries: Retries of a failed request before giving up.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        api_key: str | None = None,
        mode: Literal["auto", "tokens", "chat"] = "auto",
        max_concurrency: int = 64,
        timeout: float = 300.0,
        max_retries: int = 3,
        backoff: float = 0.5,
    ) -> None:
        if mode not in ("auto", "tokens", "chat"):
            raise ConfigError(f"mode must be auto, tokens or chat, got {mode!r}")
        if max_concurrency < 1:  # a semaphore of 0 would make every request wait forever
            raise ConfigError(f"max_concurrency must be at least 1, got {max_concurrency}")
        root = base_url.rstrip("/")
        self.root = root[: -len("/v1")] if root.endswith("/v1") else root
        self.model = model
        self.mode = mode
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_concurrency = max_concurrency
        self._client_options: dict[str, Any] = {
            "base_url": self.root,
            "headers": {"Authorization": f"Bearer {api_key or 'EMPTY'}"},
            "timeout": timeout,
            "limits": httpx.Limits(
                max_connections=max_concurrency, max_keepalive_connections=max_concurrency
            ),
        }
        self._bound: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[httpx.AsyncClient, asyncio.Semaphore]
        ]
        self._bound = weakref.WeakKeyDictionary()
        self._started = False
        self._described: SamplerRef | None = None

    def __repr__(self) -> str:
        return f"OpenAIEngine({self.root!r}, model={self.model!r}, mode={self.mode!r})"

    async def start(self) -> None:
        """Find the model name if not given and decide between the tokens and chat paths."""
        if self._started:
            return
        if self.model is None:
            models = (await self._request("GET", "/v1/models"))["data"]
            if not models:
                raise EngineError(f"{self.root} serves no models")
            self.model = models[0]["id"]
        if self.mode in ("auto", "tokens"):
            # /tokenize marks a vLLM-style server, which takes token-id prompts.
            tokenizer = ServerChatTokenizer(self)
            supported = await tokenizer.probe()
            if not supported and self.mode == "tokens":
                raise EngineError(
                    f"{self.root} has no /tokenize endpoint; use mode='chat' (or serve with vLLM)"
                )
            self.tokenizer = tokenizer if supported else None
            self.mode = "tokens" if supported else "chat"
        self._started = True

    async def describe(self) -> SamplerRef:
        """``openai`` with the mode and the model; on a vLLM server (tokens mode) also its
        version (``GET /version``) and, when it was started with
        ``--enable-tokenizer-info-endpoint``, its chat template's hash (``GET
        /tokenizer_info``). Asked once per engine, then remembered."""
        if self._described is None:
            version = template = None
            if self.mode == "tokens":  # hosted chat APIs have neither route: don't ask them
                version = (await self._probe("/version")).get("version")
                template = (await self._probe("/tokenizer_info")).get("chat_template")
            self._described = SamplerRef(
                engine="openai",
                mode=self.mode,
                model=self.model,
                version=str(version) if version is not None else None,
                chat_template_sha256=template_sha256(template)
                if isinstance(template, (str, dict))
                else None,
            )
        return self._described

    async def _probe(self, path: str) -> dict[str, Any]:
        """``GET path`` once, without retries: its JSON object, or ``{}`` when the server has
        no such route or fails (provenance is worth a request, not a retry loop)."""
        client, limit = self._bind()
        try:
            async with limit:
                response = await client.get(path)
            data = response.json() if response.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    async def aclose(self) -> None:
        """Close the HTTP client bound to the running event loop, if there is one."""
        bound = self._bound.pop(asyncio.get_running_loop(), None)
        if bound is not None:
            await bound[0].aclose()

    def _bind(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        """The client and request limit of the running event loop. Pooled connections and
        semaphores belong to the loop that made them, and an engine outlives loops: a judge
        reward is called from ``env.step`` (a private loop) and from the rollout runner."""
        loop = asyncio.get_running_loop()
        bound = self._bound.get(loop)
        if bound is None:
            bound = self._bound[loop] = (
                httpx.AsyncClient(**self._client_options),
                asyncio.Semaphore(self.max_concurrency),
            )
        return bound

    async def generate(self, request: GenerateRequest) -> Generation:
        """Generate one turn, from ``prompt_ids`` when the request has them, else from messages.

        Starts the engine first if :meth:`start` has not run.
        """
        if not self._started:
            await self.start()
        if request.prompt_ids is not None:
            return await self._complete_tokens(request.prompt_ids, request.sampling)
        return await self._chat(request)

    # -- the two paths ------------------------------------------------------------------------

    async def _complete_tokens(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        body = {
            "model": self.model,
            "prompt": prompt_ids,
            "return_token_ids": True,
            **_sampling_body(sampling),
        }
        if sampling.logprobs:
            body["logprobs"] = 0  # the sampled token's own logprob
        choice = (await self._request("POST", "/v1/completions", body))["choices"][0]
        token_ids = choice.get("token_ids")
        if token_ids is None:
            raise EngineError(
                f"{self.root} did not return token ids; a vLLM server is needed for mode='tokens'"
            )
        return Generation(
            text=choice.get("text") or "",
            token_ids=list(token_ids),
            logprobs=_token_logprobs(choice.get("logprobs"), len(token_ids))
            if sampling.logprobs
            else None,
            finish_reason=_finish_reason(choice.get("finish_reason")),
        )

    async def _chat(self, request: GenerateRequest) -> Generation:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [_wire_message(m) for m in request.messages],
            **_sampling_body(request.sampling),
        }
        if request.tools:
            body["tools"] = request.tools
        if request.sampling.logprobs:
            body["logprobs"] = True
        data = await self._request("POST", "/v1/chat/completions", body)
        choice = data["choices"][0]
        message = choice.get("message") or {}
        token_ids = choice.get("token_ids")
        logprobs = _chat_logprobs(choice.get("logprobs"))
        if token_ids is not None and logprobs is not None and len(logprobs) != len(token_ids):
            raise EngineError(
                f"server returned {len(logprobs)} logprobs for {len(token_ids)} tokens"
            )
        return Generation(
            text=message.get("content") or "",
            token_ids=list(token_ids) if token_ids is not None else None,
            logprobs=logprobs,
            finish_reason=_finish_reason(choice.get("finish_reason")),
            prompt_token_ids=data.get("prompt_token_ids") or choice.get("prompt_token_ids"),
            tool_calls=_server_tool_calls(message.get("tool_calls")),
        )

    # -- HTTP with retries --------------------------------------------------------------------

    async def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        last: str = ""
        client, limit = self._bind()
        async with limit:
            for attempt in range(self.max_retries + 1):
                if attempt:
                    await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
                try:
                    response = await client.request(method, path, json=body)
                except _TRANSPORT_ERRORS as e:
                    last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                    continue
                if response.status_code in _RETRY_STATUS:
                    last = f"HTTP {response.status_code}: {_error_text(response)}"
                    continue
                if response.status_code >= 400:
                    raise EngineError(
                        f"{method} {path} -> HTTP {response.status_code}: {_error_text(response)}"
                    )
                return _json_body(response, method, path)
        raise EngineUnavailableError(
            f"{self.root}{path} failed after {self.max_retries + 1} attempts ({last}). "
            "Is the server running and reachable? Start one with `envhub serve-model MODEL` "
            "(it prints the URL to use), or pass --serve to `envhub eval`."
        )


class ServerChatTokenizer:
    """Renders chat templates with the server's ``/tokenize`` endpoint (vLLM)."""

    def __init__(self, engine: OpenAIEngine) -> None:
        self.engine = engine
        self._max_length: int | None = None

    @property
    def max_length(self) -> int | None:
        """The server's ``max_model_len``, once a ``/tokenize`` call has reported it."""
        return self._max_length

    async def probe(self) -> bool:
        """True if the server tokenises chats as vLLM does; also learns the context length.
        An unreachable server raises; any other failure means "not supported"."""
        try:
            await self.render([Message(role="user", content="hi")], None, True)
        except EngineUnavailableError:
            raise
        except (EngineError, KeyError, TypeError, ValueError):
            return False
        return True

    async def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> list[int]:
        """Token ids of ``messages`` rendered by the server's ``/tokenize`` endpoint.

        Also records the server's context length from the response.
        """
        body: dict[str, Any] = {
            "model": self.engine.model,
            "messages": [_wire_message(m, for_template=True) for m in messages],
            "add_generation_prompt": add_generation_prompt,
            "add_special_tokens": False,
        }
        if tools:
            body["tools"] = tools
        result = await self.engine._request("POST", "/tokenize", body)
        self._max_length = result.get("max_model_len", self._max_length)
        return list(result["tokens"])


def _sampling_body(s: SamplingParams) -> dict[str, Any]:
    body: dict[str, Any] = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "max_tokens": s.max_tokens,
    }
    if s.top_k is not None:
        body["top_k"] = s.top_k
    if s.stop:
        body["stop"] = list(s.stop)
    if s.seed is not None:
        body["seed"] = s.seed
    return body


def _finish_reason(value: str | None) -> str:
    return "length" if value == "length" else "stop"


def _token_logprobs(logprobs: dict[str, Any] | None, n: int) -> list[float]:
    values = (logprobs or {}).get("token_logprobs") or []
    if len(values) != n:
        raise EngineError(f"server returned {len(values)} logprobs for {n} tokens")
    return [float(v) if v is not None else 0.0 for v in values]


def _chat_logprobs(logprobs: dict[str, Any] | None) -> list[float] | None:
    content = (logprobs or {}).get("content")
    return [float(item["logprob"]) for item in content] if content else None


def _server_tool_calls(raw: list[dict[str, Any]] | None) -> list[ToolCall] | None:
    if not raw:
        return None
    calls = []
    for i, item in enumerate(raw):
        function = item.get("function") or {}
        arguments = function.get("arguments")
        text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
        calls.append(ToolCall.make(item.get("id") or f"call_{i}", function.get("name", ""), text))
    return calls


def _json_body(response: httpx.Response, method: str, path: str) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        raise EngineError(
            f"{method} {path} -> HTTP {response.status_code} but not JSON: {response.text[:200]!r}"
        ) from None
    if not isinstance(data, dict):
        raise EngineError(f"{method} {path} -> expected a JSON object, got {type(data).__name__}")
    return data


def _error_text(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:300]
    error = data.get("error", data) if isinstance(data, dict) else data
    message = error.get("message") if isinstance(error, dict) else None
    return str(message or data)[:300]
