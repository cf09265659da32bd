"""Multi-role episodes in the trainer: each side's tokens reach the loss token for token with
SmolLM2's real tokenizer, groups and advantages are per role (checked by hand), metrics are
logged per role, and a game against a fixed opponent trains exactly as the same game written
as a one-role env."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from envhub.envs.setter_solver import SetterSolverEnv
from envhub.envs.tictactoe import (
    TicTacToeEnv,
    _rules,
    openings,
    parse_move,
    random_player,
    render,
    winner,
)
from envhub.errors import ConfigError
from envhub.inference.base import SamplingParams
from envhub.multiturn import MultiTurnEnv
from envhub.rewards.rubric import Rubric, reward
from envhub.rollout.runner import RolloutRunner
from envhub.state import State
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.trainer.batch import build_batch, collate
from envhub.trainer.config import AlgorithmConfig
from envhub.trainer.greedy_baselines import GreedyBaselines
from envhub.trainer.rollout_jobs import RolloutJob, RunnerOptions, run_job
from envhub.trainer.scoring import estimate_advantages, has_signal, score
from envhub.trainer.step import role_metrics
from envhub.types import AssistantTurn, Message, Trajectory, system, user

from .test_multiturn_masks import SampledAsTokens  # SmolLM2's template, sampled as token ids


def side(messages: list[Message]) -> str:
    return "x" if "as X" in (messages[0].content or "") else "o"


def x_wins(messages: list[Message], tools: Any) -> str:
    """X plays 1, 2, 3; O plays 5, 9 (with some words around the cell, as a model writes)."""
    turn = sum(m.role == "assistant" for m in messages)
    move = {"x": ["1", "2", "3"], "o": ["5", "9"]}[side(messages)][turn]
    return f"I take cell {move}."


@pytest.fixture(scope="module")
def smollm2_game(smollm2_dir: Path) -> tuple[list[Trajectory], SampledAsTokens]:
    tokenizer = SampledAsTokens(AutoTokenizer.from_pretrained(smollm2_dir))
    engine = ScriptedEngine(x_wins, tokenizer=tokenizer)
    runner = RolloutRunner(engine, TicTacToeEnv, max_concurrency=1, seed=2)
    return asyncio.run(runner.run([0], samples_per_task=1)), tokenizer


def expected_mask(t: Trajectory, tokenizer: SampledAsTokens) -> list[int]:
    """1 exactly on each of the side's own turns, located by rendering its history before it."""
    mask = [0] * len(t.token_ids)
    for k, message in enumerate(t.messages):
        if message.role != "assistant":
            continue
        start = len(tokenizer.render_sync(t.messages[:k], None, add_generation_prompt=True))
        span = tokenizer.encode(message.content) + [tokenizer.eos_token_id]
        assert t.token_ids[start : start + len(span)] == span, f"{t.role}: turn at message {k}"
        mask[start : start + len(span)] = [1] * len(span)
    return mask


def test_each_sides_mask_is_one_exactly_on_its_own_sampled_tokens(
    smollm2_game: tuple[list[Trajectory], SampledAsTokens],
) -> None:
    trajectories, tokenizer = smollm2_game
    assert [t.role for t in trajectories] == ["x", "o"]
    for t in trajectories:
        mask = expected_mask(t, tokenizer)
        assert t.loss_mask == mask and not t.token_drift
        sampled = tokenizer.decode([i for i, m in zip(t.token_ids, mask, strict=True) if m])
        own = [m.content for m in t.messages if m.role == "assistant"]
        assert sampled == "".join(f"{text}<|im_end|>" for text in own)
        # The other side's moves are in this side's tokens only as the env told them (mask 0).
        context = tokenizer.decode([i for i, m in zip(t.token_ids, mask, strict=True) if not m])
        other = "O" if t.role == "x" else "X"
        assert f"{other} took cell" in context and "I take cell" not in context


def test_micro_batch_targets_carry_each_sides_mask_shifted_by_one(
    smollm2_game: tuple[list[Trajectory], SampledAsTokens],
) -> None:
    trajectories, tokenizer = smollm2_game
    batch = build_batch(trajectories, AlgorithmConfig(dynamic_sampling=False), max_tokens=512)
    assert [s.advantage for s in batch.samples] == [0.0, 0.0]  # one sample per role group
    mb = collate(batch.samples, [0, 1], pad_id=0)
    for row, t in enumerate(trajectories):
        mask = expected_mask(t, tokenizer)
        for k in range(len(t.token_ids) - 1):
            assert mb.loss_mask[row, k].item() == mask[k + 1], f"{t.role} position {k}"
            assert mb.input_ids[row, k + 1].item() == t.token_ids[k + 1]


