"""``envhub check`` names causes, through the CLI on packages written by ``envhub init``.

Each test breaks a scaffolded package the way a user did and reads the gate's line in the table:
a reward returning ``"yes"`` was reported only as "the reference policy scored 0.0"; a dataset
row without an answer passed every gate with the default seeds (they drew 3 of 20 tasks); a
game row without a field passed unless a seed drew it. The last test checks an installed env
by name, whose bad row is named as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import envhub
from envhub import registry
from envhub.cli.app import app
from envhub.cli.console import console
from envhub.env import SingleTurnEnv
from envhub.errors import EnvLoadError
from envhub.rewards.match import exact_match
from envhub.rewards.rubric import Rubric
from envhub.scaffold import module_name

runner = CliRunner()

SUMS = """TASKS: list[dict[str, Any]] = [
    {"question": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(20)
]
"""
SOLVE_SUMS = """    left, right = re.findall(r"\\d+", messages[-1].content)
    return f"Answer: {int(left) + int(right)}"
"""
SAYS_YES = '''@reward
def correct(response: str) -> float:
    """1 for a right answer, meant to be; it returns "yes"."""
    return "yes"


'''


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unload: list[str]):
    """``package(name, template)``: a package from ``envhub init``, its env module's path."""
    # One table row per line: the shared console keeps the width it read at import.
    monkeypatch.setattr(console, "_width", 400)

    def make(name: str, template: str) -> tuple[Path, Path]:
        unload.append(module_name(name))
        made = runner.invoke(app, ["init", name, "-t", template, "--dir", str(tmp_path)])
        assert made.exit_code == 0, made.output
        return tmp_path / name, tmp_path / name / module_name(name) / "env.py"

    return make


def edit(path: Path, old: str, new: str) -> None:
    """Replace ``old`` (which must be in the file: a template change should fail here)."""
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def replace_block(path: Path, start: str, end: str, new: str) -> None:
    """Replace the lines from the one starting with ``start`` up to ``end`` (included)."""
    text = path.read_text()
    first = text.index(start)
    path.write_text(text[:first] + new + text[text.index(end, first) + len(end) :])


def gates(*args: str) -> tuple[int, dict[str, tuple[str, str]]]:
    """Run ``envhub check ARGS``; its exit code and each gate's (result, detail)."""
    result = runner.invoke(app, ["check", *args, "--no-tests"])
    rows = [line.split("│")[1:4] for line in result.output.splitlines() if line.startswith("│")]
    return result.exit_code, {g.strip(): (r.strip(), d.strip()) for g, r, d in rows}


def sums_package(package) -> tuple[Path, Path]:
    """The single-turn template made into 20 sums, its reference adding the two numbers."""
    root, env = package("sums", "single-turn")
    replace_block(env, "TASKS: list", "]\n", SUMS)
    edit(env, '_ANSWERS = {task["question"]: task["answer"] for task in TASKS}\n', "")
    edit(env, '    return f"Answer: {_ANSWERS[messages[-1].content]}"\n', SOLVE_SUMS)
    edit(env, "from typing import Any", "import re\nfrom typing import Any")
    return root, env


def test_a_reward_that_returns_yes_is_named_before_the_score(package) -> None:
    root, env = package("yes-env", "single-turn")
    edit(
        env,
        "from envhub import Rubric, SingleTurnEnv",
        "from envhub import Rubric, SingleTurnEnv, reward",
    )
    edit(env, "class YesEnv(", SAYS_YES + "class YesEnv(")
    edit(env, "Rubric([exact_match(weight=0.9), has_answer(weight=0.1)])", "Rubric([correct])")
    code, found = gates(str(root))
    assert code == 1
    assert {gate: detail for gate, (result, detail) in found.items() if result == "fail"} == {
        "yes-env: reference policy at top": "reward `correct` raised TypeError: correct returned "
        "'yes'; a reward must be a finite number — seed 0, task 0: the reference policy scored "
        "0.0; it must score the top of reward_range, 1.0"
    }


@pytest.mark.parametrize("seeds", [[], ["--seeds", "20"]], ids=["default-seeds", "20-seeds"])
def test_a_row_without_an_answer_is_named_with_any_seeds(package, seeds: list[str]) -> None:
    root, env = sums_package(package)
    assert gates(str(root), *seeds)[0] == 0  # every row answered: every gate passes
    edit(env, SUMS, SUMS + 'del TASKS[3]["answer"]\n')
    code, found = gates(str(root), *seeds)
    assert code == 1
    assert found["entry points"] == (
        "fail",
        "env 'sums' (sums.env:SumsEnv) cannot be constructed: sums: task 3 has no 'answer', "
        "needed by the reward `exact_match`",
    )


def test_check_seeds_cover_the_task_set(package) -> None:
    root, _ = sums_package(package)
    for seeds, tasks in [("3", "0, 9, 19"), ("5", "0, 4, 9, 14, 19")]:
        code, found = gates(str(root), "--seeds", seeds)
        assert (code, found["sums: reset"]) == (0, ("ok", f"{seeds} seeds on tasks {tasks} of 20"))


def test_a_game_row_without_a_field_fails_the_dataset_gate(package) -> None:
    root, env = package("games", "multi-turn")
    edit(env, '{"low": 100, "high": 200, "max_guesses": 7}', '{"low": 100, "max_guesses": 7}')
    code, found = gates(str(root))
    assert code == 1
    assert {gate: detail for gate, (result, detail) in found.items() if result == "fail"} == {
        "games: dataset": "task 3: format_prompt raised KeyError: 'high'",
        "games: no answer leak": "task 3: reset raised KeyError: 'high'",
    }


class BrokenSums(SingleTurnEnv):
    """Ten sums, the fourth without its answer."""

    name = "broken-sums"

    def load_dataset(self) -> list[dict[str, Any]]:
        rows = [{"question": f"{i} + {i}", "answer": str(2 * i)} for i in range(10)]
        del rows[3]["answer"]
        return rows

    def default_rubric(self) -> Rubric:
        return Rubric([exact_match()])


def test_an_installed_env_with_a_bad_row_is_named_too() -> None:
    envhub.register(BrokenSums.name, BrokenSums, override=True)
    try:
        result = runner.invoke(app, ["check", BrokenSums.name])
    finally:
        registry._registered.pop(BrokenSums.name, None)
    assert (result.exit_code, type(result.exception)) == (1, EnvLoadError)
    assert str(result.exception) == (
        "env 'broken-sums' cannot be constructed: broken-sums: task 3 has no 'answer', "
        "needed by the reward `exact_match`"
    )


def test_a_package_is_checked_locally_unless_publish(package) -> None:
    root, env = sums_package(package)
    (root / "README.md").unlink()  # a publishing gate's concern, not the env's
    edit(env, 'version = "0.1.0"', 'version = "9.9.9"')
    result = runner.invoke(app, ["check", str(root)])
    assert result.exit_code == 0, result.output
    cells = [line.split("│")[1:3] for line in result.output.splitlines() if line.startswith("│")]
    found = {gate.strip(): outcome.strip() for gate, outcome in cells}
    assert {gate: outcome for gate, outcome in found.items() if outcome != "ok"} == {
        "metadata": "skipped",
        "sums: version": "skipped",
        "sums: performance": "skipped",
        "package tests": "skipped",
    }
    assert result.output.splitlines()[-1] == (
        "Local check: skipped the publishing gates (metadata, sums: version, sums: performance, "
        f"package tests); `envhub check {root} --publish` runs them, as `envhub push` does."
    )
    code, published = gates(str(root), "--publish")
    assert code == 1
    assert {gate: detail for gate, (outcome, detail) in published.items() if outcome == "fail"} == {
        "metadata": "README.md is missing; it becomes the Hub card",
        "sums: version": "SumsEnv.version is '9.9.9' but pyproject.toml says '0.1.0'; "
        "make them agree",
    }
