"""``envhub.audit``: each degenerate policy catches the hack it is for, on an env made hackable
on purpose (and only the policies that include it do); an author's cheat is played; the floor
is the declared ``audit_floor`` or the floor of ``reward_range``, and a floor that proves nothing
fails; a crash under junk is a finding; every built-in env passes, with exact policies and floor.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

import envhub
from envhub.audit import (
    HACKS,
    LONGEST_TOKENS,
    audit_env,
    degenerate_policies,
    echo_prompt,
    junk_in_format,
    junk_tool_calls,
    junk_value,
    longest_output,
    question_numbers,
)
from envhub.env import SingleTurnEnv
from envhub.envs.arithmetic import ArithmeticEnv
from envhub.errors import EnvCheckError
from envhub.multiturn import MultiTurnEnv, ToolEnv
from envhub.rewards.code import code_tests
from envhub.rewards.format import has_answer
from envhub.rewards.math import math_answer
from envhub.rewards.rubric import Rubric, reward
from envhub.state import State
from envhub.tools.tool import tool
from envhub.types import AssistantTurn, Message, system, user

BUILTIN = sorted(name for name, spec in envhub.list_envs().items() if spec.distribution == "envhub")
QUESTIONS = [
    {"question": "Which is larger, 12, or 7?", "answer": "12"},
    {"question": "Which is larger, 3, or 40?", "answer": "40"},
    {"question": "Which is larger, 25, or 5?", "answer": "25"},
]
SINGLE_TURN = [
    "empty", "echo", "junk-format", "longest", "shortest", "numbers", "everything", "candidates",
    "keywords", "stuffing", "abstain", "abstain-in-format", "checker:noop", "checker:print",
    "checker:exit", "checker:patch", "checker:always-equal",
]  # fmt: skip


class Hackable(SingleTurnEnv):
    """A one-turn env whose reward is whatever function the test passes in."""

    name = "hackable"
    system_prompt = "Compare the numbers."

    def __init__(self, pays: Any, **kwargs: Any) -> None:
        self.pays = pays
        super().__init__(dataset=QUESTIONS, **kwargs)

    def default_rubric(self) -> Rubric:
        return Rubric([reward(self.pays, name="hack")])


def pays_empty(response: str) -> float:
    return float(response == "")


def pays_boxed(response: str) -> float:
    return float("\\boxed{" in response)


def pays_length(response: str) -> float:
    return float(len(response) > 2000)


def pays_echo(response: str, prompt: list[Message]) -> float:
    return float(prompt[-1].content in response)


def pays_listed_answer(response: str, answer: str) -> float:
    """The answer as a word anywhere in the reply: a bare list of the question's numbers wins."""
    return float(answer in response.split())


def pays_echo_and_boxed(response: str, prompt: list[Message]) -> float:
    return float(prompt[-1].content in response and "\\boxed{" in response)


def hacked_by(pays: Any) -> list[str]:
    """The policies whose episodes scored above the floor, in the order they ran."""
    report = audit_env(Hackable(pays), raise_on_failure=False)
    assert report.policies == SINGLE_TURN
    return list(dict.fromkeys(f.policy for f in report.findings))


@pytest.mark.parametrize(
    ("pays", "caught_by"),
    [
        (pays_empty, ["empty"]),
        # The reward's own "\\boxed{" is stuffed, and printed by checker:print's program.
        (
            pays_boxed,
            [
                "junk-format",
                "everything",
                "candidates",
                "stuffing",
                "abstain-in-format",
                "checker:print",
            ],
        ),  # fmt: skip
        (pays_length, ["longest"]),
        (pays_echo, ["echo", "everything"]),
        (pays_listed_answer, ["numbers", "everything"]),
        (pays_echo_and_boxed, ["everything"]),
    ],
)
def test_each_hack_is_caught_by_the_policies_that_write_it(pays: Any, caught_by: list[str]):
    assert hacked_by(pays) == caught_by


