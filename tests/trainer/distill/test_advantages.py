"""Distillation's per-token advantages and its coefficient's schedule, by hand."""

from __future__ import annotations

import math

import pytest

from envhub.trainer.distill.advantages import distill_token_advantages, reverse_kl_terms
from envhub.trainer.distill.config import DistillConfig, TeacherConfig

LN = math.log


def test_each_sampled_token_gets_the_teachers_logprob_minus_the_students() -> None:
    # tokens: prompt, prompt, sampled, sampled, tool reply, sampled
    mask = [0, 0, 1, 1, 0, 1]
    teacher = [None, LN(0.5), LN(0.5), LN(0.1), LN(0.9), LN(0.8)]
    student = [0.0, 0.0, LN(0.25), LN(0.4), 0.0, LN(0.8)]
    base = [0.7] * 6  # the env's advantage of the sequence, broadcast
    got = distill_token_advantages(base, teacher, student, mask, weight=2.0, reward_weight=0.5)
    assert got == pytest.approx([0.0, 0.0, 0.35 + 2 * LN(2), 0.35 + 2 * LN(0.25), 0.0, 0.35 + 0.0])
    alone = distill_token_advantages(base, teacher, student, mask, weight=1.0, reward_weight=0.0)
    assert alone == pytest.approx([0.0, 0.0, LN(2), LN(0.25), 0.0, 0.0])
    # KL(student || teacher) per sampled token: student - teacher
    assert reverse_kl_terms(teacher, student, mask) == pytest.approx([LN(0.5), LN(4), 0.0])


def test_per_turn_base_advantages_are_kept_per_token() -> None:
    got = distill_token_advantages(
        [0.0, 1.0, -1.0], [None, -1.0, -2.0], [0.0, -1.5, -1.0], [0, 1, 1], weight=1.0
    )
    assert got == pytest.approx([0.0, 1.5, -2.0])


def test_a_sampled_token_without_a_teacher_logprob_is_an_error() -> None:
    with pytest.raises(ValueError, match="no logprob for sampled token 1"):
        distill_token_advantages([0.0, 0.0], [None, None], [0.0, 0.0], [0, 1], weight=1.0)
    with pytest.raises(ValueError, match="aligned"):
        distill_token_advantages([0.0], [None, None], [0.0, 0.0], [0, 1], weight=1.0)


def _distill(**kwargs: object) -> DistillConfig:
    return DistillConfig(teacher=TeacherConfig(kind="server", url="http://x"), **kwargs)


def test_the_coefficient_anneals_from_weight_to_final_weight() -> None:
    linear = _distill(weight=1.0, final_weight=0.0, schedule="linear")
    assert [linear.weight_at(u, 5) for u in range(5)] == pytest.approx([1, 0.75, 0.5, 0.25, 0])
    cosine = _distill(weight=1.0, final_weight=0.2, schedule="cosine")
    assert cosine.weight_at(0, 3) == pytest.approx(1.0)
    assert cosine.weight_at(1, 3) == pytest.approx(0.6)  # half way: (1 + cos(pi/2)) / 2 = 0.5
    assert cosine.weight_at(2, 3) == pytest.approx(0.2)
    assert _distill(weight=0.3).weight_at(7, 10) == 0.3
    assert linear.weight_at(0, 1) == 1.0  # one RL step: the first weight


def test_the_config_says_what_each_teacher_needs() -> None:
    with pytest.raises(ValueError, match="needs url"):
        TeacherConfig(kind="server")
    with pytest.raises(ValueError, match="needs model"):
        TeacherConfig(kind="local")
    with pytest.raises(ValueError, match="is the student itself"):
        TeacherConfig(kind="self")
    with pytest.raises(ValueError, match="url and api_key are a server's"):
        TeacherConfig(kind="local", model="m", url="http://x")
    with pytest.raises(ValueError, match="give both"):
        _distill(final_weight=0.0)
    with pytest.raises(ValueError, match="teaches nothing"):
        _distill(weight=0.0)
