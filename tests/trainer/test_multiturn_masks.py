"""Multi-turn, tool-using episodes reach the loss token for token as sampled.

The calculator env's reference policy calls its tool, reads the result and answers; its turns
are "sampled" as SmolLM2 token ids (text + ``<|im_end|>``). The test rebuilds, independently,
where each sampled span must sit in the episode (the chat-template render of the conversation
up to that turn) and checks the loss mask and the micro-batch's shifted mask position by position.
SmolLM2's template ignores ``tools``, so the runner lists them in the system prompt; the
rebuilt renders do the same (``with_tools_in_system``), as the model saw them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

import envhub
from envhub.envs.calculator import reference_policy
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ScriptedEngine
from envhub.tools.prompt import tools_prompt, with_tools_in_system
from envhub.trainer.batch import build_batch, collate
from envhub.trainer.config import AlgorithmConfig
from envhub.trainer.engines.hf import HFChatTokenizer


class SampledAsTokens(HFChatTokenizer):
    """SmolLM2's chat template plus what ScriptedEngine needs to emit token ids."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer, max_length=4096)
        self.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


@pytest.fixture(scope="module")
def episode(smollm2_dir: Path) -> tuple[Any, SampledAsTokens]:
    tokenizer = SampledAsTokens(AutoTokenizer.from_pretrained(smollm2_dir))
    engine = ScriptedEngine(reference_policy, tokenizer=tokenizer)
    runner = RolloutRunner(engine, lambda: envhub.make("calculator"), max_concurrency=1, seed=5)
    [trajectory] = asyncio.run(runner.run([2], samples_per_task=1))
    return trajectory, tokenizer


def expected_mask(trajectory: Any, tokenizer: SampledAsTokens) -> list[int]:
    """1 exactly on each assistant turn's tokens, located by rendering the history before it."""
    mask = [0] * len(trajectory.token_ids)
    for k, message in enumerate(trajectory.messages):
        if message.role != "assistant":
            continue
        seen = with_tools_in_system(trajectory.messages[:k], trajectory.tools)
        start = len(tokenizer.render_sync(seen, None, add_generation_prompt=True))
        span = tokenizer.encode(message.content) + [tokenizer.eos_token_id]
        assert trajectory.token_ids[start : start + len(span)] == span, (
            f"turn at message {k} is not where the template puts it"
        )
        mask[start : start + len(span)] = [1] * len(span)
    return mask


def test_the_episode_uses_the_tool_and_is_solved(episode: tuple[Any, SampledAsTokens]) -> None:
    trajectory, _ = episode
    roles = [m.role for m in trajectory.completion]
    assert roles.count("tool") >= 1 and roles[-1] == "assistant"
    assert trajectory.reward == 1.0 and trajectory.ok and not trajectory.token_drift


def test_smollm2_template_drops_tools_so_the_system_prompt_lists_them(
    episode: tuple[Any, SampledAsTokens],
) -> None:
    trajectory, tokenizer = episode
    messages = trajectory.messages[: trajectory.prompt_length]
    # What a user saw: SmolLM2's template renders the same prompt with or without tools.
    assert tokenizer.render_sync(messages, trajectory.tools, True) == tokenizer.render_sync(
        messages, None, True
    )
    prompt = tokenizer.decode(trajectory.token_ids[: trajectory.prompt_token_count])
    system_prompt = trajectory.messages[0].content
    listed = tools_prompt(trajectory.tools, system_prompt)
    assert prompt.startswith(f"<|im_start|>system\n{system_prompt}\n\n{listed}<|im_end|>\n")
    assert '"name": "calculate"' in listed and "To call a tool" not in listed  # hint once


def test_loss_mask_is_one_exactly_on_sampled_tokens(episode: tuple[Any, SampledAsTokens]) -> None:
    trajectory, tokenizer = episode
    mask = expected_mask(trajectory, tokenizer)
    assert trajectory.loss_mask == mask
    sampled = tokenizer.decode([i for i, m in zip(trajectory.token_ids, mask, strict=True) if m])
    turns = [m.content for m in trajectory.completion if m.role == "assistant"]
    assert sampled == "".join(f"{text}<|im_end|>" for text in turns)  # the turns and nothing else
    assert len(turns) >= 2


def test_micro_batch_targets_carry_the_mask_shifted_by_one(
    episode: tuple[Any, SampledAsTokens],
) -> None:
    trajectory, tokenizer = episode
    other = trajectory.model_copy(update={"reward": 0.0, "sample_index": 1})
    batch = build_batch([trajectory, other], AlgorithmConfig(), max_tokens=512)
    mb = collate(batch.samples, [0, 1], pad_id=0)
    mask = expected_mask(trajectory, tokenizer)
    for t in range(len(trajectory.token_ids) - 1):
        assert mb.loss_mask[0, t].item() == mask[t + 1], f"position {t}"
        assert mb.input_ids[0, t + 1].item() == trajectory.token_ids[t + 1]
    assert mb.loss_mask[0].sum().item() == sum(mask[1:])
