"""Distillation's per-token advantages: the negative reverse KL to the teacher, per token.

For a token ``y_t`` the student sampled, ``log pi_teacher(y_t) - log pi_student(y_t)`` is a
one-sample estimate of the negative reverse KL at that place (its expectation under the
student is ``-KL(student || teacher)``). As an advantage it pushes up the tokens the teacher
likes more than the student does, and down the others; summed with the env's advantage it
mixes the two signals. Pure functions over plain lists and floats: unit-tested by hand.
"""

from __future__ import annotations

from collections.abc import Sequence


def distill_token_advantages(
    base: Sequence[float],
    teacher: Sequence[float | None],
    student: Sequence[float],
    mask: Sequence[int],
    weight: float,
    reward_weight: float = 1.0,
) -> list[float]:
    """Each token's advantage: ``reward_weight x base + weight x (teacher - student)`` where
    ``mask`` is 1 (a token the student sampled), 0 elsewhere.

    Args:
        base: The env's advantage of each token (the sequence's, broadcast, or per turn).
        teacher: The teacher's logprob of each token (``None`` where it scored none).
        student: The sampler's logprob of each token.
        mask: 1 on the tokens the student sampled.
        weight: The distillation coefficient.
        reward_weight: The env advantage's coefficient (0: distillation alone).

    Raises:
        ValueError: The teacher has no logprob for a sampled token, or the lengths differ.
    """
    if not len(base) == len(teacher) == len(student) == len(mask):
        raise ValueError("base, teacher, student and mask must be aligned token by token")
    out = []
    for t, (a, lt, ls, m) in enumerate(zip(base, teacher, student, mask, strict=True)):
        if not m:
            out.append(0.0)
            continue
        if lt is None:
            raise ValueError(f"the teacher has no logprob for sampled token {t}")
        out.append(reward_weight * a + weight * (lt - ls))
    return out


def reverse_kl_terms(
    teacher: Sequence[float | None], student: Sequence[float], mask: Sequence[int]
) -> list[float]:
    """``student - teacher`` at each sampled token: the per-token estimate of
    ``KL(student || teacher)`` (its mean is the ``distill/reverse_kl`` metric)."""
    return [
        ls - lt for lt, ls, m in zip(teacher, student, mask, strict=True) if m and lt is not None
    ]
