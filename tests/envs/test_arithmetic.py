"""The arithmetic env: exact tasks per difficulty, answers recomputed independently, scoring."""

from __future__ import annotations

import re

import pytest

from envhub.checks.checker import check_env
from envhub.envs.arithmetic import ArithmeticEnv, problem_set, reference_policy
from envhub.errors import EnvhubError
from envhub.types import user

_SAFE = re.compile(r"^[\d +\-*()]+$")


def independent_value(expression: str) -> int:
    """Python's own arithmetic, on text that holds only digits, operators and parentheses."""
    assert _SAFE.match(expression), expression
    return eval(expression, {"__builtins__": {}})


def expression_of(task: dict) -> str:
    return re.fullmatch(r"What is (.+)\?", task["question"]).group(1)


@pytest.mark.parametrize(
    ("difficulty", "questions", "answers"),
    [
        ("tiny", ["3 + 3", "8 - 3", "4 - 2"], ["6", "5", "2"]),
        ("easy", ["79 + 36", "97 + 70", "98 - 35"], ["115", "167", "63"]),
        ("medium", ["3 * 11 * 3", "62 + 75 - 57", "57 + 65 * 9"], ["99", "80", "642"]),
        (
            "hard",
            ["125 - (238 + 895) * 64", "248 - (972 + (808 + 443))", "224 - (544 + 994 - 956)"],
            ["-72387", "-1975", "-358"],
        ),
    ],
)
def test_first_tasks_are_exactly_these(
    difficulty: str, questions: list[str], answers: list[str]
) -> None:
    # Worked by hand: 57 + 65*9 = 57 + 585 = 642; 125 - 1133*64 = 125 - 72512 = -72387;
    # 248 - 2223 = -1975; 224 - (1538 - 956) = 224 - 582 = -358.
    tasks = problem_set(difficulty, size=10, seed=0)
    assert [tasks[i]["question"] for i in range(3)] == [f"What is {q}?" for q in questions]
    assert [tasks[i]["answer"] for i in range(3)] == answers
    assert tasks[0]["info"] == {"expression": questions[0], "difficulty": difficulty}


@pytest.mark.parametrize("difficulty", ["tiny", "easy", "medium", "hard"])
def test_every_answer_matches_an_independent_computation(difficulty: str) -> None:
    tasks = problem_set(difficulty, size=300, seed=5)
    for task in tasks:
        assert int(task["answer"]) == independent_value(expression_of(task))


def test_easy_is_one_addition_or_subtraction_of_two_digit_numbers() -> None:
    for task in problem_set("easy", size=300, seed=1):
        a, op, b = re.fullmatch(r"(\d+) ([+-]) (\d+)", expression_of(task)).groups()
        assert 1 <= int(a) <= 99 and 1 <= int(b) <= 99
        assert 0 <= int(task["answer"]) <= 198


def test_tiny_is_every_single_digit_sum_and_difference_and_nothing_else() -> None:
    expressions = {expression_of(t) for t in problem_set("tiny", size=2000, seed=1)}
    expected = {f"{a} + {b}" for a in range(1, 10) for b in range(1, 10)} | {
        f"{a} - {b}" for a in range(1, 10) for b in range(1, a + 1)
    }
    assert expressions == expected  # 81 sums + 45 differences, all drawn in 2000 tasks


def test_medium_has_three_operands_and_some_products() -> None:
    expressions = [expression_of(t) for t in problem_set("medium", size=300, seed=1)]
    for expression in expressions:
        assert re.fullmatch(r"\d+ [+\-*] \d+ [+\-*] \d+", expression), expression
        assert independent_value(expression) >= 0
    assert sum("*" in e for e in expressions) > 100


def test_hard_has_three_or_four_operations_on_three_digit_numbers() -> None:
    expressions = [expression_of(t) for t in problem_set("hard", size=300, seed=1)]
    for expression in expressions:
        assert len(re.findall(r"(?<=\s)[+\-*](?=\s)", expression)) in (3, 4), expression
        assert max(int(n) for n in re.findall(r"\d+", expression)) <= 999
        assert abs(independent_value(expression)) <= 100_000
    assert sum("(" in e for e in expressions) > 200


def test_task_seed_changes_the_problems() -> None:
    assert problem_set("easy", 5, 0)[0] != problem_set("easy", 5, 1)[0]
    assert ArithmeticEnv(task_seed=2).dataset[3] == problem_set("easy", 1000, 2)[3]


@pytest.mark.parametrize(
    ("response", "reward", "components"),
    [
        ("The answer is \\boxed{115}.", 1.1, {"correct": 1.0, "format": 1.0}),
        ("\\boxed{116}", 0.1, {"correct": 0.0, "format": 1.0}),
        ("115", 1.0, {"correct": 1.0, "format": 0.0}),
        ("", 0.0, {"correct": 0.0, "format": 0.0}),
        ("79 + 36 = 115.", 1.0, {"correct": 1.0, "format": 0.0}),  # the last number counts
        # the hack GRPO found: box the question; math-verify would evaluate it to 115
        ("To find \\boxed{79 + 36}, we add.", 0.1, {"correct": 0.0, "format": 1.0}),
        ("\\boxed{115.0}", 1.1, {"correct": 1.0, "format": 1.0}),
        (
            "\\boxed{115} is wrong, it is 116",
            1.1,
            {"correct": 1.0, "format": 1.0},
        ),  # the boxed answer is final
    ],
)
def test_scoring(response: str, reward: float, components: dict[str, float]) -> None:
    env = ArithmeticEnv()
    prompt, _ = env.reset(seed=0, options={"task_index": 0})
    assert [m.content for m in prompt] == [
        "Solve the arithmetic problem. Give the final answer as \\boxed{NUMBER}.",
        "What is 79 + 36?",
    ]
    _, got, terminated, truncated, info = env.step(response)
    assert (got, terminated, truncated) == (pytest.approx(reward), True, False)
    assert info["reward_components"] == components


@pytest.mark.parametrize("difficulty", ["tiny", "medium", "hard"])
def test_other_difficulties_pass_check_env(difficulty: str) -> None:
    assert check_env(ArithmeticEnv(difficulty=difficulty)).passed


def test_reference_policy_answers_every_level() -> None:
    for difficulty in ("tiny", "easy", "medium", "hard"):
        for task in list(problem_set(difficulty, size=50, seed=9)):
            assert (
                reference_policy([user(task["question"])], None) == f"\\boxed{{{task['answer']}}}"
            )


def test_unknown_difficulty_is_refused() -> None:
    with pytest.raises(EnvhubError, match="tiny, easy, medium, hard"):
        ArithmeticEnv(difficulty="expert")


def test_difficulties_are_the_levels_a_curriculum_moves_between() -> None:
    assert ArithmeticEnv.levels == ("tiny", "easy", "medium", "hard")
    assert ArithmeticEnv.level_arg == "difficulty"
    assert ArithmeticEnv(difficulty="medium", num_tasks=1).current_level() == "medium"
    assert ArithmeticEnv(num_tasks=1).current_level() == "easy"
