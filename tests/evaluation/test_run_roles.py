"""``evaluate`` and ``summarize`` on multi-role envs: an episode counts once however many
trajectories (one per actor) it records, each role's row counts that role's trajectories, and
pass@k is per task and role (a role's seats together), checked by hand."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from envhub.envs.setter_solver import SetterSolverEnv
from envhub.envs.tictactoe import TicTacToeEnv
from envhub.evaluation import count_episodes, evaluate, summarize
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.types import Message


class Classroom:
    """The setter writes ``12 * 3 + 4`` (40); solvers answer right, wrong, right, in turn."""

    def __init__(self) -> None:
        self.solvers = 0

    def __call__(self, messages: list[Message], tools: Any) -> str:
        if "You write arithmetic problems" in (messages[0].content or ""):
            return "<problem>12 * 3 + 4</problem>"
        self.solvers += 1
        return ["\\boxed{40}", "41", "40"][(self.solvers - 1) % 3]


def test_setter_solver_counts_episodes_and_takes_pass_at_k_per_task_and_role() -> None:
    engine = ScriptedEngine(Classroom(), tokenizer=ByteChatTokenizer())
    factory = lambda: SetterSolverEnv(attempts=3)  # noqa: E731
    result = asyncio.run(evaluate(engine, factory, [0, 1], samples_per_task=2, max_concurrency=1))
    s = result.summary
    # 2 tasks x 2 episodes, each a setter and 3 solvers (2 of 3 right: in the band, setter 1.0).
    assert (s.episodes, s.tasks, s.samples_per_task, s.trajectories) == (4, 2, 2, 16)
    setter, solver = s.roles["setter"], s.roles["solver"]
    assert (setter["trajectories"], solver["trajectories"]) == (4, 12)
    assert setter["pass_at"] == {1: 1.0, 2: 1.0}
    # A task's 6 solver samples, 4 right: pass@2 = 1 - C(2,2)/C(6,2) = 14/15; 4 and 6: 1.
    assert solver["pass_at"] == {1: pytest.approx(4 / 6), 2: pytest.approx(14 / 15), 4: 1.0, 6: 1.0}
    # Overall: the mean over (task, role), k up to the fewest samples (the setters' 2).
    assert s.pass_at == {1: pytest.approx((1 + 4 / 6) / 2), 2: pytest.approx((1 + 14 / 15) / 2)}


def first_free(messages: list[Message], tools: Any) -> str:
    """Take the first free cell of the last board shown."""
    board = [line for line in (messages[-1].content or "").splitlines() if "|" in line]
    return next(c.strip() for line in board for c in line.split("|") if c.strip().isdigit())


def test_self_play_counts_each_game_once_and_each_side_in_its_row() -> None:
    engine = ScriptedEngine(first_free, tokenizer=ByteChatTokenizer())
    result = asyncio.run(evaluate(engine, TicTacToeEnv, [0, 7], samples_per_task=3))
    s = result.summary
    assert (s.episodes, s.tasks, s.samples_per_task, s.trajectories) == (6, 2, 3, 12)
    assert (s.roles["x"]["trajectories"], s.roles["o"]["trajectories"]) == (6, 6)
    # The same moves every time: on the empty board X wins on the diagonal 3-5-7; after X 1
    # and O 8, O wins on 3-5-7. Each side wins one task of two, always or never.
    assert [t.reward for t in result.trajectories if t.role == "x"] == [1.0] * 3 + [-1.0] * 3
    for role in ("x", "o"):
        assert s.roles[role]["pass_at"] == {1: 0.5, 2: 0.5, 3: 0.5}
    assert s.pass_at == {1: 0.5, 2: 0.5, 3: 0.5}


def test_one_role_summaries_count_as_before() -> None:
    engine = ScriptedEngine(first_free, tokenizer=ByteChatTokenizer())
    game = asyncio.run(evaluate(engine, TicTacToeEnv, [0], samples_per_task=2)).trajectories
    solo = [t.model_copy(update={"role": None}) for t in game]
    assert count_episodes(game) == 2 and count_episodes(solo) == 4
    assert summarize(solo).episodes == summarize(solo).trajectories == 4
    assert summarize(solo).roles == {}
