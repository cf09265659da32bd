"""The report's series logic: identical series drawn once under a combined name, and an
all-zero chart given a range of its own instead of plotly's -1..1."""

from __future__ import annotations

from envhub.report.data import chart_specs
from envhub.report.series import ZERO_RANGE, all_zero, merge_identical, same_points, shape_chart


def series(name: str, y: list[float], x: list[int] | None = None) -> dict:
    return {"name": name, "x": x or list(range(1, len(y) + 1)), "y": y}


def test_identical_series_are_folded_into_the_first_under_both_names() -> None:
    loss = series("train/loss", [0.5, -0.25, 0.125])
    policy = series("train/policy_loss", [0.5, -0.25, 0.125])
    other = series("train/kl", [0.5, -0.25, 0.0])
    merged = merge_identical([loss, other, policy])
    assert [(s["name"], s["names"]) for s in merged] == [
        ("train/loss = train/policy_loss", ["train/loss", "train/policy_loss"]),
        ("train/kl", ["train/kl"]),
    ]
    assert [s["y"] for s in merged] == [[0.5, -0.25, 0.125], [0.5, -0.25, 0.0]]
    assert loss["name"] == "train/loss"  # the inputs are left as they were


def test_three_of_a_kind_and_float_rounding() -> None:
    a, b, c = series("a", [0.1 + 0.2]), series("b", [0.3]), series("c", [0.3])
    assert [s["name"] for s in merge_identical([a, b, c])] == ["a = b = c"]
    assert not same_points(series("a", [0.3]), series("b", [0.3001]))


def test_the_same_values_at_other_steps_are_another_series() -> None:
    shifted = [series("a", [1.0, 2.0], x=[1, 2]), series("b", [1.0, 2.0], x=[2, 3])]
    assert [s["name"] for s in merge_identical(shifted)] == ["a", "b"]


def test_an_all_zero_chart_gets_a_range_from_zero_and_a_note() -> None:
    both = [series("train/clip_frac", [0.0, 0.0]), series("train/clip_frac_low", [0, 0])]
    chart = {"title": "Clip fraction", "yaxis": "fraction", "series": both}
    shaped = shape_chart(chart)
    assert (shaped["yrange"], shaped["note"]) == (list(ZERO_RANGE), "all zero")
    assert [s["name"] for s in shaped["series"]] == ["train/clip_frac = train/clip_frac_low"]
    assert "yrange" not in chart  # the input is left as it was


def test_a_chart_with_any_nonzero_value_keeps_plotlys_range() -> None:
    assert not all_zero([series("a", [0.0, 0.0]), series("b", [0.0, 1e-9])])
    assert not all_zero([series("a", [])])
    shaped = shape_chart({"title": "t", "yaxis": "", "series": [series("a", [0.0, 2.0])]})
    assert "yrange" not in shaped and "note" not in shaped


def test_chart_specs_shape_every_chart() -> None:
    rows = [
        {"step": 1, "train/loss": 0.5, "train/policy_loss": 0.5, "train/clip_frac": 0.0},
        {"step": 2, "train/loss": 0.25, "train/policy_loss": 0.25, "train/clip_frac": 0.0},
    ]
    charts = {c["title"]: c for c in chart_specs(rows)}
    assert [s["name"] for s in charts["Loss"]["series"]] == ["train/loss = train/policy_loss"]
    assert "note" not in charts["Loss"]
    assert charts["Clip fraction"]["note"] == "all zero"


def test_a_warm_start_and_a_teacher_get_charts_of_their_own() -> None:
    rows = [
        {"step": 1, "train/loss": 0.7, "train/sft_nll": 0.7, "sft/epoch": 0.5},
        {"step": 2, "train/loss": 0.2, "train/sft_nll": 0.2, "sft/epoch": 1.0},
        {"step": 3, "train/loss": 0.1, "distill/weight": 1.0, "distill/reverse_kl": 0.3,
         "distill/teacher_logprob": -2.0},
    ]  # fmt: skip
    charts = {c["title"]: c for c in chart_specs(rows)}
    demos = charts["Demonstrations: negative logprob (warm start, supervised term) and epochs"]
    assert [(s["name"], s["x"]) for s in demos["series"]] == [
        ("train/sft_nll", [1, 2]), ("sft/epoch", [1, 2])
    ]  # fmt: skip
    teacher = charts["Distillation: reverse KL to the teacher and its coefficient"]
    assert [s["name"] for s in teacher["series"]] == ["distill/weight", "distill/reverse_kl"]
    assert charts["Loss"]["series"][0]["x"] == [1, 2, 3]  # both stages on one curve
