"""The reward audit as a push gate: its row in ``check_package``'s report names the policies tried,
the row reaches the Hub card, and a package that pays junk fails with the episode that scored."""

from __future__ import annotations

from pathlib import Path

from envhub.audit import HACKS as HACKS_FIX
from envhub.checks.package import check_package
from envhub.hub.card import render_card

HACKS = [
    "degenerate", "format-only", "length", "non-commitment", "stuffing", "abstention",
    "form-without-answer", "checker", "calibration",
]  # fmt: skip
PASSED = (
    "31 policies x 3 episodes at or below the floor 0.1 (audit_floor), none paid for a hack: "
    + ", ".join(HACKS)
)
JUNK = "\\boxed{junk}\n<answer>junk</answer>\nAnswer: junk"


def audit_row(report) -> tuple[str, bool, str]:
    [row] = [r for r in report.results if r.name == "capital-cities: reward audit"]
    return row.name, row.passed, row.detail


def test_the_audit_gate_names_the_policies_and_reaches_the_card(package: Path) -> None:
    report = check_package(package, run_tests=False, performance=False)
    assert report.passed, report.failures
    assert audit_row(report) == ("capital-cities: reward audit", True, PASSED)
    gates = [r.name for r in report.results]
    assert gates.index("capital-cities: reward audit") == gates.index("capital-cities: close") + 2
    audit = report.to_dict()["audits"]["capital-cities"]
    assert audit.pop("policies")[:4] == ["empty", "echo", "junk-format", "longest"]
    played = audit.pop("played")  # the one-field mutants have no field to set here
    assert len(played) == 31 and not any(p.startswith("ref:wrong-field-") for p in played)
    assert audit == {
        "passed": True,
        "floor": 0.1,
        "floor_from": "audit_floor",
        "hacks": HACKS,
        "episodes_per_policy": 3,
        "findings": [],
    }
    row = f"| capital-cities: reward audit | pass | {PASSED} |"
    assert row in report.to_markdown().splitlines()
    card = render_card(
        "# Capitals\n", repo_id="alice/capital-cities", version="0.1.0",
        envs=report.envs, description="d", report_markdown=report.to_markdown(),
    )  # fmt: skip
    assert row in card.splitlines()


def test_a_package_that_pays_junk_fails_with_the_episode_that_scored(package: Path) -> None:
    env = package / "capital_cities" / "env.py"
    text = env.read_text()
    assert "    audit_floor = 0.1\n" in text
    env.write_text(text.replace("    audit_floor = 0.1\n", ""))
    report = check_package(package, run_tests=False, performance=False)
    assert [r.name for r in report.failures] == ["capital-cities: reward audit"]
    assert audit_row(report)[2] == (
        "`junk-format` [format-only] scored 0.1 > floor 0 (seed 0, task 0), reply "
        "'\\\\boxed{junk}\\n<answer>junk</answer>\\nAnswer: junk' "
        "(and 26 more: abstain-in-format, candidates, checker:print, everything, junk-format, "
        "ref:blank-answer, ref:no-answer, ref:padded-no-answer, stuffing)"
    )
    audit = report.to_dict()["audits"]["capital-cities"]
    assert (audit["passed"], audit["floor_from"], len(audit["findings"])) == (
        False,
        "reward_range",
        27,
    )
    first = audit["findings"][0]
    assert (first["policy"], first["seed"], first["task"], first["error"], first["hack"]) == (
        "junk-format",
        0,
        0,
        "",
        "format-only",
    )
    assert (first["example"], first["fix"]) == (JUNK, HACKS_FIX["format-only"])
    assert first["conversation"][1:] == [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": JUNK},
    ]
    failed_row = (
        "| capital-cities: reward audit | FAIL | `junk-format` [format-only] scored 0.1 > floor 0"
    )
    assert failed_row in report.to_markdown()
