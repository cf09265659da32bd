"""What an OpenAI-compatible server tells about itself for a run's provenance: vLLM's version
and, when it exposes its tokenizer info, its chat template; hosted chat APIs are not asked."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from envhub.inference.openai_http import OpenAIEngine
from envhub.types import SamplerRef

TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"


def vllm(version: bool, tokenizer_info: bool) -> Any:
    """A vLLM-like server: /tokenize always; /version and /tokenizer_info when asked to."""

    def handle(method: str, path: str, body: Any) -> tuple[int, Any]:
        if path == "/tokenize":
            return 200, {"tokens": [1, 2, 3], "max_model_len": 2048}
        if path == "/version" and version:
            return 200, {"version": "0.11.0"}
        if path == "/tokenizer_info" and tokenizer_info:
            return 200, {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE}
        return 404, {"detail": "Not Found"}

    return handle


def describe(engine: OpenAIEngine, times: int = 1) -> list[SamplerRef]:
    async def main() -> list[SamplerRef]:
        await engine.start()
        try:
            return [await engine.describe() for _ in range(times)]
        finally:
            await engine.aclose()

    return asyncio.run(main())


def test_a_vllm_server_reports_its_version_and_template_once(http_server: Any) -> None:
    server = http_server(vllm(version=True, tokenizer_info=True))
    first, second = describe(OpenAIEngine(server.url, "served", backoff=0.0), times=2)
    assert (
        first
        == second
        == SamplerRef(
            engine="openai",
            mode="tokens",
            model="served",
            version="0.11.0",
            chat_template_sha256=hashlib.sha256(TEMPLATE.encode()).hexdigest(),
        )
    )
    assert server.paths() == ["POST /tokenize", "GET /version", "GET /tokenizer_info"]


def test_a_server_without_those_routes_leaves_them_unknown(http_server: Any) -> None:
    server = http_server(vllm(version=False, tokenizer_info=False))
    (ref,) = describe(OpenAIEngine(server.url, "served", backoff=0.0, max_retries=3))
    assert (ref.mode, ref.version, ref.chat_template_sha256) == ("tokens", None, None)
    assert server.paths() == ["POST /tokenize", "GET /version", "GET /tokenizer_info"]  # no retry


def test_chat_mode_asks_nothing_more(http_server: Any) -> None:
    server = http_server(vllm(version=True, tokenizer_info=True))
    (ref,) = describe(OpenAIEngine(server.url, "gpt", mode="chat"))
    assert ref == SamplerRef(engine="openai", mode="chat", model="gpt")
    assert server.paths() == []
