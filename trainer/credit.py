"""Which tokens each turn's reward belongs to, for per-turn credit (``algorithm.credit: turn``).

The runner records, per turn, the reward ``env.step`` returned (``TurnRecord.reward``) and the
number of tokens the policy sampled (``TurnRecord.completion_tokens``). The token record holds
those tokens in turn order, each turn's contiguous, marked 1 in ``loss_mask``; everything between
them (the template, the tool's reply, the env's message, the next generation prompt) is 0. So
turn ``k``'s tokens are the ``completion_tokens[k]`` loss tokens after the first ``sum of
completion_tokens[:k]`` ones: :func:`turn_spans`.

The per-turn rewards always add up to the episode reward the loss uses (the one ``credit:
episode`` uses): every turn but the last gets the reward its step returned, and the last turn
gets the rest, that is its own step's reward plus whatever no step returned: the rubric's score
of an episode the runner cut, group rewards and the overlong shaping (:func:`turn_rewards`).
A :class:`~envhub.env.TaskEnv` returns 0 before the last step, so there the last turn gets the
whole episode reward and the others 0.
"""

from __future__ import annotations

import torch

from envhub.types import Trajectory


def turn_spans(t: Trajectory) -> list[tuple[int, int]]:
    """``[start, end)`` of each turn's sampled tokens in ``t.token_ids`` (``start == end`` for a
    turn that sampled nothing). A trajectory without turn records is one turn from its first
    loss token to its last. For a trajectory with earlier segments, the spans of the turns of
    its own (last) record: :func:`record_turn_spans` has them all.

    Raises:
        ValueError: No token record, or the turns' token counts do not add up to the loss mask.
    """
    return record_turn_spans(t)[-1]


def record_turn_spans(t: Trajectory) -> list[list[tuple[int, int]]]:
    """The spans of every turn, per token record: ``t.segments`` in order, then ``t``'s own
    record (:func:`turn_spans`); the records' turns follow one another in ``t.turns``.

    Raises:
        ValueError: No token record, or the turns' token counts do not add up to the records'
            loss masks.
    """
    if t.loss_mask is None:
        raise ValueError("a trajectory without a token record has no turn spans")
    if not t.turns:
        positions = [i for i, m in enumerate(t.loss_mask) if m]
        return [[(positions[0], positions[-1] + 1)] if positions else []]
    counts = [turn.completion_tokens for turn in t.turns]
    where = f"trajectory of task {t.task_index} (sample {t.sample_index})"
    starts = [s.first_turn for s in t.segments]
    if t.segments:  # the last record starts after the turns that fill the last segment
        starts.append(_filled(counts, t.segments[-1].first_turn, t.segments[-1].loss_mask, where))
    bounds = [*starts[1:], len(counts)] if t.segments else [len(counts)]
    masks = [*(s.loss_mask for s in t.segments), t.loss_mask]
    firsts = starts if t.segments else [0]
    return [
        _spans(mask, counts[first:end], where)
        for mask, first, end in zip(masks, firsts, bounds, strict=True)
    ]


def _filled(counts: list[int | None], first: int, mask: list[int], where: str) -> int:
    """The index of the turn after those, from ``first`` on, whose tokens fill ``mask``."""
    need, k = sum(mask), first
    while need > 0 and k < len(counts) and counts[k] is not None:
        need -= counts[k] or 0
        k += 1
    if need != 0:
        raise ValueError(f"{where}: its turns' completion_tokens do not fill its segments")
    return k


def _spans(mask: list[int], counts: list[int | None], where: str) -> list[tuple[int, int]]:
    """The spans of turns of ``counts`` tokens each, laid on the 1s of ``mask`` in order."""
    positions = [i for i, m in enumerate(mask) if m]
    if any(c is None for c in counts) or sum(c or 0 for c in counts) != len(positions):
        raise ValueError(
            f"{where}: its turns' completion_tokens {counts} do not add up to its "
            f"{len(positions)} loss tokens, so no turn can be matched with its tokens "
            "(credit: turn needs the runner's record)"
        )
    spans, seen = [], 0
    for count in counts:
        assert count is not None
        if count == 0:
            at = positions[seen] if seen < len(positions) else len(mask)
            spans.append((at, at))
            continue
        start, end = positions[seen], positions[seen + count - 1] + 1
        if end - start != count:
            raise ValueError(f"turn tokens at {start}..{end} are not contiguous in the loss mask")
        spans.append((start, end))
        seen += count
    return spans


def turn_rewards(t: Trajectory, episode_reward: float) -> torch.Tensor:
    """``(turns,)`` float64 rewards of ``t``'s turns that sum to ``episode_reward``: each turn's
    step reward, the last turn taking the rest (see the module docstring). A trajectory without
    turn records is one turn worth ``episode_reward``."""
    earlier = [turn.reward for turn in t.turns[:-1]]
    return torch.tensor([*earlier, episode_reward - sum(earlier)], dtype=torch.float64)


def spread(spans: list[tuple[int, int]], values: torch.Tensor, length: int) -> list[float]:
    """A per-token list of ``length``: ``values[k]`` on turn ``k``'s span, 0.0 elsewhere."""
    out = [0.0] * length
    for (start, end), value in zip(spans, values.tolist(), strict=True):
        out[start:end] = [value] * (end - start)
    return out


def span_sums(spans: list[tuple[int, int]], per_token: torch.Tensor) -> torch.Tensor:
    """The sum of ``per_token`` over each span, as a ``(turns,)`` tensor."""
    return torch.stack([per_token[start:end].sum() for start, end in spans])