class Classroom:
    """Setter writes ``12 * 3 + 4`` (40); the solvers' answers come from ``answers`` in turn."""

    def __init__(self, answers: list[str]) -> None:
        self.answers, self.count = answers, 0

    def __call__(self, messages: list[Message], tools: Any) -> str:
        if "You write arithmetic problems" in (messages[0].content or ""):
            return "<problem>12 * 3 + 4</problem>"
        self.count += 1
        return self.answers[(self.count - 1) % len(self.answers)]


@pytest.fixture(scope="module")
def classroom() -> list[Trajectory]:
    # Sample 0: two of four solvers right (the setter's problem is at the edge: 1.0);
    # sample 1: all four right (too easy: 0.0).
    policy = Classroom(["40", "41", "\\boxed{40}", "7", "40", "40", "40", "40"])
    engine = ScriptedEngine(policy, tokenizer=ByteChatTokenizer())
    runner = RolloutRunner(engine, SetterSolverEnv, max_concurrency=1, seed=0)
    return asyncio.run(runner.run([0], samples_per_task=2))


def test_groups_and_advantages_are_per_role_by_hand(classroom: list[Trajectory]) -> None:
    keys = [t.group_key for t in classroom]
    assert keys == ["g0/setter"] + ["g0/s0/solver"] * 4 + ["g0/setter"] + ["g0/s1/solver"] * 4
    scored = score(classroom, AlgorithmConfig(advantage="dr_grpo"), max_tokens=512)
    assert scored.rewards.tolist() == [1.0, 1, 0, 1, 0, 0.0, 1, 1, 1, 1]
    assert scored.groups.tolist() == [0, 1, 1, 1, 1, 0, 2, 2, 2, 2]
    advantages = estimate_advantages(scored, AlgorithmConfig(advantage="dr_grpo")).sequence
    # r - group mean: setters 1 and 0 (mean 0.5); solvers of problem 0: mean 0.5; of problem
    # 1: all right, mean 1.
    expected = [0.5, 0.5, -0.5, 0.5, -0.5, -0.5, 0.0, 0.0, 0.0, 0.0]
    assert advantages.tolist() == expected
    grpo = estimate_advantages(scored, AlgorithmConfig(advantage="grpo")).sequence
    std = (1 / 3) ** 0.5  # unbiased std of [1, 0, 1, 0]; of the setters' [1, 0]: sqrt(0.5)
    hand = [0.5 / 0.5**0.5, 0.5 / std, -0.5 / std, 0.5 / std, -0.5 / std, -0.5 / 0.5**0.5]
    assert torch.allclose(grpo[:6], torch.tensor(hand, dtype=torch.float64), atol=1e-5)
    assert grpo[6:].tolist() == [0.0] * 4


def test_metrics_are_logged_per_role(classroom: list[Trajectory]) -> None:
    assert role_metrics(classroom) == {
        "reward/setter": 0.5,
        "reward/solver": 0.75,
        "rollout/episodes/setter": 2.0,
        "rollout/episodes/solver": 8.0,
    }
    assert role_metrics([t.model_copy(update={"role": None}) for t in classroom]) == {}


def test_a_task_with_roles_keeps_its_group_while_any_role_has_signal(
    classroom: list[Trajectory],
) -> None:
    algorithm = AlgorithmConfig()
    assert has_signal(classroom, algorithm, 512)
    tied = [t.model_copy(update={"reward": 1.0}) for t in classroom]
    assert not has_signal(tied, algorithm, 512)


def test_run_job_hands_on_each_task_once_with_all_its_roles() -> None:
    options = RunnerOptions(SamplingParams(max_tokens=64), 2, 2, None, None)
    job = RolloutJob(env_index=0, tasks=(0, 5), seed=1, prefix="s0e0")
    groups: list[tuple[int, list[Trajectory]]] = []
    engine = ScriptedEngine(x_wins, tokenizer=ByteChatTokenizer())
    trajectories = asyncio.run(
        run_job(engine, TicTacToeEnv, job, options, on_group=lambda p, g: groups.append((p, g)))
    )
    # Task 5's board has X on cell 1 already: X's "1" is invalid and O never moves, so that
    # task's episodes have one trajectory each (X's), the empty board's two.
    assert [t.group_id for t in trajectories] == ["s0e0g0"] * 4 + ["s0e0g1"] * 2
    assert [t.role for t in trajectories] == ["x", "o", "x", "o", "x", "x"]
    assert sorted((p, len(g)) for p, g in groups) == [(0, 4), (1, 2)]
    assert {t.group_id for _, g in groups for t in g} == {"s0e0g0", "s0e0g1"}


