"""The audit's catalog: every policy it plays (:class:`Probe`) and what each is judged against.

A probe is judged against the floor (nothing it writes may score above it), or is a baseline
that others are compared with. A :class:`Contrast` compares two probes on the same episodes:
the answer among decoys against the decoys alone (non-commitment), the padded reference against
the reference (length), an abstention against a genuine wrong attempt, on average, and a wrong
answer whose other fields are set to an extreme (a confidence of 0), all together or one at a
time, against the same wrong answer with the reference's fields (calibration).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envhub.audit import basic, checker_hacks, hedging, stuffing
from envhub.audit.mutation import FIELD_PROBES, guarded, mutants
from envhub.env import Env
from envhub.testing import Policy, null_policy

CHEAT_PREFIX = "cheat:"
"""Prefix of the env's own cheats in the report, to tell them from the built-in policies."""


@dataclass(frozen=True)
class Probe:
    """A policy the audit plays on every audited episode (the ``checker:`` programs are judged
    by :class:`Contrast` against ``checker:noop``, not against the floor alone)."""

    name: str
    hack: str
    """The hack class it tries (a key of :data:`envhub.audit.report.HACKS`)."""
    make: Callable[[Env, Any], Policy]
    """``(env, start) -> policy`` for one episode (a mutant is made afresh for each)."""
    floor: bool = True
    """Judged against the floor; ``False`` for a baseline that only contrasts use."""


@dataclass(frozen=True)
class Contrast:
    """``probe`` must not score above ``baseline`` on the same episode (or on average)."""

    probe: str
    baseline: str
    hack: str
    words: str
    """What the baseline is, for the finding's text."""
    mean: bool = False
    """Compare the averages over the audited episodes instead of each episode."""
    above_floor: bool = False
    """Count a win only when the probe also scored above the floor."""


def _fixed(policy: Policy) -> Callable[[Env, Any], Policy]:
    return lambda env, start: policy


def _mutant(name: str) -> Callable[[Env, Any], Policy]:
    return lambda env, start: mutants(env, start)[name]


def degenerate_policies(env: Env) -> dict[str, Policy]:
    """The policies that do not depend on the episode, by name, in the order the audit plays
    them: the built-in ones (the tool ones only when the env has tools), then the env's own
    cheats."""
    programs = checker_hacks.checker_programs(env)
    policies: dict[str, Policy] = {"empty": null_policy, "echo": basic.echo_prompt}
    policies["junk-format"] = basic.junk_in_format
    if env.tool_schemas:
        policies["junk-tools"] = basic.junk_tool_calls
    policies.update(
        {
            "longest": basic.longest_output(env),
            "shortest": basic.shortest,
            "numbers": basic.question_numbers,
            "everything": basic.everything,
            "candidates": hedging.candidates,
            "keywords": stuffing.keywords_policy(env),
            "stuffing": stuffing.stuffing_policy(env),
            "abstain": basic.abstain,
            "abstain-in-format": basic.abstain_in_format,
        }
    )
    policies.update({f"checker:{n}": checker_hacks.fenced_policy(p) for n, p in programs.items()})
    if env.tool_schemas:
        policies["tool-hacks"] = checker_hacks.tool_hacks_policy(programs)
    for name, cheat in (getattr(env, "cheats", None) or {}).items():
        policies[f"{CHEAT_PREFIX}{name}"] = cheat
    return policies


_CLASSES = {
    "empty": "degenerate",
    "echo": "degenerate",
    "numbers": "degenerate",
    "everything": "degenerate",
    "junk-format": "format-only",
    "junk-tools": "tool-calls",
    "longest": "length",
    "shortest": "length",
    "candidates": "non-commitment",
    "keywords": "stuffing",
    "stuffing": "stuffing",
    "abstain": "abstention",
    "abstain-in-format": "abstention",
    "tool-hacks": "checker",
}
_REFERENCE_FLOOR = ("ref:no-answer", "ref:blank-answer", "ref:padded-no-answer")
_REFERENCE_BASELINES = (
    "ref:candidates", "ref:candidates-decoys", "ref:either", "ref:either-decoys", "ref:repeat",
    "ref:repeat-decoys", "ref:wrong", "ref:padded", "ref:wrong-fields-low",
    "ref:wrong-fields-high", *FIELD_PROBES,
)  # fmt: skip
_CALIBRATION = ("ref:wrong-fields-low", "ref:wrong-fields-high", *FIELD_PROBES)
_NOOP = "a program that does nothing"
_WITHOUT_ANSWER = "the same reply with a wrong answer in the answer's place"
_OWN_FIELDS = "the same wrong answer with the reply's own fields"


def probes(env: Env) -> list[Probe]:
    """Every probe the audit plays on ``env``, in order: :func:`degenerate_policies`, then,
    when the env has a ``reference_policy``, its mutants and the reference itself."""
    found = [
        Probe(name, _hack(name), _fixed(policy), floor=not name.startswith("checker:"))
        for name, policy in degenerate_policies(env).items()
    ]
    if getattr(env, "reference_policy", None) is None:
        return found
    found += [Probe(n, "form-without-answer", _mutant(n)) for n in _REFERENCE_FLOOR]
    found += [Probe(n, _contrast_class(n), _mutant(n), floor=False) for n in _REFERENCE_BASELINES]
    found.append(Probe("reference", "", _fixed(guarded(env.reference_policy)), floor=False))
    return found


def _contrast_class(name: str) -> str:
    """The class of a probe judged only by contrast: what its comparison tries."""
    if name in _CALIBRATION:
        return "calibration"
    return {"ref:wrong": "abstention", "ref:padded": "length"}.get(name, "non-commitment")


def _hack(name: str) -> str:
    if name.startswith(CHEAT_PREFIX):
        return "cheat"
    if name.startswith("checker:"):
        return "checker"
    return _CLASSES[name]


def contrasts(played: list[str]) -> list[Contrast]:
    """The comparisons among the probes in ``played`` (those whose probes were both played)."""
    every = [
        *(
            Contrast(f"ref:{kind}", f"ref:{kind}-decoys", "non-commitment", _WITHOUT_ANSWER)
            for kind in ("candidates", "either", "repeat")
        ),
        *(
            Contrast(f"checker:{n}", "checker:noop", "checker", _NOOP, above_floor=True)
            for n in ("print", "exit", "patch", "always-equal")
        ),
        Contrast("ref:padded", "reference", "length", "the reference reply unpadded"),
        *(
            Contrast(name, "ref:wrong", "calibration", _OWN_FIELDS, above_floor=True)
            for name in _CALIBRATION
        ),
        *(
            Contrast(name, "ref:wrong", "abstention", "a genuine wrong attempt, on average", True)
            for name in ("abstain", "abstain-in-format")
        ),
    ]
    return [c for c in every if c.probe in played and c.baseline in played]
