"""Demonstrations rendered with the policy's template; each step's batch a pure function of the
seed and the step; conversations the template cannot render as one record left out, named."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from envhub.errors import ConfigError
from envhub.testing import ByteChatTokenizer
from envhub.trainer.sft.config import DemoSource, SFTConfig
from envhub.trainer.sft.demonstrations import load_demonstrations


def _file(tmp_path: Path, count: int, extra: list[dict] | None = None) -> Path:
    records = [
        {"messages": [{"role": "user", "content": f"q{i}"},
                      {"role": "assistant", "content": f"answer {i}"}]}
        for i in range(count)
    ] + (extra or [])  # fmt: skip
    path = tmp_path / "demos.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _load(path: Path, tokenizer: ByteChatTokenizer | None = None, seed: int = 0):
    tokenizer = tokenizer or ByteChatTokenizer()
    config = SFTConfig(sources=[DemoSource(path=path)], steps=1)
    return asyncio.run(load_demonstrations(config, tokenizer, [tokenizer.IM_END], seed))


def test_each_demonstration_trains_its_assistant_turn(tmp_path: Path) -> None:
    tok = ByteChatTokenizer()
    demos = _load(_file(tmp_path, 3), tok)
    assert len(demos) == 3
    first = demos.items[0]
    trained = [t for t, m in zip(first.token_ids, first.loss_mask, strict=True) if m]
    assert trained == tok.encode("answer 0") + [tok.IM_END]
    assert demos.trained_tokens == 3 * 9
    assert demos.describe().startswith("3 demonstrations (27 trained tokens) from ")


def test_batches_visit_every_demonstration_once_per_epoch_in_a_seeded_order(
    tmp_path: Path,
) -> None:
    demos = _load(_file(tmp_path, 5))
    stream = [d.origin for k in range(5) for d in demos.batch(k, 2)]  # 10 places: two epochs
    assert sorted(stream[:5]) == sorted(stream[5:]) == sorted(d.origin for d in demos.items)
    assert stream[:5] != stream[5:]  # each epoch its own permutation (for this seed)
    again = _load(_file(tmp_path, 5))
    assert [d.origin for k in range(5) for d in again.batch(k, 2)] == stream
    other_seed = _load(_file(tmp_path, 5), seed=1)
    assert [d.origin for k in range(5) for d in other_seed.batch(k, 2)] != stream
    # A batch later in the stream (RL's auxiliary term goes on after the warm start's steps).
    assert [d.origin for d in demos.batch(1, 3, start=4)] == stream[7:10]
    assert demos.steps_for(2.0, 3) == 4 and demos.steps_for(0.1, 8) == 1


class RewritingTokenizer(ByteChatTokenizer):
    """Drops an earlier assistant turn's text when a later turn follows (the prefix breaks)."""

    def render_sync(self, messages, tools, add_generation_prompt):  # type: ignore[no-untyped-def]
        assistants = [i for i, m in enumerate(messages) if m.role == "assistant"]
        keep = assistants[-1] if assistants and not add_generation_prompt else None
        shown = [
            m.model_copy(update={"content": "…"}) if m.role == "assistant" and i != keep else m
            for i, m in enumerate(messages)
        ]
        return super().render_sync(shown, tools, add_generation_prompt)


def test_a_conversation_the_template_rewrites_is_left_out_and_named(tmp_path: Path) -> None:
    two_turns = {
        "messages": [
            {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"},
        ]
    }  # fmt: skip
    demos = _load(_file(tmp_path, 2, [two_turns]), RewritingTokenizer())
    assert len(demos) == 2  # the one-turn conversations render; the two-turn one drifts
    assert [origin for origin, _ in demos.drifted] == ["demos.jsonl:3"]
    assert "1 left out: the chat template re-renders an earlier turn" in demos.describe()
    assert "first: demos.jsonl:3, turn 1" in demos.describe()


def test_nothing_left_to_train_on_is_an_error_that_says_why(tmp_path: Path) -> None:
    long = {"messages": [{"role": "user", "content": "x" * 50},
                         {"role": "assistant", "content": "y"}]}  # fmt: skip
    path = _file(tmp_path, 0, [long])
    tok = ByteChatTokenizer(max_length=40)
    with pytest.raises(ConfigError, match="no demonstration.*1 left out: longer than"):
        _load(path, tok)


def test_epochs_become_the_steps_they_make_in_the_runs_config(tmp_path: Path) -> None:
    from envhub.trainer.config import validate_config
    from envhub.trainer.sft.demonstrations import with_sft_steps

    demos = _load(_file(tmp_path, 5))
    config = validate_config({
        "envs": [{"name": "arithmetic"}], "steps": 3,
        "sft": {"sources": [{"path": str(tmp_path / "demos.jsonl")}], "epochs": 2, "batch_size": 3},
    })  # fmt: skip
    resolved = with_sft_steps(config, demos)
    assert (resolved.sft.steps, resolved.sft.epochs) == (4, None)  # ceil(2 x 5 / 3)
    assert resolved.total_steps == 7
    # What the run writes to config.json validates as it is.
    assert validate_config(resolved.model_dump(mode="json")).sft.steps == 4
