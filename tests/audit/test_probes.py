"""The audit's building blocks, exactly: the options a prompt offers and the candidate list; the
reward's literals and the samples of its patterns; where the answer sits in a reference reply,
its decoys and its removal; a mutant that changed nothing or whose reference gave up; and the
checker programs judged against a program that does nothing."""

from __future__ import annotations

import re
from typing import Any

import pytest

from envhub.audit import audit_env, probes
from envhub.audit.checker_hacks import print_program
from envhub.audit.hedging import candidates, prompt_options
from envhub.audit.mutation import Mutant, ProbeSkipped, answer_slot, decoys, replace_answer
from envhub.audit.stuffing import bag_of_words, regex_sample, reward_literals
from envhub.multiturn import MultiTurnEnv
from envhub.rewards.rubric import Rubric, reward
from envhub.sandbox import bwrap_problem
from envhub.state import State
from envhub.types import AssistantTurn, Message, system, user

PROMPT = [
    system("Actions: left, down, right, up. Reply with <action>x</action> or `stay`; yes or no."),
    user("What is 3 + 4?"),
]


def test_the_options_a_prompt_offers_and_every_candidate_at_once():
    assert prompt_options(PROMPT) == ["stay", "yes", "no", "left", "down", "right", "up"]
    lines = candidates(PROMPT, None).splitlines()
    listed = (
        "junk, 987654321, stay, yes, no, left, down, right, up, true, false, A, B, C, D, E, 3, 4, "
        + ", ".join(str(n) for n in range(101) if n not in (3, 4))
        + ", 987654321, junk"
    )
    everything = "between -987654321 and 987654321"
    formats = ["\\boxed{%s}", "<answer>%s</answer>", "Answer: %s", "<action>%s</action>"]
    assert lines == [f % listed for f in formats] + [f % everything for f in formats]


@pytest.mark.parametrize(
    ("pattern", "sample"),
    [
        (r"<answer>(.*?)</answer>", "<answer>jjjj</answer>"),
        (r"Final answer:\s*\w+", "Final answer:    jjjj"),
        (r"(?im)^[^\S\n]*(?:final\s+)?answer\s*[:：]\s*(.+)$", "answer    :    jjjj"),
        (r"\\boxed\{", "\\boxed{"),
        (r"[A-Z]{5}", "AAAAA"),
        (r"guess:\s*(-?\d+)", None),  # it reads a number: a wrong answer, not stuffing
        (r"Step \d+:", None),
        (r"(a)\1", None),  # a back-reference: no sample
        ("[unclosed", None),
    ],
)
def test_a_pattern_sample_matches_it_and_reads_no_number(pattern: str, sample: str | None):
    assert regex_sample(pattern) == sample


_VERDICT = re.compile(r"VERDICT:\s*(yes|no)")


def _verdict(text: str) -> str | None:
    found = _VERDICT.search(text)
    return found.group(1) if found else None


@reward
def said_yes(state: State) -> float:
    return float(state.data.get("verdict") == "yes")


class Verdicts(MultiTurnEnv):
    """Reads a verdict in env_response (through a helper and a pattern); the reward reads state."""

    name = "verdicts"
    default_max_turns = 1

    def load_dataset(self) -> list[dict[str, Any]]:
        return [{"question": "Is water wet?"}]

    def default_rubric(self) -> Rubric:
        return Rubric([said_yes])

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        state.data["verdict"] = _verdict(turn.message.content or "")
        state.done = True
        return [user("Noted.")]


def test_the_reward_literals_follow_the_env_logic_into_its_helpers_and_patterns():
    literals = reward_literals(Verdicts())
    assert {"verdict", "yes", "Noted.", r"VERDICT:\s*(yes|no)"} <= set(literals)
    assert not any("Reads a verdict" in text for text in literals)  # docstrings are prose
    assert bag_of_words(["VERDICT: yes", "Noted. yes no", "a b"]) == "verdict yes noted"
    # The options a prompt offers by name stay out of the bag: one named alone is a move.
    assert bag_of_words([PROMPT[0].content], prompt_options(PROMPT)) == "actions reply with action"
    # The pattern's sample, "VERDICT:    yes", is stuffed: the reward pays for it.
    report = audit_env(Verdicts(), seeds=(0,), raise_on_failure=False)
    assert [(f.policy, f.hack) for f in report.findings] == [("stuffing", "stuffing")]
    assert "VERDICT:    yes" in report.findings[0].example.splitlines()


