"""OpenAIEngine against small OpenAI-protocol servers on 127.0.0.1: retries, errors, parsing, modes.

A real vLLM server is exercised in tests/e2e; these tests drive every code path of our client.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from envhub.defaults import free_port
from envhub.errors import ConfigError, EngineError, EngineUnavailableError
from envhub.inference.base import GenerateRequest, Generation, SamplingParams
from envhub.inference.openai_http import OpenAIEngine, ServerChatTokenizer
from envhub.types import Message, ToolCall, assistant, tool_message, user

MESSAGES = [user("Hi")]


def chat(content: str = "Hello!", **extra: Any) -> dict[str, Any]:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": content},
        "finish_reason": "stop",
    }
    return {"id": "chatcmpl-1", "object": "chat.completion", "choices": [{**choice, **extra}]}


def engine_for(url: str, **kwargs: Any) -> OpenAIEngine:
    kwargs.setdefault("mode", "chat")
    kwargs.setdefault("backoff", 0.0)
    return OpenAIEngine(url, "m", **kwargs)


def generate(engine: OpenAIEngine, request: GenerateRequest | None = None) -> Generation:
    async def main() -> Generation:
        try:
            return await engine.generate(request or GenerateRequest(messages=MESSAGES))
        finally:
            await engine.aclose()

    return asyncio.run(main())


# -- retries and errors ---------------------------------------------------------------------------


def test_retries_on_503_then_succeeds(http_server: Any) -> None:
    attempts = []

    def handle(method: str, path: str, body: Any) -> tuple[int, Any]:
        attempts.append(path)
        return (
            (503, {"error": {"message": "warming up"}}) if len(attempts) < 3 else (200, chat("ok"))
        )

    server = http_server(handle)
    assert generate(engine_for(server.url, max_retries=3)).text == "ok"
    assert attempts == ["/v1/chat/completions"] * 3


def test_gives_up_after_max_retries_with_the_last_error(http_server: Any) -> None:
    server = http_server(lambda method, path, body: (503, {"error": {"message": "warming up"}}))
    with pytest.raises(EngineUnavailableError) as info:
        generate(engine_for(server.url, max_retries=2))
    assert str(info.value).startswith(
        f"{server.url}/v1/chat/completions failed after 3 attempts (HTTP 503: warming up). "
    )
    assert len(server.requests) == 3


def test_a_400_is_not_retried_and_carries_the_servers_message(http_server: Any) -> None:
    server = http_server(
        lambda method, path, body: (
            400,
            {"error": {"message": "max_tokens is too large", "type": "BadRequestError"}},
        )
    )
    with pytest.raises(EngineError) as info:
        generate(engine_for(server.url, max_retries=3))
    assert type(info.value) is EngineError
    assert str(info.value) == "POST /v1/chat/completions -> HTTP 400: max_tokens is too large"
    assert len(server.requests) == 1


def test_error_bodies_that_are_not_openai_shaped(http_server: Any) -> None:
    server = http_server(lambda method, path, body: (422, "Unprocessable: missing field"))
    with pytest.raises(
        EngineError, match=r"^POST /v1/chat/completions -> HTTP 422: Unprocessable: missing field$"
    ):
        generate(engine_for(server.url))


def test_a_success_that_is_not_json_is_an_engine_error(http_server: Any) -> None:
    server = http_server(lambda method, path, body: (200, "<html>proxy login</html>"))
    with pytest.raises(EngineError) as info:
        generate(engine_for(server.url))
    assert (
        str(info.value)
        == "POST /v1/chat/completions -> HTTP 200 but not JSON: '<html>proxy login</html>'"
    )


def test_a_closed_port_says_what_to_do() -> None:
    port = free_port()
    with pytest.raises(EngineUnavailableError) as info:
        generate(engine_for(f"http://127.0.0.1:{port}", max_retries=1))
    message = str(info.value)
    assert message.startswith(
        f"http://127.0.0.1:{port}/v1/chat/completions failed after 2 attempts (ConnectError: "
    )
    assert message.endswith(
        "Is the server running and reachable? Start one with `envhub serve-model MODEL` "
        "(it prints the URL to use), or pass --serve to `envhub eval`."
    )


def test_invalid_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="^mode must be auto, tokens or chat, got 'fast'$"):
        OpenAIEngine("http://127.0.0.1:1", mode="fast")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="^max_concurrency must be at least 1, got 0$"):
        OpenAIEngine("http://127.0.0.1:1", max_concurrency=0)


# -- the chat path ---------------------------------------------------------------------------------


def test_chat_request_and_vllm_style_chat_response(http_server: Any) -> None:
    response = chat(
        "",
        finish_reason="tool_calls",
        token_ids=[7, 8, 9],
        logprobs={
            "content": [
                {"token": "a", "logprob": -0.5},
                {"token": "b", "logprob": -0.25},
                {"token": "c", "logprob": 0.0},
            ]
        },
        message={
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1}'},
                },
                {"type": "function", "function": {"name": "now", "arguments": {"tz": "UTC"}}},
            ],
        },
    )
    response["prompt_token_ids"] = [1, 2, 3, 4]
    server = http_server(lambda method, path, body: (200, response))
    tools = [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add.",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    history: list[Message] = [
        user("Add 1"),
        assistant(
            '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
            [ToolCall.make("c0", "add", {"a": 1})],
        ),
        tool_message("1", "c0", "add"),
        assistant("", [ToolCall.make("c1", "add", {"a": 2})]),
    ]
    sampling = SamplingParams(
        temperature=0.7, top_p=0.9, top_k=20, max_tokens=64, stop=("</s>",), seed=3
    )
    generation = generate(
        engine_for(server.url), GenerateRequest(messages=history, tools=tools, sampling=sampling)
    )

    assert generation == Generation(
        text="",
        token_ids=[7, 8, 9],
        logprobs=[-0.5, -0.25, 0.0],
        finish_reason="stop",
        prompt_token_ids=[1, 2, 3, 4],
        tool_calls=[
            ToolCall.make("call_a", "add", '{"a": 1}'),
            ToolCall.make("call_1", "now", '{"tz": "UTC"}'),
        ],
    )
    assert server.paths() == ["POST /v1/chat/completions"]
    body = server.requests[0][2]
    assert body == {
        "model": "m",
        "messages": [
            {"role": "user", "content": "Add 1"},
            # calls written in the text are sent as text only; structured ones stay structured
            {
                "role": "assistant",
                "content": '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>',
            },
            {"role": "tool", "content": "1", "tool_call_id": "c0", "name": "add"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 2}'},
                    }
                ],
            },
        ],
        # only standard OpenAI fields: strict hosted APIs reject vLLM's extras
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 64,
        "top_k": 20,
        "stop": ["</s>"],
        "seed": 3,
        "tools": tools,
        "logprobs": True,
    }


def test_plain_chat_response_from_any_server(http_server: Any) -> None:
    server = http_server(lambda method, path, body: (200, chat("Hello!", finish_reason="length")))
    generation = generate(
        engine_for(server.url),
        GenerateRequest(messages=MESSAGES, sampling=SamplingParams(logprobs=False)),
    )
    assert generation == Generation(text="Hello!", finish_reason="length")
    assert "logprobs" not in server.requests[0][2]


def test_chat_logprobs_must_match_the_token_ids(http_server: Any) -> None:
    server = http_server(
        lambda method, path, body: (
            200,
            chat("x", token_ids=[1, 2], logprobs={"content": [{"logprob": -1.0}]}),
        )
    )
    with pytest.raises(EngineError, match="^server returned 1 logprobs for 2 tokens$"):
        generate(engine_for(server.url))


# -- the tokens path (vLLM) -----------------------------------------------------------------------


def vllm(tokenize: bool = True, completion: dict[str, Any] | None = None) -> Any:
    def handle(method: str, path: str, body: Any) -> tuple[int, Any]:
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": "served-model"}, {"id": "other"}]}
        if path == "/tokenize" and tokenize:
            n = len(body["messages"])
            return 200, {
                "count": n + 2,
                "max_model_len": 4096,
                "tokens": [100 + n, 200, 300 if body["add_generation_prompt"] else 301],
            }
        if path == "/v1/completions" and completion is not None:
            return 200, completion
        return 404, {"detail": "Not Found"}

    return handle


COMPLETION = {
    "choices": [
        {
            "index": 0,
            "text": "Hi!",
            "token_ids": [5, 6, 7],
            "logprobs": {"token_logprobs": [-0.1, None, -0.3]},
            "finish_reason": "length",
        }
    ]
}


def test_auto_mode_picks_tokens_when_the_server_tokenizes(http_server: Any) -> None:
    server = http_server(vllm(completion=COMPLETION))
    engine = OpenAIEngine(server.url + "/v1", mode="auto", backoff=0.0)

    async def main() -> tuple[list[int], Generation]:
        await engine.start()
        await engine.start()  # idempotent
        assert engine.tokenizer is not None
        prompt = await engine.tokenizer.render(
            [user("a"), assistant("b")], None, add_generation_prompt=False
        )
        generation = await engine.generate(
            GenerateRequest(
                messages=MESSAGES, prompt_ids=[1, 2, 3], sampling=SamplingParams(max_tokens=16)
            )
        )
        await engine.aclose()
        return prompt, generation

    prompt, generation = asyncio.run(main())
    assert (engine.mode, engine.model, engine.root) == ("tokens", "served-model", server.url)
    assert isinstance(engine.tokenizer, ServerChatTokenizer) and engine.tokenizer.max_length == 4096
    assert prompt == [102, 200, 301]
    assert generation == Generation(
        text="Hi!", token_ids=[5, 6, 7], logprobs=[-0.1, 0.0, -0.3], finish_reason="length"
    )
    assert server.paths() == [
        "GET /v1/models",
        "POST /tokenize",
        "POST /tokenize",
        "POST /v1/completions",
    ]
    assert server.requests[1][2] == {
        "model": "served-model",
        "messages": [{"role": "user", "content": "hi"}],
        "add_generation_prompt": True,
        "add_special_tokens": False,
    }
    assert server.requests[3][2] == {
        "model": "served-model",
        "prompt": [1, 2, 3],
        "return_token_ids": True,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": 16,
        "logprobs": 0,
    }


def test_auto_mode_picks_chat_when_tokenize_is_404(http_server: Any) -> None:
    server = http_server(vllm(tokenize=False))
    engine = OpenAIEngine(server.url, "m", mode="auto", backoff=0.0)
    asyncio.run(engine.start())
    assert (engine.mode, engine.tokenizer) == ("chat", None)
    assert server.paths() == ["POST /tokenize"]


def test_tokens_mode_needs_tokenize(http_server: Any) -> None:
    server = http_server(vllm(tokenize=False))
    with pytest.raises(
        EngineError, match=r"has no /tokenize endpoint; use mode='chat' \(or serve with vLLM\)$"
    ):
        asyncio.run(OpenAIEngine(server.url, "m", mode="tokens").start())


def test_tokens_mode_needs_token_ids_and_matching_logprobs(http_server: Any) -> None:
    request = GenerateRequest(messages=MESSAGES, prompt_ids=[1])
    no_ids = {"choices": [{"text": "x", "finish_reason": "stop"}]}
    server = http_server(vllm(completion=no_ids))
    with pytest.raises(
        EngineError, match=r"did not return token ids; a vLLM server is needed for mode='tokens'$"
    ):
        generate(OpenAIEngine(server.url, "m", mode="tokens"), request)
    short = {
        "choices": [
            {
                "text": "x",
                "token_ids": [1, 2],
                "logprobs": {"token_logprobs": [-1.0]},
                "finish_reason": "stop",
            }
        ]
    }
    server = http_server(vllm(completion=short))
    with pytest.raises(EngineError, match="^server returned 1 logprobs for 2 tokens$"):
        generate(OpenAIEngine(server.url, "m", mode="tokens"), request)


def test_a_server_without_models(http_server: Any) -> None:
    server = http_server(lambda method, path, body: (200, {"data": []}))
    with pytest.raises(EngineError, match=r"serves no models$"):
        asyncio.run(OpenAIEngine(server.url, mode="chat").start())


# -- concurrency and event loops -------------------------------------------------------------------


def test_concurrency_limit_is_respected(http_server: Any) -> None:
    lock = threading.Lock()
    live = {"now": 0, "most": 0}

    def handle(method: str, path: str, body: Any) -> tuple[int, Any]:
        with lock:
            live["now"] += 1
            live["most"] = max(live["most"], live["now"])
        time.sleep(0.03)
        with lock:
            live["now"] -= 1
        return 200, chat("ok")

    server = http_server(handle)
    engine = engine_for(server.url, max_concurrency=2)

    async def main() -> list[Generation]:
        results = await asyncio.gather(
            *(engine.generate(GenerateRequest(messages=MESSAGES)) for _ in range(6))
        )
        await engine.aclose()
        return list(results)

    assert [g.text for g in asyncio.run(main())] == ["ok"] * 6
    assert live["most"] == 2
    assert len(server.requests) == 6


def test_one_engine_works_from_successive_event_loops(http_server: Any) -> None:
    server = http_server(lambda method, path, body: (200, chat("ok")))
    engine = engine_for(server.url, max_concurrency=1)

    async def burst() -> list[str]:
        return [
            g.text
            for g in await asyncio.gather(
                *(engine.generate(GenerateRequest(messages=MESSAGES)) for _ in range(3))
            )
        ]

    for _ in range(3):
        assert asyncio.run(burst()) == ["ok"] * 3
    assert len(server.requests) == 9
