"""``audit_env``: play every probe on the checked episodes and judge what they scored."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

from envhub.audit.mutation import MUTANT_PREFIX, Mutant, ProbeSkipped, applies, task_answer
from envhub.audit.players import Players
from envhub.audit.probes import Contrast, Probe, contrasts, probes
from envhub.audit.report import AuditFinding, AuditReport
from envhub.checks.checker import _run, _starts
from envhub.env import Env
from envhub.errors import EnvCheckError
from envhub.testing import Policy
from envhub.types import Message
from envhub.workspace_env import WorkspaceEnv

TOLERANCE = 1e-9
"""Scores within this of each other are equal (float sums)."""


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
    """Play every probe (:func:`~envhub.audit.probes.probes`) on ``env`` and report each
    episode that scores above the floor (:func:`audit_floor`), each contrast a probe wins
    against its baseline, and each crash.

    Args:
        env: The env to audit; it is left open (close it yourself).
        seeds: Seeds of the episodes each policy plays; a ``TaskEnv``'s are pinned to tasks
            spread over its dataset, as in :func:`~envhub.checks.checker.check_env`.
        max_steps: An episode that has not ended after this many steps is a finding.
        raise_on_failure: Raise :class:`EnvCheckError` with the summary if the audit fails.
    """
    floor, declared = audit_floor(env)
    catalog = probes(env)
    played = [p.name for p in catalog]
    judged = contrasts(played)
    hacks = [p.hack for p in catalog if p.floor] + [c.hack for c in judged]
    report = AuditReport(env.name, floor, declared, played, len(seeds))
    report.hacks = list(dict.fromkeys(hacks))
    report.problem = _floor_problem(env, floor, declared)
    if not report.problem:
        starts = _starts(env, seeds)
        with _reusing_verdicts(env):
            episodes, ran = _play_all(env, catalog, starts, max_steps)
        report.played = [name for name in played if name in ran]
        report.findings = _above_floor(catalog, episodes, floor)
        report.findings += _contrasted(judged, episodes, floor)
    if raise_on_failure and not report.passed:
        raise EnvCheckError(f"{report.env_name} fails the reward audit: {report.summary()}")
    return report


def _reusing_verdicts(env: Env) -> contextlib.AbstractContextManager[None]:
    """A workspace env's verdicts reused for the audit's length (see
    :meth:`~envhub.workspace_env.WorkspaceEnv.reusing_verdicts`): most probes never touch the
    workspace, and each verdict of an env like repo-repair is a pytest run."""
    if isinstance(env, WorkspaceEnv):
        return env.reusing_verdicts()
    return contextlib.nullcontext()


def _play_all(
    env: Env, catalog: list[Probe], starts: tuple[Any, ...], max_steps: int
) -> tuple[dict[str, list[AuditFinding | None]], set[str]]:
    """Every probe's episode on every start, by probe name (played by :class:`Players`: a
    workspace env's copies play several at once), and the probes that played any. The
    reference plays first: where no reply of its episode shows an answer (for a one-field
    mutant, has that field), a mutant would replay that episode unchanged, so the mutants skip
    it (``None``) without playing it (an env whose episodes are workspaces pays seconds for
    each)."""
    names = [p.name for p in catalog]
    played: dict[str, list[AuditFinding | None]] = {n: [None] * len(starts) for n in names}

    def play(env: Env, probe: Probe, start: Any) -> AuditFinding | None:
        return _play(env, probe, start, max_steps)

    first = [n for n in names if n == "reference"]
    ran: set[str] = set()
    with Players(env, catalog) as players:
        for phase in (first, [n for n in names if n not in first]):
            jobs = [
                (name, index)
                for name in phase
                for index, start in enumerate(starts)
                if not name.startswith(MUTANT_PREFIX)
                or _rewrites(env, start, name, played["reference"][index])
            ]
            found = players.play([(name, starts[index]) for name, index in jobs], play)
            for (name, index), finding in zip(jobs, found, strict=True):
                played[name][index] = finding
                ran.add(name)
    return played, ran


def _rewrites(env: Env, start: Any, name: str, episode: AuditFinding | None) -> bool:
    """False when the reference's episode finished and the mutant ``name`` would rewrite none
    of its replies (none shows an answer, or, for a one-field mutant, none has that field)."""
    if episode is None or episode.reward is None:
        return True
    answer = task_answer(env, start)
    replies = [m.get("content") or "" for m in episode.conversation if m["role"] == "assistant"]
    return any(applies(name, reply, answer) for reply in replies)


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


def _above_floor(
    catalog: list[Probe], episodes: dict[str, list[AuditFinding | None]], floor: float
) -> list[AuditFinding]:
    """Every crash, and every episode of a floor-judged probe that scored above the floor."""
    found = []
    for probe in catalog:
        for episode in episodes[probe.name]:
            if episode is None:
                continue
            if episode.reward is None:
                found.append(episode)
            elif probe.floor and episode.reward > floor + TOLERANCE:
                found.append(episode)
    return found


def _contrasted(
    judged: list[Contrast], episodes: dict[str, list[AuditFinding | None]], floor: float
) -> list[AuditFinding]:
    """Every contrast a probe wins: episode by episode, or on average."""
    found = []
    for contrast in judged:
        both = zip(episodes[contrast.probe], episodes[contrast.baseline], strict=True)
        pairs = [
            (mine, theirs)
            for mine, theirs in both
            if mine is not None and theirs is not None
            and mine.reward is not None and theirs.reward is not None
        ]  # fmt: skip
        if contrast.mean and pairs:
            pairs = [_averaged(pairs)]
        for mine, theirs in pairs:
            low = max(theirs.reward, floor) if contrast.above_floor else theirs.reward
            if mine.reward > low + TOLERANCE:
                mine.hack, mine.baseline = contrast.hack, theirs.reward
                mine.compared_with = f"`{contrast.baseline}` ({contrast.words})"
                found.append(mine)
    return found


def _averaged(pairs: list[tuple[AuditFinding, AuditFinding]]) -> tuple[AuditFinding, AuditFinding]:
    """The best-scoring episode of the probe, carrying the probe's average, and a stand-in for
    the baseline's average."""
    mine = max((m for m, _ in pairs), key=lambda f: f.reward)
    average = AuditFinding(mine.policy, mine.seed, mine.task, _mean([m.reward for m, _ in pairs]))
    average.conversation, average.hack = mine.conversation, mine.hack
    theirs = AuditFinding("", 0, None, _mean([t.reward for _, t in pairs]))
    return average, theirs


