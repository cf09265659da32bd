"""``envhub check ENV --model M``: the env's scripted episodes rendered with M's chat template,
offline, before any GPU is spent. SmolLM2's template keeps every turn a prefix of the next; a
Qwen3-style template (built here, on SmolLM2's tokenizer: nothing is downloaded) drops the
reasoning of earlier turns, and the pre-flight shows it at the token where it starts."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import envhub
from envhub import registry
from envhub.checks.doctor import env_conversations
from envhub.cli.app import app
from envhub.cli.console import console
from envhub.multiturn import MultiTurnEnv
from envhub.rewards.rubric import Rubric, reward
from envhub.state import State
from envhub.types import AssistantTurn, Message, user

runner = CliRunner()

# Like Qwen3's: an assistant turn before the last user message loses its <think> block.
QWEN3_STYLE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}{%- set content = m.content -%}"
    "{%- if m.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1] -%}{%- endif -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@reward
def said_seven(response: str) -> float:
    """1 when the last reply ends with 7."""
    return float(response.strip().endswith("7"))


class Thinker(MultiTurnEnv):
    """Two turns; the scripted policy reasons in <think> before each answer."""

    name = "test-thinker"
    version = "0.0.1"
    default_max_turns = 2

    def load_dataset(self) -> list[dict[str, Any]]:
        """Four identical tasks."""
        return [{"question": "Pick a number.", "answer": "7"}] * 4

    def default_rubric(self) -> Rubric:
        """``said_seven``."""
        return Rubric([said_seven])

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        """Ask once more."""
        return [user("Again.")]

    @staticmethod
    def reference_policy(messages: list[Message], tools: Any) -> str:
        """Think, then say 7."""
        return "<think>Seven is lucky.</think>7"


@pytest.fixture
def thinker():
    envhub.register(Thinker.name, Thinker, override=True)
    yield Thinker.name
    registry._registered.pop(Thinker.name, None)


@pytest.fixture
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(console, "width", 200)


def _qwen3_style_model(smollm2_dir: Path, tmp_path: Path) -> Path:
    """SmolLM2's tokenizer and config (no weights) with the Qwen3-style template."""
    from transformers import AutoTokenizer

    folder = tmp_path / "model"
    shutil.copytree(smollm2_dir, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = QWEN3_STYLE
    tokenizer.save_pretrained(folder)
    return folder


def test_env_conversations_are_the_scripted_episodes_over_spread_tasks() -> None:
    with envhub.make("calculator", num_tasks=10) as env:
        conversations = env_conversations(env, episodes=3)
    assert list(conversations) == ["task 0", "task 4", "task 9"]
    messages, tools = conversations["task 4"]
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert tools is not None and tools[0]["function"]["name"] == "calculate"


def test_smollm2_keeps_every_turn_a_prefix(smollm2_dir, thinker, wide_console) -> None:
    model = smollm2_dir
    result = runner.invoke(app, ["check", thinker, "--model", str(model)])
    assert result.exit_code == 0, result.output
    assert (
        f"ok, {thinker} x {model} on 3 scripted episodes: every turn's prompt is an exact "
        "prefix of the next (6 turn boundaries checked)" in result.output
    )


def test_a_qwen3_style_template_is_caught_at_the_think_token(
    smollm2_dir: Path, tmp_path: Path, thinker: str, wide_console: None
) -> None:
    model = _qwen3_style_model(smollm2_dir, tmp_path)
    result = runner.invoke(app, ["check", thinker, "--model", str(model)])
    assert result.exit_code == 1, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("│ task")]
    cells = [[cell.strip() for cell in row.strip("│").split("│")] for row in rows]
    # Each episode's two turns, each found at the first token of its reply: the history had
    # "<think>", the next prompt (after a new user message) has the bare answer.
    from transformers import AutoTokenizer

    from envhub.trainer.engines.hf_tokenizer import HFChatTokenizer

    render = HFChatTokenizer(AutoTokenizer.from_pretrained(model)).render_sync
    with envhub.make(thinker) as env:
        messages, _ = env_conversations(env)["task 0"]
    replies = [i for i, m in enumerate(messages) if m.role == "assistant"]
    starts = [str(len(render(messages[:i], None, True))) for i in replies]
    assert [c[:3] for c in cells] == [
        [f"task {t}", str(turn), starts[turn]] for t in (0, 1, 3) for turn in (0, 1)
    ]
    assert all(
        c[3].startswith("'<think>Seven is") and c[4].startswith("'7<|im_end|>") for c in cells
    )
    assert "the template rewrites earlier turns" in result.output


def test_a_model_that_is_not_on_this_machine_fails_before_any_check(thinker: str) -> None:
    result = runner.invoke(app, ["check", thinker, "--model", "no-owner/no-such-model-here"])
    assert result.exception is not None
    assert str(result.exception) == (
        "the tokenizer of 'no-owner/no-such-model-here' is not on this machine (nothing is "
        "downloaded) — give a local folder or smollm2-135m (installed by the set-up), or fetch "
        "it first with `hf download no-owner/no-such-model-here`"
    )
