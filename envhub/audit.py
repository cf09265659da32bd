"""The reward-hacking audit: policies that solve nothing must not score above the env's floor.

:func:`audit_env` plays degenerate policies against an env, each on the same episodes
:func:`~envhub.checker.check_env` plays (seeds pinned to tasks spread over the dataset), and
fails when any episode scores above the env's floor. Each policy is a plain
:data:`~envhub.testing.Policy`:

- ``empty`` (:func:`~envhub.testing.null_policy`): an empty reply every turn;
- ``echo`` (:func:`echo_prompt`): the prompt's last message (the question), every turn. Like
  the other policies it says the same thing whatever the env replies: echoing each reply would
  play a game instead (guess-number's "6 guesses left" read as a guess of 6, then 5, ...);
- ``junk-format`` (:func:`junk_in_format`): every answer format, with junk inside: the usual
  ones (``\\boxed{junk}``, ``<answer>junk</answer>``, ``Answer: junk``) and those the prompt
  shows (a ``<guess>crane</guess>`` example, a `` `Guess: <number>` `` line, a fenced code
  block);
- ``junk-tools`` (:func:`junk_tool_calls`, envs with tools only): every tool called each turn,
  with arguments of the right types and no sense (``"junk"``, ``0``, ``false``, ...);
- ``longest`` (:func:`longest_output`): filler up to the token budget (``env.max_tokens`` when
  the env has one, else :data:`LONGEST_TOKENS`), one filler word per token, every turn;
- ``numbers`` (:func:`question_numbers`): every number of the question, repeated;
- ``everything`` (:func:`everything`): echo, numbers, junk formats and junk tool calls in one
  reply, for rewards that pay only for a mix;
- ``cheat:NAME``: each of the env's own :attr:`~envhub.env.Env.cheats`, known exploits its
  author wants kept out.

The floor: ``env.audit_floor`` when the env declares one, else the floor of ``reward_range``
(what the empty reply must score, ``check_env`` verifies it). Some envs pay a little for the
answer's form alone (arithmetic's 0.1 for a ``\\boxed{}``): such pay is declared, bounded and
shaping, not a hack, and the env says how much it is with ``audit_floor``. The audit then proves
that nothing a degenerate policy writes earns more than that pay; a floor at or above the top
of ``reward_range`` would prove nothing and fails the audit. A tolerance of 1e-9 absorbs float
sums.

What it does not do: it cannot tell luck from a hack. A degenerate policy that happens to win
a game (``numbers`` guessing 7, from "You have 7 guesses", when the secret is 7) fails the audit
on that episode; the audited episodes are fixed, so the verdict is reproducible, and the failure
shows the trajectory so a reader can judge. An env where every legal move pays more than the floor
(negative step rewards, as in CliffWalking) declares an ``audit_floor`` that says what moving
without purpose can reach. Token budgets are counted in filler words: the audit plays text, not
token ids, so ``longest`` fills a budget of N tokens with N words.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from envhub.checker import _run, _starts
from envhub.env import Env
from envhub.errors import EnvCheckError
from envhub.testing import Policy, null_policy
from envhub.types import Message

JUNK = "junk"
"""What goes where an answer or a tool argument should be."""
FILLER = "filler"
"""The word ``longest`` repeats."""
LONGEST_TOKENS = 4096
"""Filler words per turn for ``longest`` when the env has no token budget."""
CHEAT_PREFIX = "cheat:"
"""Prefix of the env's own cheats in the report, to tell them from the built-in policies."""
TOLERANCE = 1e-9

_STANDARD_FORMATS = (f"\\boxed{{{JUNK}}}", f"<answer>{JUNK}</answer>", f"Answer: {JUNK}")
# A tag pair shown in the prompt (`<guess>crane</guess>`), a `Label: <placeholder>` line in
# backticks, and a fenced block's language: the answer formats an env asks for in words.
_TAG_EXAMPLE = re.compile(r"<([A-Za-z][\w-]*)>[^<]*</\1>")
_LINE_TEMPLATE = re.compile(r"`([A-Za-z][\w ]{0,30}):\s*<[^<>`]+>`")
_FENCE_LANGUAGE = re.compile(r"```([A-Za-z][\w+-]*)")
_NOT_ANSWER_TAGS = frozenset({"tool_call", "tools"})  # the tool protocol, covered by junk-tools
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_JUNK_VALUES: dict[str, Any] = {
    "string": JUNK,
    "integer": 0,
    "number": 0,
    "boolean": False,
    "array": [],
    "object": {},
    "null": None,
}


# -- the degenerate policies ------------------------------------------------------------------