def _mean(values: list[float | None]) -> float:
    return sum(v or 0.0 for v in values) / len(values)


@dataclass
class _Recorder:
    policy: Policy
    actions: list[str]

    def __call__(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        self.actions.append(self.policy(messages, tools))
        return self.actions[-1]


def _play(env: Env, probe: Probe, start: Any, max_steps: int) -> AuditFinding | None:
    """One episode of ``probe``, recorded: its reward and whole conversation; ``None`` when the
    probe does not apply to it (a mutant that changed nothing, a reference that gave up)."""
    policy = probe.make(env, start)
    recording = _Recorder(policy, [])
    finding = AuditFinding(probe.name, start.seed, start.task, None, hack=probe.hack)
    try:
        episode = _run(env, start, recording, max_steps)
    except ProbeSkipped:
        return None
    except Exception as e:  # a crash under junk input is a finding, not the end of the audit
        finding.hack, finding.error = "crash", f"{type(e).__name__}: {e}"
        finding.conversation = [{"role": "assistant", "content": a} for a in recording.actions]
        return finding
    if isinstance(policy, Mutant) and not policy.changed:
        return None
    finding.reward = episode.total
    finding.conversation = _interleave(episode.observations, recording.actions)
    return finding


def _interleave(observations: list[list[dict[str, Any]]], actions: list[str]) -> list[dict]:
    """The prompt, then each action followed by the env's reply to it."""
    conversation = list(observations[0])
    for action, reply in zip(actions, observations[1:], strict=True):
        conversation += [{"role": "assistant", "content": action}, *reply]
    return conversation