# -- a fixed opponent reduces to the one-role case -------------------------------------------


class SoloTicTacToe(MultiTurnEnv):
    """Tic-tac-toe as X against the ``random`` player, written as a one-role env: what
    ``TicTacToeEnv(opponent="random")`` must train exactly like."""

    name = "solo-tic-tac-toe"
    default_max_turns = 9
    reward_range = (-1.0, 1.0)

    def load_dataset(self) -> list[dict[str, Any]]:
        return openings()

    def format_prompt(self, task: dict[str, Any]) -> list[Message]:
        return [system(_rules("x")), user(f"{render(task['board'])}\n\nYour move.")]

    def default_rubric(self) -> Rubric:
        return Rubric([reward(lambda state: state.data["outcome"], name="outcome")])

    async def setup_state(self, state: State) -> None:
        state.data["board"] = state.task["board"]

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        board, cell = state.data["board"], parse_move(turn.message.content or "")
        if cell is None or board[cell] != ".":
            return self._end(state, -1.0)
        board = board[:cell] + "x" + board[cell + 1 :]
        if winner(board) or "." not in board:
            return self._end(state, 1.0 if winner(board) else 0.0)
        move = int(random_player([user(render(board))], self.np_random)) - 1
        board = board[:move] + "o" + board[move + 1 :]
        state.data["board"] = board
        if winner(board) or "." not in board:
            return self._end(state, -1.0 if winner(board) else 0.0)
        return [user(f"O took cell {move + 1}.\n{render(board)}\n\nYour move.")]

    @staticmethod
    def _end(state: State, outcome: float) -> list[Message]:
        state.data["outcome"], state.done = outcome, True
        return []


def first_free(messages: list[Message], tools: Any) -> str:
    """X takes the first free cell (a plain policy both envs can be driven by)."""
    board = "".join(
        "." if c.isdigit() else c.lower()
        for line in (messages[-1].content or "").splitlines()
        if "|" in line
        for c in line.replace(" ", "").split("|")
    )
    return f"I take cell {board.index('.') + 1}."


def test_a_fixed_opponent_trains_exactly_like_the_one_role_env() -> None:
    def rollouts(factory: Any) -> list[Trajectory]:
        engine = ScriptedEngine(first_free, tokenizer=ByteChatTokenizer())
        runner = RolloutRunner(engine, factory, max_concurrency=2, seed=11)
        return asyncio.run(runner.run([0, 7, 40], samples_per_task=3))

    multi = rollouts(lambda: TicTacToeEnv(opponent="random"))
    solo = rollouts(SoloTicTacToe)
    assert [t.role for t in multi] == ["x"] * 9 and [t.role for t in solo] == [None] * 9
    for m, s in zip(multi, solo, strict=True):
        assert m.token_ids == s.token_ids and m.loss_mask == s.loss_mask
        assert [x.to_openai() for x in m.messages] == [x.to_openai() for x in s.messages]
        assert (m.reward, [r.reward for r in m.turns]) == (s.reward, [r.reward for r in s.turns])
    assert len({t.reward for t in multi}) > 1  # the games differ: a real comparison
    algorithm = AlgorithmConfig()
    a = estimate_advantages(score(multi, algorithm, 512), algorithm).sequence
    b = estimate_advantages(score(solo, algorithm, 512), algorithm).sequence
    assert a.tolist() == b.tolist()
    batch_m, batch_s = (build_batch(t, algorithm, max_tokens=512) for t in (multi, solo))
    assert [(s.token_ids, s.loss_mask, s.advantage) for s in batch_m.samples] == [
        (s.token_ids, s.loss_mask, s.advantage) for s in batch_s.samples
    ]


def test_remax_refuses_an_env_with_roles(classroom: list[Trajectory]) -> None:
    with pytest.raises(ConfigError, match="remax needs one greedy episode per task"):
        GreedyBaselines([0]).baseline(classroom[0])
