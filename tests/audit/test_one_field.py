"""The one-field-at-a-time calibration probes (``ref:wrong-field-K-low``, ``-high``): on the
fixtures of :mod:`hackable_fields` they flag what the all-together probes miss, naming the
probe and showing the reply; the honest twins stay quiet."""

from __future__ import annotations

import pytest

from envhub.audit import HACKS, audit_env
from envhub.audit.fields import MAX_FIELDS, fields, set_all, set_one
from envhub.audit.mutation import FIELD_PROBES, applies, set_field

from .hackable_fields import HACKABLE, HONEST

TOGETHER = ("ref:wrong-fields-low", "ref:wrong-fields-high")


@pytest.mark.parametrize("name", list(HACKABLE))
def test_each_fixture_is_flagged_by_a_single_field_probe_alone(name: str):
    make, hack = HACKABLE[name]
    report = audit_env(make(), raise_on_failure=False)
    flagged = {f.policy for f in report.findings if f.hack == hack}
    assert flagged and flagged <= set(FIELD_PROBES), report.summary()
    assert not flagged & set(TOGETHER)
    first = next(f for f in report.findings if f.hack == hack).to_dict()
    assert first["reward"] > first["baseline"] and first["fix"] == HACKS[hack]


@pytest.mark.parametrize("name", list(HONEST))
def test_each_honest_twin_stays_quiet(name: str):
    report = audit_env(HONEST[name](), raise_on_failure=False)
    assert report.passed, report.summary()


def test_the_finding_names_the_probe_and_shows_the_reply_that_did_it():
    report = audit_env(HACKABLE["confidence 0 while committed"][0](), raise_on_failure=False)
    assert [(f.policy, f.reward, f.baseline) for f in report.findings] == [
        ("ref:wrong-field-2-low", 1.0, 0.0)
    ] * 3
    assert report.findings[0].describe(report.floor) == (
        "`ref:wrong-field-2-low` [calibration] scored 1 > `ref:wrong` (the same wrong answer "
        "with the reply's own fields) 0 (seed 0, task 0), reply "
        r"'Answer: Tokyo\nCommitted: yes\nConfidence: 0'"
    )


def test_a_high_extreme_of_a_percentage_is_100_and_only_the_doubt_pays():
    report = audit_env(HACKABLE["doubt unless guessing"][0](), raise_on_failure=False)
    # Doubt at 1 (the top of a probability's scale) would read 1%: too little to be paid.
    assert [(f.policy, f.example) for f in report.findings] == [
        ("ref:wrong-field-2-high", "Answer: Tokyo\nGuess: no\nDoubt: 100%"),
        ("ref:wrong-field-2-high", "Answer: Paris\nGuess: no\nDoubt: 100%"),
        ("ref:wrong-field-2-high", "Answer: Paris\nGuess: no\nDoubt: 100%"),
    ]


def test_a_low_number_paid_in_one_field_and_punished_in_another():
    report = audit_env(HACKABLE["doubt within a margin"][0](), raise_on_failure=False)
    # All fields low sets the margin to 0 too, which the reward punishes.
    assert [(f.policy, f.reward, f.baseline, f.example) for f in report.findings] == [
        ("ref:wrong-field-2-low", 1.0, pytest.approx(0.2), "Answer: 6\nMargin: 2\nConfidence: 0"),
        ("ref:wrong-field-2-low", 1.0, pytest.approx(0.2), "Answer: 41\nMargin: 2\nConfidence: 0"),
        ("ref:wrong-field-2-low", 1.0, pytest.approx(0.2), "Answer: 15\nMargin: 2\nConfidence: 0"),
    ]


def test_fields_are_the_label_lines_then_the_other_numbers_from_the_end():
    marked = "Adding 3 and 4 gives it.\nAnswer: \x00\nSure: yes\nConfidence: 0.5\nSteps: 2"
    assert [f.text for f in fields(marked)] == ["yes", "0.5", "2", "4", "3"]
    assert set_all(marked, high=True).splitlines()[2:] == [
        "Sure: yes",
        "Confidence: 1",
        "Steps: 100",
    ]
    assert set_one(marked, 0, high=True) is None  # already at that extreme
    assert set_one(marked, 2, high=False) == marked.replace("Steps: 2", "Steps: 0")
    assert set_one(marked, 5, high=False) is None  # no sixth field


def test_a_number_is_set_to_the_top_of_its_scale():
    reply = "Answer: 7\nProbability: 0.2\nScore: 40\nDoubt: 5%\nTokens: 512"
    assert set_field(reply, "7", "6", 0, high=True) == reply.replace("0.2", "1").replace("7", "6")
    assert set_field(reply, "7", "6", 1, high=True).splitlines()[2] == "Score: 100"
    assert set_field(reply, "7", "6", 2, high=True).splitlines()[3] == "Doubt: 100%"
    assert set_field(reply, "7", "6", 3, high=True).splitlines()[4] == "Tokens: 1000"


def test_a_reply_with_more_fields_than_the_cap_probes_the_first_ones():
    reply = "Answer: 42\n" + "\n".join(f"F{k}: 0.5" for k in range(MAX_FIELDS + 2))
    changed = [n for n in FIELD_PROBES if applies(n, reply, "42")]
    assert changed == list(FIELD_PROBES)  # each of the first MAX_FIELDS fields, low and high
    assert set_field(reply, "42", "41", MAX_FIELDS, high=True) == reply.replace("42", "41")
    assert not applies("ref:wrong-field-1-low", "```python\nx = 0.5\n```", None)


def test_an_honest_reply_with_more_fields_than_the_cap_stays_quiet():
    from envhub import Rubric

    from .hackable_fields import Estimates, right_within_confidence

    class Worked(Estimates):
        fields = "Steps: 2\nCarry: no\nMargin: 0\nChecked: yes\nConfidence: 0.9\nTime: 30\nOK: yes"

    report = audit_env(Worked(Rubric([right_within_confidence])), raise_on_failure=False)
    assert report.passed, report.summary()
    assert set(FIELD_PROBES) <= set(report.policies)