class _Touchy:
    """A module global that raises on any attribute, as a lazy proxy may."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"no {name} here")


TOUCHY = _Touchy()


@reward
def reads_a_touchy_global(response: str) -> float:
    return float(TOUCHY is None and response == "never")


def test_a_builtin_envs_own_logic_is_read_and_envhubs_machinery_is_not():
    import envhub

    literals = reward_literals(envhub.make("guess-number"))
    assert "Correct! The number is " in literals  # envhub.envs.guessing: its env_response
    assert not any("call reset()" in text for text in literals)  # envhub.env's TaskEnv


def test_a_global_that_raises_on_access_is_passed_over():
    class Odd(Verdicts):
        def default_rubric(self) -> Rubric:
            return Rubric([reads_a_touchy_global])

    assert "never" in reward_literals(Odd())
    assert audit_env(Odd(), seeds=(0,)).passed


@pytest.mark.parametrize(
    ("reply", "answer", "slot"),
    [
        ("The capital city is Paris.\nAnswer: Paris", "Paris", "Paris"),
        ("\\boxed{115}", "1", "115"),  # "1" is no whole token of it: the box's content
        ("Guess: 50", None, "50"),
        ("50", None, "50"),
        ("<action>down</action>", None, "down"),
        ("The result is \\boxed{8}.", None, "8"),
        ("Paris", None, "Paris"),
        ('<tool_call>\n{"name": "f"}\n</tool_call>', None, None),
        ("```python\nx = 1\n```", None, None),
        ("a long sentence with no answer at all", None, None),
    ],
)
def test_the_answer_slot_of_a_reply(reply: str, answer: Any, slot: str | None):
    span = answer_slot(reply, answer)
    assert (reply[span[0] : span[1]] if span else None) == slot


def test_decoys_are_wrong_answers_of_the_same_kind_and_the_answer_goes_everywhere():
    assert decoys("50", PROMPT, []) == ["49", "51", "52"]
    assert decoys("2.5", PROMPT, []) == ["1.5", "3.5", "4.5"]
    assert decoys("Paris", [user("q")], ["Tokyo", "Lima"]) == ["Tokyo", "Lima", "alpha"]
    assert decoys("down", PROMPT, []) == ["stay", "yes", "no"]
    assert replace_answer("The capital city is Paris.\nAnswer: Paris", "Paris", "junk") == (
        "The capital city is junk.\nAnswer: junk"
    )
    assert replace_answer("1.5 and 1 and 115", "1", "X") == "1.5 and X and 115"


class _Env:
    def __init__(self, reference: Any) -> None:
        self.reference_policy = reference


def test_a_mutant_changes_only_answers_and_skips_when_its_reference_gives_up():
    calls = Mutant(_Env(lambda m, t: "<tool_call>\n{}\n</tool_call>"), None, [], lambda v, w: "j")
    assert calls([], None) == "<tool_call>\n{}\n</tool_call>" and not calls.changed
    boxed = Mutant(_Env(lambda m, t: "So \\boxed{7}."), "7", [], lambda v, w: f"{w[0]}, {v}")
    assert boxed([user("q")], None) == "So \\boxed{6, 7}." and boxed.changed

    def confused(messages: list[Message], tools: Any) -> str:
        raise KeyError("not a question I know")

    with pytest.raises(ProbeSkipped, match="the reference policy raised KeyError"):
        Mutant(_Env(confused), None, [], lambda v, w: v)([], None)


def test_the_print_program_prints_the_markers_and_the_rewards_short_literals():
    program = print_program(["All done", "x" * 41, "two\nlines", "```", "ok"])
    assert program.splitlines()[:7] == [
        "print('All tests passed')", "print('OK')", "print('PASSED')", "print('passed')",
        "print('Success')", "print('True')", "print('Correct')",
    ]  # fmt: skip
    assert program.splitlines()[7:] == ["print('All done')", "print('ok')"]


def test_a_reference_env_plays_its_mutants_and_the_reference():
    from envhub.envs.arithmetic import ArithmeticEnv

    names = [p.name for p in probes(ArithmeticEnv(num_tasks=3))]
    single = [f"ref:wrong-field-{k}-{end}" for k in range(1, 7) for end in ("low", "high")]
    assert names[-26:] == [
        "ref:no-answer", "ref:blank-answer", "ref:padded-no-answer", "ref:candidates",
        "ref:candidates-decoys", "ref:either", "ref:either-decoys", "ref:repeat",
        "ref:repeat-decoys", "ref:wrong", "ref:padded", "ref:wrong-fields-low",
        "ref:wrong-fields-high", *single, "reference",
    ]  # fmt: skip


@pytest.mark.skipif(bwrap_problem() is not None, reason=f"no bubblewrap: {bwrap_problem()}")
def test_a_case_that_expects_no_output_pays_doing_nothing_and_is_no_checker_finding():
    from envhub.rewards.code import code_tests

    from .hackable_envs import SANDBOX, CodeTasks

    class Triangles(CodeTasks):
        reference_policy = None

        def load_dataset(self) -> list[dict[str, Any]]:
            return [
                {
                    "question": "Print n asterisks, n read from stdin.",
                    "info": {
                        "tests": [
                            {"stdin": "2\n", "stdout": "**\n"},
                            {"stdin": "0\n", "stdout": ""},
                        ],
                        "solution": "print('*' * int(input()))\n",
                    },
                }
            ]

    report = audit_env(Triangles(Rubric([code_tests(SANDBOX, timeout=2.0)])), seeds=(0,))
    assert report.passed  # checker:exit scores 0.5, as checker:noop does: a gap in the tests
