"""``envhub check NAME`` runs the reward audit on an installed env: a row in the table, and for
a failure the whole episode that scored, printed as plain text."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

import envhub
from envhub import registry
from envhub.cli.app import app
from envhub.cli.console import console
from envhub.env import SingleTurnEnv
from envhub.rewards.rubric import Rubric, reward

runner = CliRunner()


@reward
def pays_a_box(response: str) -> float:
    """1 for any ``\\boxed{}``: what the audit's junk-format policy writes."""
    return float("\\boxed{" in response)


class BoxPays(SingleTurnEnv):
    """Pays for the box, not for what is in it."""

    name = "box-pays"
    system_prompt = "Give the sum in [brackets] and \\boxed{}."

    def load_dataset(self) -> list[dict[str, Any]]:
        return [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(5)]

    def default_rubric(self) -> Rubric:
        return Rubric([pays_a_box])


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """One table row per line: the shared console keeps the width it read at import."""
    monkeypatch.setattr(console, "_width", 400)


@pytest.fixture
def box_pays() -> Iterator[str]:
    envhub.register(BoxPays.name, BoxPays, override=True)
    yield BoxPays.name
    registry._registered.pop(BoxPays.name, None)


def rows(output: str) -> dict[str, tuple[str, str]]:
    cells = [line.split("│")[1:4] for line in output.splitlines() if line.startswith("│")]
    return {name.strip(): (result.strip(), detail.strip()) for name, result, detail in cells}


def test_a_builtin_env_shows_the_audit_row(wide: None) -> None:
    result = runner.invoke(app, ["check", "arithmetic"])
    assert result.exit_code == 0, result.output
    assert rows(result.output)["reward audit"] == (
        "ok",
        "32 policies x 3 episodes at or below the floor 0.1 (audit_floor), none paid for a hack: "
        "degenerate, format-only, length, non-commitment, stuffing, abstention, cheat, "
        "form-without-answer, checker, calibration",
    )
    assert "The episode:" not in result.output


def test_a_hackable_env_fails_and_its_episode_is_printed(wide: None, box_pays: str) -> None:
    result = runner.invoke(app, ["check", box_pays])
    assert result.exit_code == 1
    table = rows(result.output)
    assert {name: ok for name, (ok, _) in table.items() if ok != "ok"} == {
        "reference policy at top": "skipped",  # it declares none
        "reward audit": "fail",
    }
    assert table["reward audit"][1].startswith(
        "`junk-format` [format-only] scored 1 > floor 0 (seed 0, task 0)"
    )
    episode = result.output.split("box-pays: reward audit: ", 1)[1]
    assert episode.splitlines() == [
        "`junk-format` [format-only] scored 1 > floor 0 (seed 0, task 0), reply "
        "'\\\\boxed{junk}\\n<answer>junk</answer>\\nAnswer: junk'. The episode:",
        "[system] 'Give the sum in [brackets] and \\\\boxed{}.'",
        "[user] 'What is 0 + 1?'",
        "[assistant] '\\\\boxed{junk}\\n<answer>junk</answer>\\nAnswer: junk'",
        "How to fix it: the reward pays for the answer's form with junk inside: pay for the form "
        "at most a small amount and declare it as the env's `audit_floor`, pay the rest only for "
        "a right answer.",
    ]
