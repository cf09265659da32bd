"""A search that starts from the reference policy's replies and mutates them, looking for pay
without the answer.

Every turn, the env's ``reference_policy`` writes its reply; :func:`answer_slot` finds the
answer in it (the task's ``answer`` where the reply shows it, else the last ``\\boxed{}``,
answer tag, ``Label: value`` line or number; a reply of a few words is its own answer); a
:class:`Mutant` rewrites that slot. Tool calls and code blocks are left as they are (the
checker policies cover code). The mutations:

- **drop the answer, keep the form**: the slot holds junk (``ref:no-answer``) or nothing
  (``ref:blank-answer``), or junk plus padding (``ref:padded-no-answer``);
- **add candidates**: the answer among wrong ones (``ref:candidates`` ``d1, ANSWER, d2``,
  ``ref:either`` ``d1 or ANSWER or d2``, and ``ref:repeat``, the whole reply three times, one
  candidate each). Each is judged against its twin without the answer
  (``ref:candidates-decoys``, ...): same shape, the answer swapped for another wrong one, so
  a reward that reads a list's first or last item (as it may) scores both
  alike, and only pay for the answer's mere presence shows;
- **pad**: the reference reply with filler after it (``ref:padded``), judged against the
  reference itself: more pay for more text is a length hack;
- **a wrong attempt** (``ref:wrong``, the answer swapped for a wrong one): the baseline an
  abstention must not beat on average;
- **a wrong attempt whose other fields say so** (``ref:wrong-fields-low``, ``-high``): the
  answer swapped for a wrong one and every other number of the reply set to 0 (the top of its
  scale) and every other ``Label: word`` field to its low (high) word (:func:`set_fields`): a
  confidence, a score, a "sure: yes". They must not score above the floor and ``ref:wrong`` (a
  Brier-style reward gives a wrong answer at 0% confidence full marks);
- **the same, one field at a time** (``ref:wrong-field-K-low``, ``-high``, :data:`FIELD_PROBES`):
  the wrong answer with only the K-th other field at its extreme (:func:`set_field`; at most
  :data:`~envhub.audit.fields.MAX_FIELDS` fields), judged the same way: a reward that pays
  ``Confidence: 0`` only beside ``Sure: yes`` is paid by none of the two above.

Wrong candidates (:func:`decoys`) are the answer's numeric neighbours, else the options the
prompt names, else other tasks' answers. A mutant that changed nothing in an episode (no slot
in any turn) does not count, and one whose reference raises on a mutated conversation is
skipped (:class:`ProbeSkipped`): the reference is the author's helper, not the env under audit.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from envhub.audit.basic import JUNK, filler
from envhub.audit.fields import MAX_FIELDS, set_all, set_one
from envhub.audit.hedging import prompt_options
from envhub.env import Env, TaskEnv
from envhub.testing import Policy
from envhub.types import Message

PAD_WORDS = 300
"""Filler words the ``padded`` mutations add (fewer when the env's token budget is smaller)."""
_FALLBACK_DECOYS = ("alpha", "bravo", "charlie", "delta")
_SLOT_PATTERNS = (
    re.compile(r"\\boxed\{([^{}]*)\}"),
    re.compile(r"<(?!tool_call\b)([A-Za-z][\w-]*)>(?P<slot>[^<]*)</\1>"),
    re.compile(r"(?m)^[^\S\n]*[A-Za-z][\w ]{0,30}:[^\S\n]*(?P<slot>\S[^\n]*?)[^\S\n]*$"),
    re.compile(r"-?\d+(?:\.\d+)?"),
)
_INTEGER = re.compile(r"-?\d+")


class ProbeSkipped(Exception):
    """The probe cannot play this episode (the reference failed on a mutated conversation)."""


def answer_slot(reply: str, answer: Any = None) -> tuple[int, int] | None:
    """Where the answer sits in ``reply`` (start, end), or ``None`` when the reply is a tool
    call or code, or shows no answer."""
    if "<tool_call>" in reply or "```" in reply or not reply.strip():
        return None
    if answer is not None and str(answer).strip():
        found = list(_token(str(answer).strip()).finditer(reply))
        if found:
            return found[-1].span()
    for pattern in _SLOT_PATTERNS:
        found = list(pattern.finditer(reply))
        if found:
            group = "slot" if "slot" in pattern.groupindex else (1 if pattern.groups else 0)
            return found[-1].span(group)
    stripped = reply.strip()
    if len(stripped.split()) <= 3:
        start = reply.index(stripped)
        return start, start + len(stripped)
    return None


def decoys(value: str, messages: list[Message], others: list[str], count: int = 3) -> list[str]:
    """``count`` wrong answers of the same kind as ``value``: its neighbours for a whole
    number (``+1, -1, +2``), else the prompt's options, then ``others``, then fixed words."""
    if _INTEGER.fullmatch(value.strip()):
        n = int(value)
        return [str(n + d) for d in (-1, 1, 2, -2, 3)][:count]
    try:
        x = float(value)
    except ValueError:
        pool = [*prompt_options(messages), *others, *_FALLBACK_DECOYS]
        unlike = [w for w in dict.fromkeys(pool) if value.lower() not in w.lower()]
        return [w for w in unlike if w.lower() != value.strip().lower()][:count]
    return [f"{x + d:g}" for d in (-1, 1, 2, -2, 3)][:count]


Rewrite = Callable[[str, list[str]], str]
"""(the answer, decoys) -> what goes in the slot."""


class Mutant:
    """A policy: the reference's reply with its answer slot rewritten by ``rewrite``; or the
    whole reply rewritten by ``whole`` (for ``ref:repeat``, ``ref:padded``). With a ``name``
    of :data:`FIELD_PROBES`, a reply counts as changed only where :func:`applies`."""

    def __init__(
        self,
        env: Env,
        answer: Any,
        others: list[str],
        rewrite: Rewrite | None = None,
        whole: Callable[[str, str, list[str]], str] | None = None,
        name: str = "",
    ) -> None:
        self.reference = env.reference_policy
        self.name = name
        self.answer, self.others = answer, others
        self.rewrite, self.whole = rewrite, whole
        self.changed = False
        """True once a reply of this episode was rewritten."""

    def __call__(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        """The reference's reply, rewritten."""
        reply = guarded(self.reference)(messages, tools)
        slot = answer_slot(reply, self.answer)
        if slot is None:
            return reply
        value = reply[slot[0] : slot[1]]
        wrong = decoys(value, messages, self.others)
        self.changed |= applies(self.name, reply, self.answer)
        if self.whole is not None:
            return self.whole(reply, value, [value, *wrong])
        return replace_answer(reply, value, self.rewrite(value, wrong) if self.rewrite else value)


def guarded(reference: Policy) -> Policy:
    """``reference``, raising :class:`ProbeSkipped` instead of its own errors: the author's
    helper, confused by a mutated conversation, is not the env under audit (``check_env``
    checks the reference on its own)."""

    def play(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        try:
            return reference(messages, tools)
        except Exception as e:
            raise ProbeSkipped(f"the reference policy raised {type(e).__name__}: {e}") from e

    return play


def replace_answer(reply: str, value: str, content: str) -> str:
    """``reply`` with every occurrence of ``value`` (as a whole token) replaced by ``content``:
    the answer goes from the sentence before the ``Answer:`` line too."""
    if not value.strip():
        return reply
    return _token(value).sub(lambda m: content, reply)


def _token(value: str) -> re.Pattern[str]:
    """``value`` as a whole token: not inside a longer word or number (``1`` is not in ``115``
    nor in ``1.5``), a sentence's full stop allowed after it."""
    return re.compile(rf"(?<![\w])(?<!\d\.){re.escape(value)}(?![\w])(?!\.\d)")


def _repeat(reply: str, items: list[str], keep: bool) -> str:
    value, wrong = items[0], items[1:]
    order = [wrong[0], value if keep else wrong[2], wrong[1]]
    return "\n".join(replace_answer(reply, value, item) for item in order)


_MARK = "\x00answer\x00"


def set_fields(reply: str, value: str, wrong: str, high: bool) -> str:
    """``reply`` with its answer ``value`` replaced by ``wrong`` and every other number and
    ``Label: word`` field at its low or high extreme (:mod:`envhub.audit.fields`: 0 or the top
    of the number's scale; ``no`` or ``yes``, ...)."""
    return set_all(replace_answer(reply, value, _MARK), high).replace(_MARK, wrong)


def set_field(reply: str, value: str, wrong: str, index: int, high: bool) -> str:
    """``reply`` with its answer ``value`` replaced by ``wrong`` and its ``index``-th other
    field (:func:`~envhub.audit.fields.fields`) alone at its low or high extreme; only the
    answer replaced when it has no such field."""
    marked = replace_answer(reply, value, _MARK)
    return (set_one(marked, index, high) or marked).replace(_MARK, wrong)


FIELD_PROBES: dict[str, tuple[int, bool]] = {
    f"ref:wrong-field-{index + 1}-{'high' if high else 'low'}": (index, high)
    for index in range(MAX_FIELDS)
    for high in (False, True)
}
"""The one-field-at-a-time calibration probes: name -> (the field's index, high)."""


def applies(name: str, reply: str, answer: Any) -> bool:
    """Whether the mutant ``name`` rewrites the reference's ``reply``: it shows an answer and,
    for a :data:`FIELD_PROBES` mutant, has that field, not at that extreme already."""
    slot = answer_slot(reply, answer)
    if slot is None:
        return False
    if name not in FIELD_PROBES:
        return True
    index, high = FIELD_PROBES[name]
    return set_one(replace_answer(reply, reply[slot[0] : slot[1]], _MARK), index, high) is not None


def _pad(env: Env) -> Callable[[str], str]:
    def pad(reply: str) -> str:
        budget = env.remaining_tokens
        words = PAD_WORDS if budget is None else max(0, min(PAD_WORDS, budget - len(reply.split())))
        return f"{reply}\n\n{filler(words)}" if words else reply

    return pad


MUTANT_PREFIX = "ref:"
"""The names of the reference's mutants start with it."""


def mutants(env: Env, start: Any) -> dict[str, Mutant]:
    """Every mutant of ``env``'s reference policy for the episode ``start``, by policy name."""
    answer, others = task_answer(env, start), _other_answers(env, start)
    pad = _pad(env)

    def slot(rewrite: Rewrite) -> Mutant:
        return Mutant(env, answer, others, rewrite=rewrite)

    def whole(rewrite: Callable[[str, str, list[str]], str], name: str = "") -> Mutant:
        return Mutant(env, answer, others, whole=rewrite, name=name)

    def field(name: str, index: int, high: bool) -> Mutant:
        return whole(lambda r, v, i: set_field(r, v, i[1], index, high), name)

    return {
        "ref:no-answer": slot(lambda v, w: JUNK),
        "ref:blank-answer": slot(lambda v, w: ""),
        "ref:padded-no-answer": whole(lambda r, v, i: pad(replace_answer(r, v, JUNK))),
        "ref:candidates": slot(lambda v, w: f"{w[0]}, {v}, {w[1]}"),
        "ref:candidates-decoys": slot(lambda v, w: f"{w[0]}, {w[2]}, {w[1]}"),
        "ref:either": slot(lambda v, w: f"{w[0]} or {v} or {w[1]}"),
        "ref:either-decoys": slot(lambda v, w: f"{w[0]} or {w[2]} or {w[1]}"),
        "ref:repeat": whole(lambda r, v, i: _repeat(r, i, True)),
        "ref:repeat-decoys": whole(lambda r, v, i: _repeat(r, i, False)),
        "ref:wrong": slot(lambda v, w: w[0]),
        "ref:wrong-fields-low": whole(lambda r, v, i: set_fields(r, v, i[1], high=False)),
        "ref:wrong-fields-high": whole(lambda r, v, i: set_fields(r, v, i[1], high=True)),
        "ref:padded": whole(lambda r, v, i: pad(r)),
    } | {name: field(name, *where) for name, where in FIELD_PROBES.items()}


def task_answer(env: Env, start: Any) -> Any:
    """The ``answer`` of the task ``start`` is pinned to (``None`` without one)."""
    if not isinstance(env, TaskEnv) or start.task is None:
        return None
    row = env.dataset[start.task]
    return row.get("answer") if isinstance(row, dict) else None


def _other_answers(env: Env, start: Any, limit: int = 20) -> list[str]:
    """Answers of other tasks (the first ``limit`` rows): wrong answers of the right kind."""
    if not isinstance(env, TaskEnv):
        return []
    found = []
    for index in range(min(limit, len(env.dataset))):
        row = env.dataset[index]
        if index != start.task and isinstance(row, dict) and row.get("answer") is not None:
            found.append(str(row["answer"]))
    own = str(task_answer(env, start))
    return [a for a in dict.fromkeys(found) if a != own]


__all__ = [
    "FIELD_PROBES",
    "MUTANT_PREFIX",
    "Mutant",
    "task_answer",
    "ProbeSkipped",
    "answer_slot",
    "applies",
    "decoys",
    "mutants",
]
