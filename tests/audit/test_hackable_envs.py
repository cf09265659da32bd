"""The audit against purposely hackable envs (:mod:`hackable_envs`), several per hack class,
written as a user would from the templates: each is flagged with its hack class, a reply that
scored and the fix; each honest twin (the reward fixed as the finding says) passes."""

from __future__ import annotations

import pytest

from envhub.audit import HACKS, audit_env
from envhub.sandbox import bwrap_problem

from .hackable_envs import HACKABLE, HONEST, SANDBOXED

NO_BWRAP = bwrap_problem()


def _params() -> list:
    marks = pytest.mark.skipif(NO_BWRAP is not None, reason=f"no bubblewrap here: {NO_BWRAP}")
    return [pytest.param(n, marks=[marks] if n in SANDBOXED else []) for n in HACKABLE]


@pytest.mark.parametrize("name", _params())
def test_each_hackable_env_is_flagged_with_its_hack_class(name: str):
    make, hack = HACKABLE[name]
    report = audit_env(make(), raise_on_failure=False)
    flagged = [f for f in report.findings if f.hack == hack]
    assert flagged, report.summary()
    first = flagged[0].to_dict()
    assert first["reward"] > first["baseline"] if first["baseline"] is not None else True
    assert first["example"] and first["fix"] == HACKS[hack]
    assert all(f.reward is not None for f in report.findings)  # no crash among them


@pytest.mark.parametrize("name", _params())
def test_each_honest_twin_passes(name: str):
    report = audit_env(HONEST[name](), raise_on_failure=False)
    assert report.passed, report.summary()


def test_the_catalog_covers_every_hack_class_several_times():
    per_class: dict[str, int] = {}
    for _, hack in HACKABLE.values():
        per_class[hack] = per_class.get(hack, 0) + 1
    assert per_class == {
        "non-commitment": 4,
        "stuffing": 4,
        "abstention": 2,
        "calibration": 2,
        "length": 3,
        "form-without-answer": 2,
        "checker": 5,
    }


def test_a_hedge_is_judged_against_the_same_hedge_without_the_answer():
    report = audit_env(HACKABLE["answer anywhere"][0](), raise_on_failure=False)
    hedge = next(f for f in report.findings if f.policy == "ref:candidates")
    assert (hedge.hack, hedge.reward, hedge.baseline) == ("non-commitment", 1.0, 0.0)
    assert (
        hedge.example == "The capital city is Tokyo, Paris, Nairobi.\nAnswer: Tokyo, Paris, Nairobi"
    )
    assert hedge.compared_with == (
        "`ref:candidates-decoys` (the same reply with a wrong answer in the answer's place)"
    )


def test_abstaining_is_judged_against_a_wrong_attempt_on_average():
    report = audit_env(HACKABLE["declared honesty"][0](), raise_on_failure=False)
    assert [(f.policy, f.hack, f.reward, f.baseline) for f in report.findings] == [
        ("abstain", "abstention", pytest.approx(0.2), 0.0),
        ("abstain-in-format", "abstention", pytest.approx(0.2), 0.0),
    ]
    assert report.findings[0].describe(report.floor) == (
        "`abstain` [abstention] scored 0.2 > `ref:wrong` (a genuine wrong attempt, on average) 0 "
        '(seed 0, task 0), reply "I don\'t know. I am not able to answer this with confidence."'
    )


def test_a_wrong_answer_that_buys_its_pay_back_through_its_confidence_is_named():
    # What the audit missed: a Brier-style reward, where "wrong, confidence 0" scores 1.
    report = audit_env(HACKABLE["brier alone"][0](), raise_on_failure=False)
    # Every field low pays, and so does the confidence alone (field 2, after `Sure:`).
    assert [(f.policy, f.hack, f.reward, f.baseline) for f in report.findings] == [
        ("ref:wrong-fields-low", "calibration", 1.0, 0.0)
    ] * 3 + [("ref:wrong-field-2-low", "calibration", 1.0, 0.0)] * 3
    assert report.findings[0].describe(report.floor) == (
        "`ref:wrong-fields-low` [calibration] scored 1 > `ref:wrong` (the same wrong answer with "
        "the reply's own fields) 0 "
        r"(seed 0, task 0), reply 'The capital city is Tokyo.\nAnswer: Tokyo\nSure: no\n"
        r"Confidence: 0'"
    )
    # "Sure: no" pays a wrong answer in full (and the reward's own words pay: stuffing too).
    doubt = audit_env(HACKABLE["honest about doubt"][0](), raise_on_failure=False)
    assert {(f.policy, f.hack) for f in doubt.findings} == {
        ("ref:wrong-fields-low", "calibration"),
        ("ref:wrong-field-1-low", "calibration"),
        ("stuffing", "stuffing"),
    }


def test_pay_for_calibration_on_a_wrong_answer_is_flagged_unless_declared_as_the_floor():
    from envhub import Rubric, reward

    from .hackable_envs import SureCapitals, brier, right

    @reward
    def half_calibrated(response: str, answer: str) -> float:
        return 0.5 * float(right(response, answer)) + 0.5 * brier.fn(response, answer)

    report = audit_env(SureCapitals(Rubric([half_calibrated])), raise_on_failure=False)
    assert {(f.policy, f.hack, f.reward, f.baseline) for f in report.findings} == {
        ("ref:wrong-fields-low", "calibration", 0.5, 0.0),
        ("ref:wrong-field-2-low", "calibration", 0.5, 0.0),
    }
    declared = audit_env(SureCapitals(Rubric([half_calibrated]), 0.5), raise_on_failure=False)
    assert declared.passed, declared.summary()
