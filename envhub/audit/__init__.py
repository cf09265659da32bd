"""The reward-hacking audit: policies that solve nothing must not be paid for it.

:func:`audit_env` plays a catalog of adversarial policies (:mod:`envhub.audit.probes`) on the
episodes :func:`~envhub.checks.checker.check_env` plays (seeds pinned to tasks spread over the
dataset). Each policy tries one class of hack (:data:`~envhub.audit.report.HACKS`):

- **degenerate** (:mod:`~envhub.audit.basic`): an empty reply, the prompt echoed, the
  question's numbers, all at once; **format-only**: junk in every answer format; **tool-calls**:
  every tool called with junk;
- **non-commitment** (:mod:`~envhub.audit.hedging`): every option, yes/no, option letters and
  0..100 listed in every format;
- **stuffing** (:mod:`~envhub.audit.stuffing`): the words, tags, markers and formats of the
  reward's own code, the env's reply logic and the prompts, with junk where answers go;
- **abstention** and **length** (:mod:`~envhub.audit.basic`): "I don't know" plain and in
  format; the longest and the shortest reply;
- **checker** (:mod:`~envhub.audit.checker_hacks`): programs that print what checkers look
  for, exit early, patch the test process or return an object that equals everything, in a
  code block and in every tool argument, each against a program that does nothing;
- **the reference, mutated** (:mod:`~envhub.audit.mutation`): the env's ``reference_policy``
  with its answer dropped (form kept), hedged among decoys, padded, or wrong (with its other
  numbers and fields at an extreme, all at once and one at a time: **calibration**);
- **cheat**: each of the env's own :attr:`~envhub.env.Env.cheats`.

Nothing a policy without the answer writes may score above the floor: ``env.audit_floor`` when
the env declares one (what the answer's form alone pays, as arithmetic's 0.1 for a
``\\boxed{}``), else the floor of ``reward_range``; a floor at or above the top of the range
proves nothing and fails the audit. Beyond the floor, a hedge that contains the answer must
not beat the same hedge with a wrong answer in its place, the padded reference must not beat
the reference, and abstaining must not beat a genuine wrong attempt on average. A crash under
any of these replies is a finding too. Each finding names its hack class, the policy, the
episode, the reply that scored and how the reward could be fixed.

Cost: a workspace env (each episode a sandbox session, its verdict a test run) is played by a
few copies of itself at once where it allows (:mod:`~envhub.audit.players`), and, where it
declares its verdict a function of the task and the files an episode leaves, an episode that
leaves the files another episode of its task left gets that episode's verdict
(:meth:`~envhub.workspace_env.WorkspaceEnv.reusing_verdicts`): most probes never touch the
workspace. Neither changes a verdict.

What it does not do: it cannot tell luck from a hack. A degenerate policy that happens to win
a game (``numbers`` guessing 7, from "You have 7 guesses", when the secret is 7) fails the audit
on that episode; the audited episodes are fixed, so the verdict is reproducible, and the failure
shows the trajectory so a reader can judge. An env where every legal move pays more than the floor
(negative step rewards, as in CliffWalking) declares an ``audit_floor`` that says what moving
without purpose can reach. Token budgets are counted in filler words: the audit plays text, not
token ids, so ``longest`` fills a budget of N tokens with N words. Code that reads the test
harness's memory to forge ``assert`` cases, or a stub that returns ``None`` where a case expects
it, is not tried (see :mod:`envhub.sandbox.threat_model`).
"""

from __future__ import annotations

from envhub.audit.basic import (
    FILLER,
    JUNK,
    LONGEST_TOKENS,
    echo_prompt,
    everything,
    junk_in_format,
    junk_tool_calls,
    junk_value,
    longest_output,
    question_numbers,
)
from envhub.audit.probes import CHEAT_PREFIX, Contrast, Probe, degenerate_policies, probes
from envhub.audit.report import HACKS, AuditFinding, AuditReport
from envhub.audit.run import TOLERANCE, audit_env, audit_floor

__all__ = [
    "CHEAT_PREFIX",
    "FILLER",
    "HACKS",
    "JUNK",
    "LONGEST_TOKENS",
    "TOLERANCE",
    "AuditFinding",
    "AuditReport",
    "Contrast",
    "Probe",
    "audit_env",
    "audit_floor",
    "degenerate_policies",
    "echo_prompt",
    "everything",
    "junk_in_format",
    "junk_tool_calls",
    "junk_value",
    "longest_output",
    "probes",
    "question_numbers",
]
