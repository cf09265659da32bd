"""The other fields of a reply, besides its answer: every number and every ``Label: word``
field, and the extremes the calibration probes set them to.

The functions here take a reply whose answer is already marked out (see
:func:`envhub.audit.mutation.replace_answer`): the marker holds no digit and no letter, so the
answer is never one of its fields.

Extremes are the worst calibration the field's format allows: a number's are 0 and the top of
its apparent scale (1 for a value in [0, 1], a probability; 100 for a percentage or a value up
to 100; else the next power of ten); a word's are the two words of its pair (``no``/``yes``,
``low``/``high``, ...), and ``none``/``all`` for a word of no known pair.

:func:`set_all` sets every field at once (``ref:wrong-fields-low``, ``-high``);
:func:`set_one` sets a single one and leaves the others as the reference wrote them
(``ref:wrong-field-K-low``, ``-high``), which catches a reward that pays one field's extreme
only while another field is not at the same extreme (``Confidence: 0`` paid only beside
``Sure: yes``). The single fields are capped at :data:`MAX_FIELDS` a reply, the ``Label:``
lines first (what a reward most likely reads), then the other numbers from the reply's end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_FIELDS = 6
"""At most this many fields of a reply are probed one at a time (two probes each)."""

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")
_LABELLED = re.compile(
    r"(?m)^[^\S\n]*[A-Za-z][\w -]{0,30}:[^\S\n]*(?P<value>[A-Za-z]+|-?\d+(?:\.\d+)?)%?[^\S\n]*$"
)
_LOW_HIGH = (
    ("low", "high"), ("no", "yes"), ("false", "true"), ("unsure", "sure"),
    ("uncertain", "certain"), ("unlikely", "likely"), ("none", "all"),
)  # fmt: skip


@dataclass(frozen=True)
class Field:
    """One field of a reply: where its value sits and the value as written."""

    start: int
    end: int
    text: str
    percent: bool = False
    """The value is followed by ``%``."""


def fields(marked: str) -> list[Field]:
    """Every field of ``marked`` in the order they are probed one at a time: the values of its
    ``Label: value`` lines (a word or a number) in order, then every other number from the
    reply's end back."""
    labelled = [
        _field(marked, m.start("value"), m.end("value")) for m in _LABELLED.finditer(marked)
    ]
    taken = {f.start for f in labelled}
    numbers = [
        _field(marked, *m.span()) for m in _NUMBER.finditer(marked) if m.start() not in taken
    ]
    return labelled + numbers[::-1]


def _field(marked: str, start: int, end: int) -> Field:
    return Field(start, end, marked[start:end], marked[end : end + 1] == "%")


def extreme(field: Field, high: bool) -> str:
    """What ``field`` is set to at its low or high extreme (see the module's docstring)."""
    if field.text[0].isalpha():
        return _word_extreme(field.text, high)
    if not high:
        return "0"
    value = abs(float(field.text))
    if value <= 1 and not field.percent:
        return "1"
    if value <= 100:
        return "100"
    return "1" + "0" * len(str(int(value)))


def _word_extreme(word: str, high: bool) -> str:
    for pair in _LOW_HIGH:
        if word.lower() in pair:
            chosen = pair[1] if high else pair[0]
            return chosen.capitalize() if word[0].isupper() else chosen
    return "all" if high else "none"


def set_all(marked: str, high: bool) -> str:
    """``marked`` with every field at its low or high extreme."""
    return _replace(marked, [(f, extreme(f, high)) for f in fields(marked)])


def set_one(marked: str, index: int, high: bool) -> str | None:
    """``marked`` with its ``index``-th field (:func:`fields`' order, below
    :data:`MAX_FIELDS`) at its low or high extreme and the others as written; ``None`` when it
    has no such field or the field is at that extreme already."""
    found = fields(marked)[:MAX_FIELDS]
    if index >= len(found):
        return None
    field = found[index]
    value = extreme(field, high)
    if _same(field.text, value):
        return None
    return _replace(marked, [(field, value)])


def _same(text: str, value: str) -> bool:
    """Whether the field already reads ``value`` (``1.0`` reads ``1``; ``Yes`` reads ``yes``)."""
    try:
        return float(text) == float(value)
    except ValueError:
        return text.lower() == value.lower()


def _replace(marked: str, changes: list[tuple[Field, str]]) -> str:
    """``marked`` with each field's value replaced, from the end so the spans hold."""
    for field, value in sorted(changes, key=lambda c: c[0].start, reverse=True):
        marked = marked[: field.start] + value + marked[field.end :]
    return marked


__all__ = ["MAX_FIELDS", "Field", "extreme", "fields", "set_all", "set_one"]
