"""``rollout.max_tokens`` against the shortest tool call of each env: the call as the model
writes it, the two warnings, and the dry run that says so (what a new user's own tool env
trained with the quickstart's 32 tokens never learned)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from envhub.cli.app import app
from envhub.trainer.tool_budget import HARNESS_TOOL, call_budget_warning, call_text
from tests.file_envs import LOOKUP_SUM

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"

SCHEMA = {
    "type": "function",
    "function": {
        "name": "book",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "nights": {"type": "integer"},
                "late": {"type": ["null", "boolean"]},
                "room": {"enum": ["single", "double"]},
                "note": {"type": "string"},
            },
            "required": ["city", "nights", "late", "room"],
        },
    },
}


def words(text: str) -> int:
    return len(text.split())


def test_a_call_has_placeholders_for_the_required_arguments_only() -> None:
    assert call_text(SCHEMA) == (
        '<tool_call>\n{"name": "book", "arguments": {"city": "example", "nights": 42, '
        '"late": true, "room": "single"}}\n</tool_call>'
    )
    assert call_text(HARNESS_TOOL) == (
        '<tool_call>\n{"name": "tool", "arguments": {"input": "example"}}\n</tool_call>'
    )


@pytest.mark.parametrize(
    ("max_tokens", "expected"),
    [
        (26, None),  # twice the 13 words of the call
        (
            25,
            "rollout.max_tokens is 25, but its shortest tool call, with placeholder arguments, in "
            "hotel takes 13 tokens: a call with real arguments, or any text before it, would be "
            "cut off; set rollout.max_tokens=64 or more",
        ),
        (
            12,
            "rollout.max_tokens is 12, but its shortest tool call, with placeholder arguments, in "
            "hotel takes 13 tokens: every call would be cut off; set rollout.max_tokens=64 or more",
        ),
    ],
)
def test_the_warning_says_what_is_cut_off(max_tokens: int, expected: str | None) -> None:
    assert call_budget_warning("hotel", [SCHEMA], max_tokens, words) == expected


def test_an_env_without_tools_needs_no_room_and_a_harness_env_is_measured_by_a_short_call() -> None:
    assert call_budget_warning("plain", [], 1, words) is None
    assert call_budget_warning("agent", [], 5, words, from_program=True) == (
        "rollout.max_tokens is 5, but a tool call with one short argument (its program's tools "
        "are only known when it runs) in agent takes 7 tokens: every call would be cut off; set "
        "rollout.max_tokens=64 or more"
    )


def test_the_dry_run_warns_of_the_quickstarts_32_tokens_for_a_tool_env(smollm2_dir: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(
        app, ["train", str(QUICKSTART), f"envs.0.name={LOOKUP_SUM}", "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    # lookup(item) is the shorter call: 28 of SmolLM2's tokens with "example" as its item.
    assert (
        f"warning: rollout.max_tokens is 32, but its shortest tool call, with placeholder "
        f"arguments, in {LOOKUP_SUM} takes 28 tokens: a call with real arguments, or any text "
        "before it, would be cut off; set rollout.max_tokens=128 or more"
    ) in output
    fits = runner.invoke(
        app,
        [
            "train",
            str(QUICKSTART),
            f"envs.0.name={LOOKUP_SUM}",
            "rollout.max_tokens=56",
            "--dry-run",
        ],
    )
    assert fits.exit_code == 0 and "warning: rollout.max_tokens" not in fits.output