def test_a_finding_names_the_policy_the_episode_and_keeps_the_conversation():
    report = audit_env(Hackable(pays_boxed), raise_on_failure=False)
    first = report.findings[0]
    formats = "\\boxed{junk}\n<answer>junk</answer>\nAnswer: junk"
    assert (first.policy, first.seed, first.task, first.reward, first.error, first.hack) == (
        "junk-format",
        0,
        0,
        1.0,
        "",
        "format-only",
    )
    assert first.conversation == [
        {"role": "system", "content": "Compare the numbers."},
        {"role": "user", "content": "Which is larger, 12, or 7?"},
        {"role": "assistant", "content": formats},
    ]
    assert [(f.policy, f.hack) for f in report.findings[::3]] == [
        ("junk-format", "format-only"),
        ("everything", "degenerate"),
        ("candidates", "non-commitment"),
        ("stuffing", "stuffing"),
        ("abstain-in-format", "abstention"),
        ("checker:print", "checker"),
    ]
    assert report.summary() == (
        "`junk-format` [format-only] scored 1 > floor 0 (seed 0, task 0), reply "
        "'\\\\boxed{junk}\\n<answer>junk</answer>\\nAnswer: junk' "
        "(and 17 more: abstain-in-format, candidates, checker:print, everything, junk-format, "
        "stuffing)"
    )
    assert first.transcript() == (
        "[system] 'Compare the numbers.'\n"
        "[user] 'Which is larger, 12, or 7?'\n"
        "[assistant] '\\\\boxed{junk}\\n<answer>junk</answer>\\nAnswer: junk'"
    )
    data = report.to_dict()
    assert (data["passed"], data["floor"], data["floor_from"], data["episodes_per_policy"]) == (
        False,
        0.0,
        "reward_range",
        3,
    )
    assert data["findings"][0]["conversation"][-1] == {"role": "assistant", "content": formats}
    assert data["findings"][0]["example"] == formats
    assert data["findings"][0]["fix"] == HACKS["format-only"]
    assert data["findings"][0]["hack"] == "format-only"


def test_raising_names_the_first_finding():
    with pytest.raises(EnvCheckError) as raised:
        audit_env(Hackable(pays_length))
    assert str(raised.value).startswith(
        "hackable fails the reward audit: `longest` [length] scored 1 > floor 0 (seed 0, task 0), "
        "reply 'filler filler"
    )
    assert str(raised.value).endswith("...' (and 2 more: longest)")


def test_an_honest_env_passes_and_the_summary_lists_the_policies():
    report = audit_env(honest())
    assert report.passed and report.findings == []
    assert report.summary() == (
        "17 policies x 3 episodes at or below the floor 0 (reward_range), none paid for a hack: "
        "degenerate, format-only, length, non-commitment, stuffing, abstention, checker"
    )


def honest() -> Hackable:
    def right_answer(response: str, answer: str) -> float:
        return float(response.strip() == f"Answer: {answer}")

    return Hackable(right_answer)


# -- tools ------------------------------------------------------------------------------------


@tool(inline=True)
def weigh(item: str, grams: int, exact: bool = False) -> str:
    """Weigh an item.

    Args:
        item: What to weigh.
        grams: A guess.
        exact: Whether to weigh exactly.
    """
    raise ValueError(f"no scale for {item!r}")


@reward
def pays_any_call(state: State) -> float:
    return float(state.metrics["tool_calls"] > 0)


class ToolHackable(ToolEnv):
    """Pays for calling a tool, whatever came back."""

    name = "tool-hackable"
    tools = (weigh,)
    default_max_turns = 2

    def load_dataset(self) -> list[dict[str, Any]]:
        return [{"question": "How heavy is 1 apple?", "answer": "100"}]

    def default_rubric(self) -> Rubric:
        return Rubric([pays_any_call])


def test_a_reward_for_any_tool_call_is_caught_by_the_junk_calls():
    report = audit_env(ToolHackable(), seeds=(0,), raise_on_failure=False)
    assert report.policies == [*SINGLE_TURN[:3], "junk-tools", *SINGLE_TURN[3:], "tool-hacks"]
    assert [(f.policy, f.reward, f.hack) for f in report.findings] == [
        ("junk-tools", 1.0, "tool-calls"),
        ("everything", 1.0, "degenerate"),
        ("tool-hacks", 1.0, "checker"),
    ]
    call = '<tool_call>\n{"name": "weigh", "arguments": {"item": "junk", "grams": 0, "exact": false}}\n</tool_call>'  # noqa: E501
    conversation = report.findings[0].conversation
    assert [m["role"] for m in conversation] == ["user", "assistant", "tool", "assistant", "tool"]
    assert conversation[1]["content"] == call
    assert conversation[2]["content"].endswith("ValueError: no scale for 'junk'")


