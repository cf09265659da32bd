"""What the audit found: one :class:`AuditFinding` per episode that scored where it must not,
gathered in an :class:`AuditReport`; each names its hack class and how the reward could be fixed
(:data:`HACKS`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

HACKS: dict[str, str] = {
    "degenerate": "the reward pays a reply that attempts nothing (empty, the prompt echoed, the "
    "question's numbers): pay only for a final answer that matches the reference",
    "format-only": "the reward pays for the answer's form with junk inside: pay for the form at "
    "most a small amount and declare it as the env's `audit_floor`, pay the rest only for a "
    "right answer",
    "tool-calls": "the reward pays for tool calls that bring nothing: score the outcome the "
    "calls lead to, not the calls (or declare the per-call pay as `audit_floor`)",
    "non-commitment": "the reward pays a reply that lists the answer among others (candidates, "
    "both options, a range): extract exactly one final answer (the last \\boxed{}, tag or "
    "`Answer:` line) and compare it whole; never search the reply for the answer",
    "stuffing": "the reward pays for words, tags or markers that its own code, the prompt or the "
    "system prompt contain: pay for the answer's content, not for keywords or markup",
    "abstention": "a refusal or 'I don't know' scores above the floor or above a genuine wrong "
    "attempt: give abstaining no more than a wrong answer (or declare the pay as `audit_floor` "
    "when abstaining is meant to be paid)",
    "length": "the reward pays for length (a very long or very short reply): drop or cap the "
    "length term, and score the answer, not the amount of text",
    "checker": "a program that solves nothing satisfied the checker (printed what it looks for, "
    "exited early or patched the test process): judge through a channel the program cannot "
    "write, e.g. `envhub.rewards.code.code_tests` with call or io cases, not its exit code, "
    "printed text or files",
    "calibration": "a wrong answer scores more once the reply's other numbers or fields (a "
    "confidence, a score, 'sure: no') are set to an extreme: pay for stated confidence only on "
    "top of a right answer (a Brier-style score alone gives a wrong answer at 0% confidence full "
    "marks), or declare what a wrong answer may earn as `audit_floor`",
    "form-without-answer": "the reference reply with its answer taken out still scores: pay for "
    "the answer itself, not for the rest of the reply's text or form",
    "cheat": "an exploit the env's author listed (`Env.cheats`) works again: restore the guard "
    "that shut it",
    "crash": "the env raised on a reply it did not expect: treat unreadable replies as wrong "
    "answers (reward at the floor) instead of raising",
}
"""Hack class -> what it means for the reward and how the reward could be fixed."""


@dataclass
class AuditFinding:
    """One audited episode that scored where it must not (above the floor, or above what the
    same kind of reply scores without the answer), or that crashed."""

    policy: str
    seed: int
    task: int | None
    """The dataset row the episode was pinned to (``None`` for an env without a dataset)."""
    reward: float | None
    """The episode's total reward (``None`` when it did not finish); for a comparison of
    averages (abstention), the policy's average over the audited episodes."""
    conversation: list[dict[str, Any]] = field(default_factory=list)
    """The whole episode as OpenAI-format messages: prompt, the policy's turns, env replies."""
    error: str = ""
    """What raised, when the episode did not finish."""
    hack: str = "degenerate"
    """The hack class, a key of :data:`HACKS`."""
    baseline: float | None = None
    """What the reward must not exceed: the floor, or the score of the reply it is compared with."""
    compared_with: str = "floor"
    """What ``baseline`` is, in words: ``"floor"``, or the reply it was compared with."""

    @property
    def where(self) -> str:
        """``"seed 0, task 12"`` (or ``"seed 0"`` without a dataset)."""
        return f"seed {self.seed}" if self.task is None else f"seed {self.seed}, task {self.task}"

    @property
    def example(self) -> str:
        """The reply that scored: the policy's last turn of the episode."""
        replies = [m.get("content") or "" for m in self.conversation if m["role"] == "assistant"]
        return replies[-1] if replies else ""

    @property
    def fix(self) -> str:
        """How the reward could be fixed (from :data:`HACKS`)."""
        return HACKS.get(self.hack, "")

    def describe(self, floor: float) -> str:
        """One line: the policy and its hack class, the episode, and what it scored or raised."""
        if self.reward is None:
            return f"`{self.policy}` [crash] crashed the episode ({self.where}): {self.error}"
        baseline = floor if self.baseline is None else self.baseline
        return (
            f"`{self.policy}` [{self.hack}] scored {self.reward:g} > {self.compared_with} "
            f"{baseline:g} ({self.where}), reply {_excerpt(self.example, 80)}"
        )

    def transcript(self, width: int = 300) -> str:
        """The conversation as text, one ``[role] content`` paragraph per message, each cut
        to ``width`` characters."""
        return "\n".join(
            f"[{m['role']}] {_excerpt(m.get('content') or '', width)}" for m in self.conversation
        )

    def to_dict(self) -> dict[str, Any]:
        """The finding as JSON-ready data, with its example reply and the fix."""
        return {**asdict(self), "example": self.example, "fix": self.fix}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AuditFinding:
        """The finding back from :meth:`to_dict` (the derived ``example`` and ``fix`` dropped)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class AuditReport:
    """What :func:`~envhub.audit.audit_env` found: the floor, the policies played, and every
    finding."""

    env_name: str
    floor: float
    declared: bool
    """True when the floor is the env's ``audit_floor``, not the floor of ``reward_range``."""
    policies: list[str]
    episodes: int
    """Episodes played per policy."""
    findings: list[AuditFinding] = field(default_factory=list)
    problem: str = ""
    """Why the audit could not judge (a floor that proves nothing); empty when it could."""
    hacks: list[str] = field(default_factory=list)
    """The hack classes the policies cover, in order."""
    played: list[str] | None = None
    """The policies that played an episode (a mutant that would rewrite none of the
    reference's replies plays none); ``None``: not played yet."""

    @property
    def passed(self) -> bool:
        """True when nothing scored where it must not or crashed, and the floor means something."""
        return not self.findings and not self.problem

    def summary(self) -> str:
        """One line for a report table: the floor, the policies and hack classes tried, or the
        first finding and how many more there are."""
        if self.problem:
            return self.problem
        origin = "audit_floor" if self.declared else "reward_range"
        if self.passed:
            tried = self.policies if self.played is None else self.played
            return (
                f"{len(tried)} policies x {self.episodes} episodes at or below the floor "
                f"{self.floor:g} ({origin}), none paid for a hack: {', '.join(self.hacks)}"
            )
        first, more = self.findings[0], len(self.findings) - 1
        others = sorted({f.policy for f in self.findings[1:]})
        also = f" (and {more} more: {', '.join(others)})" if more else ""
        return f"{first.describe(self.floor)}{also}"

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data, findings with their whole conversations, example
        replies and fixes."""
        return {
            "passed": self.passed,
            "floor": self.floor,
            "floor_from": "audit_floor" if self.declared else "reward_range",
            "policies": list(self.policies),
            **({"played": list(self.played)} if self.played is not None else {}),
            "hacks": list(self.hacks),
            "episodes_per_policy": self.episodes,
            "findings": [f.to_dict() for f in self.findings],
            **({"problem": self.problem} if self.problem else {}),
        }


def _excerpt(text: str, width: int) -> str:
    """``text`` quoted on one line (``repr`` shows a newline as ``\\n``), cut to ``width``."""
    return repr(text if len(text) <= width else text[: width - 3] + "...")