def echo_prompt(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Repeats the prompt's last message (the question) every turn, whatever the env replied."""
    prompt = messages[: next((i for i, m in enumerate(messages) if m.role == "assistant"), None)]
    return (prompt[-1].content or "") if prompt else ""


def junk_in_format(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Every answer format the env may read, with junk inside, one per line: the usual ones
    (boxed, ``<answer>`` tag, ``Answer:`` line) and those the prompt shows by example."""
    shown = "\n".join(m.content or "" for m in messages if m.role != "assistant")
    formats = list(_STANDARD_FORMATS)
    for tag in dict.fromkeys(_TAG_EXAMPLE.findall(shown)):
        if tag.lower() not in _NOT_ANSWER_TAGS:
            formats.append(f"<{tag}>{JUNK}</{tag}>")
    formats += [f"{label}: {JUNK}" for label in dict.fromkeys(_LINE_TEMPLATE.findall(shown))]
    formats += [f"```{lang}\n{JUNK}\n```" for lang in dict.fromkeys(_FENCE_LANGUAGE.findall(shown))]
    return "\n".join(dict.fromkeys(formats))


def junk_tool_calls(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Calls every tool in ``tools`` once, each argument junk of its schema's type; ``""``
    when the env offers no tools."""
    calls = []
    for schema in tools or ():
        function = schema.get("function") or {}
        properties = (function.get("parameters") or {}).get("properties") or {}
        arguments = {name: junk_value(spec) for name, spec in properties.items()}
        call = {"name": function.get("name", ""), "arguments": arguments}
        calls.append(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")
    return "\n".join(calls)


def junk_value(spec: dict[str, Any]) -> Any:
    """A value that fits a JSON schema's type and means nothing: the first of an ``enum``,
    else ``"junk"``, ``0``, ``false``, ``[]``, ``{}`` or ``null`` by type (``"junk"`` when the
    schema names no type)."""
    if spec.get("enum"):
        return spec["enum"][0]
    kind = spec.get("type", "string")
    if isinstance(kind, list):  # ["string", "null"]: the first type that is not null
        kind = next((k for k in kind if k != "null"), "null")
    return _JUNK_VALUES.get(kind, JUNK)


def longest_output(env: Env) -> Policy:
    """A policy that fills ``env``'s remaining token budget (else :data:`LONGEST_TOKENS`) with
    filler words, every turn."""

    def fill(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        budget = env.remaining_tokens
        return " ".join([FILLER] * (LONGEST_TOKENS if budget is None else budget))

    return fill


def question_numbers(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Every number in the question (the first user message), in order, separated by spaces."""
    question = next((m.content or "" for m in messages if m.role == "user"), "")
    return " ".join(_NUMBER.findall(question))


def everything(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Echo, numbers, junk formats and junk tool calls in one reply."""
    parts = (echo_prompt, question_numbers, junk_in_format, junk_tool_calls)
    return "\n\n".join(p for p in (part(messages, tools) for part in parts) if p)


def degenerate_policies(env: Env) -> dict[str, Policy]:
    """The policies :func:`audit_env` plays on ``env``, by name, in order: the built-in ones
    (``junk-tools`` only when the env has tools), then the env's own cheats."""
    policies: dict[str, Policy] = {"empty": null_policy, "echo": echo_prompt}
    policies["junk-format"] = junk_in_format
    if env.tool_schemas:
        policies["junk-tools"] = junk_tool_calls
    policies.update(longest=longest_output(env), numbers=question_numbers, everything=everything)
    for name, cheat in (getattr(env, "cheats", None) or {}).items():
        policies[f"{CHEAT_PREFIX}{name}"] = cheat
    return policies


# -- the report -------------------------------------------------------------------------------


@dataclass
class AuditFinding:
    """One audited episode that scored above the floor, or that crashed."""

    policy: str
    seed: int
    task: int | None
    """The dataset row the episode was pinned to (``None`` for an env without a dataset)."""
    reward: float | None
    """The episode's total reward (``None`` when it did not finish)."""
    conversation: list[dict[str, Any]] = field(default_factory=list)
    """The whole episode as OpenAI-format messages: prompt, the policy's turns, env replies."""
    error: str = ""
    """What raised, when the episode did not finish."""

    @property
    def where(self) -> str:
        """``"seed 0, task 12"`` (or ``"seed 0"`` without a dataset)."""
        return f"seed {self.seed}" if self.task is None else f"seed {self.seed}, task {self.task}"

    def describe(self, floor: float) -> str:
        """One line: the policy, the episode, and what it scored or raised."""
        if self.reward is None:
            return f"`{self.policy}` crashed the episode ({self.where}): {self.error}"
        first = next((m["content"] for m in self.conversation if m["role"] == "assistant"), "")
        return (
            f"`{self.policy}` scored {self.reward:g} > floor {floor:g} ({self.where}), "
            f"first turn {_excerpt(first or '', 80)}"
        )

    def transcript(self, width: int = 300) -> str:
        """The conversation as text, one ``[role] content`` paragraph per message, each cut
        to ``width`` characters."""
        return "\n".join(
            f"[{m['role']}] {_excerpt(m.get('content') or '', width)}" for m in self.conversation
        )


@dataclass
class AuditReport:
    """What :func:`audit_env` found: the floor, the policies played, and every finding."""

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

    @property
    def passed(self) -> bool:
        """True when no policy scored above the floor or crashed, and the floor means something."""
        return not self.findings and not self.problem

    def summary(self) -> str:
        """One line for a report table: the floor and the policies tried, or the first finding
        and how many more there are."""
        if self.problem:
            return self.problem
        origin = "audit_floor" if self.declared else "reward_range"
        if self.passed:
            return (
                f"{len(self.policies)} policies x {self.episodes} episodes at or below the floor "
                f"{self.floor:g} ({origin}): {', '.join(self.policies)}"
            )
        first, more = self.findings[0], len(self.findings) - 1
        others = sorted({f.policy for f in self.findings[1:]})
        also = f" (and {more} more: {', '.join(others)})" if more else ""
        return f"{first.describe(self.floor)}{also}"

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data, findings with their whole conversations."""
        return {
            "passed": self.passed,
            "floor": self.floor,
            "floor_from": "audit_floor" if self.declared else "reward_range",
            "policies": list(self.policies),
            "episodes_per_policy": self.episodes,
            "findings": [asdict(f) for f in self.findings],
            **({"problem": self.problem} if self.problem else {}),
        }


def _excerpt(text: str, width: int) -> str:
    flat = text.replace("\n", "\\n")
    return repr(flat if len(flat) <= width else flat[: width - 3] + "...")


# -- the audit --------------------------------------------------------------------------------


def audit_floor(env: Env) -> tuple[float, bool]:
    """The floor ``env`` is audited against, and whether the env declared it (``audit_floor``)
    rather than it being the floor of ``reward_range``."""
    declared = getattr(env, "audit_floor", None)
    if declared is not None:
        return float(declared), True
    return float(env.reward_range[0]), False


def audit_env(
    env: Env,
    *,
    seeds: tuple[int, ...] = (0, 1, 2),
    max_steps: int = 100,
    raise_on_failure: bool = True,
) -> AuditReport:
    """Play every degenerate policy (:func:`degenerate_policies`) on ``env`` and report any
    episode that scores above the floor (:func:`audit_floor`) or crashes.

    Args:
        env: The env to audit; it is left open (close it yourself).
        seeds: Seeds of the episodes each policy plays; a ``TaskEnv``'s are pinned to tasks
            spread over its dataset, as in :func:`~envhub.checker.check_env`.
        max_steps: An episode that has not ended after this many steps is a finding.
        raise_on_failure: Raise :class:`EnvCheckError` with the summary if the audit fails.
    """
    floor, declared = audit_floor(env)
    policies = degenerate_policies(env)
    report = AuditReport(env.name, floor, declared, list(policies), len(seeds))
    report.problem = _floor_problem(env, floor, declared)
    if not report.problem:
        starts = _starts(env, seeds)
        for name, policy in policies.items():
            for start in starts:
                finding = _play(env, name, policy, start, max_steps)
                if finding.reward is None or finding.reward > floor + TOLERANCE:
                    report.findings.append(finding)
    if raise_on_failure and not report.passed:
        raise EnvCheckError(f"{report.env_name} fails the reward audit: {report.summary()}")
    return report


def _floor_problem(env: Env, floor: float, declared: bool) -> str:
    """Why ``floor`` cannot be audited against ("" when it can)."""
    if not math.isfinite(floor):
        return (
            f"no finite floor to audit against: reward_range is {env.reward_range}; "
            "declare a finite reward_range (or audit_floor)"
        )
    top = float(env.reward_range[1])
    if declared and floor >= top:
        return (
            f"audit_floor {floor:g} is not below the top of reward_range ({top:g}): "
            "no policy could fail the audit; set it to what the answer's form alone pays"
        )
    return ""


def _play(env: Env, name: str, policy: Policy, start: Any, max_steps: int) -> AuditFinding:
    """One episode of ``policy``, recorded: its reward and whole conversation."""
    actions: list[str] = []

    def recording(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        actions.append(policy(messages, tools))
        return actions[-1]

    finding = AuditFinding(name, start.seed, start.task, None)
    try:
        episode = _run(env, start, recording, max_steps)
    except Exception as e:  # a crash under junk input is a finding, not the end of the audit
        finding.error = f"{type(e).__name__}: {e}"
        finding.conversation = [{"role": "assistant", "content": a} for a in actions]
        return finding
    finding.reward = episode.total
    finding.conversation = _interleave(episode.observations, actions)
    return finding


def _interleave(observations: list[list[dict[str, Any]]], actions: list[str]) -> list[dict]:
    """The prompt, then each action followed by the env's reply to it."""
    conversation = list(observations[0])
    for action, reply in zip(actions, observations[1:], strict=True):
        conversation += [{"role": "assistant", "content": action}, *reply]
    return conversation