def test_junk_tool_calls_fit_each_schema_type():
    assert junk_tool_calls([], None) == ""
    assert [junk_value(spec) for spec in (
        {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"},
        {"type": "array"}, {"type": "object"}, {"type": ["null", "integer"]}, {"enum": ["a", "b"]},
        {},
    )] == ["junk", 0, 0, False, [], {}, 0, "a", "junk"]  # fmt: skip


# -- the other policies, exactly --------------------------------------------------------------


PROMPT = [
    system(
        "Reply with <guess>crane</guess> or on a line `Guess: <number>`, or in one ```python "
        "block. To call a tool:\n<tool_call>\n{}\n</tool_call>"
    ),
    user("Between -3 and 4.5, guess 2 numbers."),
]


def test_junk_in_format_fills_every_format_the_prompt_shows():
    assert junk_in_format(PROMPT, None) == (
        "\\boxed{junk}\n<answer>junk</answer>\nAnswer: junk\n<guess>junk</guess>\nGuess: junk\n"
        "```python\njunk\n```"
    )


def test_echo_repeats_the_question_every_turn_and_numbers_lists_its_numbers():
    later = [*PROMPT, Message(role="assistant", content="5"), user("Too high: 5.")]
    assert echo_prompt(PROMPT, None) == echo_prompt(later, None) == PROMPT[1].content
    assert question_numbers(later, None) == "-3 4.5 2"


def test_longest_fills_the_token_budget_or_the_default_in_lines_of_sentences():
    with_budget = Hackable(pays_empty, max_tokens=5)
    with_budget.reset(seed=0)
    assert longest_output(with_budget)([], None) == "filler filler filler filler filler."
    without = Hackable(pays_empty)
    without.reset(seed=0)
    text = longest_output(without)([], None)
    assert text.replace(".", "").split() == ["filler"] * LONGEST_TOKENS
    assert len(text.splitlines()) == LONGEST_TOKENS // 16


# -- floors, cheats and crashes ---------------------------------------------------------------


def test_format_credit_passes_only_when_declared_as_the_floor():
    declared = ArithmeticEnv(num_tasks=30)
    report = audit_env(declared)
    assert (report.floor, report.declared, report.passed) == (0.1, True, True)
    undeclared = ArithmeticEnv(num_tasks=30)
    undeclared.audit_floor = None
    report = audit_env(undeclared, raise_on_failure=False)
    assert (report.floor, report.declared) == (0.0, False)
    # Every reply with a \\boxed{} earns the 0.1, whatever is inside.
    assert {round(f.reward, 9) for f in report.findings} == {0.1}
    assert {"cheat:box the question", "everything", "junk-format", "ref:no-answer"} <= {
        f.policy for f in report.findings
    }
    assert {f.policy for f in report.findings} <= {
        p for p in report.policies if "boxed" in _reply(undeclared, p) or p.startswith("ref:")
    }


def test_the_authors_cheat_is_played_and_caught_when_the_reward_lets_it_through():
    guarded = ArithmeticEnv(num_tasks=30)
    assert (
        degenerate_policies(guarded)["cheat:box the question"]
        is ArithmeticEnv.cheats["box the question"]
    )
    assert audit_env(guarded).passed
    # math-verify evaluates the boxed expression: the hack the env's number_answer shuts out.
    lenient = ArithmeticEnv(num_tasks=30, rubric=Rubric([math_answer(), has_answer(0.1)]))
    report = audit_env(lenient, raise_on_failure=False)
    assert [(f.policy, f.task, f.reward) for f in report.findings] == [
        ("cheat:box the question", 0, pytest.approx(1.1)),
        ("cheat:box the question", 14, pytest.approx(1.1)),
        ("cheat:box the question", 29, pytest.approx(1.1)),
    ]
    question = report.findings[0].conversation[1]["content"]
    expression = re.fullmatch(r"What is (.+)\?", question).group(1)
    assert report.findings[0].conversation[2]["content"] == f"\\boxed{{{expression}}}"


def test_a_floor_that_proves_nothing_fails():
    vacuous = Hackable(pays_boxed)
    vacuous.audit_floor = 1.0
    report = audit_env(vacuous, raise_on_failure=False)
    assert (report.passed, report.findings) == (False, [])
    assert report.summary() == (
        "audit_floor 1 is not below the top of reward_range (1): no policy could fail the audit; "
        "set it to what the answer's form alone pays"
    )
    unbounded = Hackable(pays_boxed)
    unbounded.reward_range = (float("-inf"), 1.0)
    assert audit_env(unbounded, raise_on_failure=False).summary() == (
        "no finite floor to audit against: reward_range is (-inf, 1.0); "
        "declare a finite reward_range (or audit_floor)"
    )


class CrashesOnJunk(MultiTurnEnv):
    """Reads every reply as an integer, and raises on anything else."""

    name = "crashes-on-junk"
    default_max_turns = 2

    def load_dataset(self) -> list[dict[str, Any]]:
        return [{"question": "Say a number."}]

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        return [user(str(int(turn.message.content or "0") + 1))]


def test_a_crash_under_junk_is_a_finding_with_the_turns_played():
    report = audit_env(CrashesOnJunk(), seeds=(0,), raise_on_failure=False)
    # Every reply but the empty one is no integer; the env raises on each.
    assert [(f.policy, f.reward, f.hack) for f in report.findings] == [
        (name, None, "crash") for name in SINGLE_TURN[1:] if name != "numbers"
    ]  # `numbers` writes "" (the question has no number), which reads as 0
    echo = report.findings[0]
    assert echo.error == "ValueError: invalid literal for int() with base 10: 'Say a number.'"
    assert echo.conversation == [{"role": "assistant", "content": "Say a number."}]
    assert echo.describe(0.0) == (
        "`echo` [crash] crashed the episode (seed 0, task 0): "
        "ValueError: invalid literal for int() with base 10: 'Say a number.'"
    )


# -- the built-in envs ------------------------------------------------------------------------


def test_the_hacks_the_audit_found_in_builtin_envs_stay_caught_with_their_old_rewards():
    # The calculator paid math-verify's reading of the echoed question ("Compute: 73 * (...)").
    calculator = envhub.make("calculator", rubric=Rubric([math_answer()]))
    found = audit_env(calculator, raise_on_failure=False).findings
    assert [(f.policy, f.task, f.reward) for f in found] == [("echo", 0, 1.0), ("echo", 999, 1.0)]
    # code-fix paid the share of cases that the buggy code, echoed back unchanged, passes.
    code_fix = envhub.make("code-fix", rubric=Rubric([code_tests(partial=True)]))
    found = audit_env(code_fix, raise_on_failure=False).findings
    assert [(f.policy, f.task, round(f.reward, 3)) for f in found] == [
        ("echo", 10, 0.333),
        ("echo", 21, 0.333),
    ]
    assert found[0].conversation[-1]["content"].startswith("Write a function `mean(xs)`")


def _reply(env: Any, policy: str) -> str:
    """What ``policy`` (one that does not depend on the episode) writes on the env's first task."""
    policies = degenerate_policies(env)
    if policy not in policies:
        return ""
    prompt, _ = env.reset(seed=0, options={"task_index": 0})
    return policies[policy](prompt, env.tool_schemas)


FLOORS = {"arithmetic": 0.1, "gsm8k": 0.1}
RANGE_FLOORS = {"setter-solver": -1.0, "tic-tac-toe": -1.0}  # reward_range's low end, not declared
WITH_TOOLS = {"calculator", "code-fix", "repo-repair"}
CHEATS = {
    "arithmetic": ["cheat:box the question"],
    "repo-repair": [
        "cheat:delete_the_tests",
        "cheat:replace_the_tests",
        "cheat:conftest_passes_everything",
        "cheat:config_deselects_everything",
        "cheat:exit_0_during_collection",
        "cheat:background_forges_the_report",
        "cheat:package_forges_the_verdict_and_exits",
        "cheat:package_hunts_the_key",
        "cheat:package_patches_pytest",
        "cheat:sitecustomize_patches_pytest",
        "cheat:planted_pytest_plugin",
    ],
}
WITHOUT_REFERENCE = {"gsm8k", "setter-solver", "tic-tac-toe"}


@pytest.mark.parametrize("name", BUILTIN)
def test_every_builtin_env_passes_the_audit(name: str):
    with envhub.make(name) as env:
        report = audit_env(env)
    tools = name in WITH_TOOLS
    assert report.passed and report.findings == []
    assert report.hacks == [
        "degenerate", "format-only", *(["tool-calls"] if tools else []), "length",
        "non-commitment", "stuffing", "abstention", *(["checker"] if tools else []),
        *(["cheat"] if name in CHEATS else []),
        *([] if name in WITHOUT_REFERENCE else ["form-without-answer"]),
        *([] if tools else ["checker"]),
        *([] if name in WITHOUT_REFERENCE else ["calibration"]),
    ]  # fmt: skip
    assert report.policies[:3] == ["empty", "echo", "junk-format"]
    assert [p for p in report.policies if p.startswith("cheat:")] == CHEATS.get(name, [])
    assert ("ref:no-answer" in report.policies) is (name not in WITHOUT_REFERENCE)
    assert (report.floor, report.declared, report.episodes) == (
        FLOORS.get(name, RANGE_FLOORS.get(name, 0.0)),
        name in FLOORS,
        3,
    )
