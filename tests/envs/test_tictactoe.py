"""tic-tac-toe: the exact minimax checker on known positions, the zero-sum rewards, the fixed
opponents and the per-move optimality metric."""

from __future__ import annotations

import numpy as np
import pytest

from envhub.checks.checker import check_env
from envhub.envs.tictactoe import (
    TicTacToeEnv,
    best_moves,
    openings,
    parse_board,
    parse_move,
    perfect_player,
    random_player,
    render,
    value,
    winner,
)
from envhub.errors import ConfigError
from envhub.types import user


@pytest.mark.parametrize(
    ("board", "expected_value", "expected_best"),
    [
        (".........", 0, list(range(9))),  # every opening move draws
        ("x........", 0, [4]),  # after a corner, only the centre draws
        ("....x....", 0, [0, 2, 6, 8]),  # after the centre, only a corner draws
        (".x.......", 0, [0, 2, 4, 7]),  # after an edge: the centre, its corners, the far edge
        ("xx.oo....", 1, [2]),  # X completes the top row
        ("xx.o.....", -1, [2, 4, 5, 6, 7, 8]),  # O blocks at 2, but X still forks: O loses
    ],
)
def test_minimax_on_known_positions(
    board: str, expected_value: int, expected_best: list[int]
) -> None:
    assert value(board) == expected_value
    if expected_value >= 0:
        assert best_moves(board) == expected_best
    else:  # lost whatever O does: every move keeps the (losing) value
        assert best_moves(board) == [i for i in range(9) if board[i] == "."]


def test_finished_boards() -> None:
    assert winner("xxxoo....") == "x" and value("xxxoo....") == -1  # the side to move has lost
    assert winner("xoxxoooxx") is None and value("xoxxoooxx") == 0  # a full board, drawn
    assert winner("o...o...o") == "o"


def test_board_text_round_trips_and_moves_parse() -> None:
    for board in ("x...o....", "xoxxoooxx", "........."):
        assert parse_board([user(f"X took cell 1.\n{render(board)}\n\nYour move.")]) == board
    assert render("x...o....") == "X | 2 | 3\n---------\n4 | O | 6\n---------\n7 | 8 | 9"
    assert parse_move("I take cell 5") == 4 and parse_move("7") == 6
    assert parse_move("cell 10 or 3") == 2 and parse_move("no digits") is None
    assert len(openings()) == 73


def play(env: TicTacToeEnv, moves: list[str], seed: int = 0, task: int = 0) -> list[tuple]:
    observation, info = env.reset(seed=seed, options={"task_index": task})
    steps = [(info["to_move"], observation)]
    for move in moves:
        observation, reward, terminated, truncated, info = env.step(move)
        steps.append((info["to_move"], reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return steps


def test_self_play_turns_and_a_win() -> None:
    env = TicTacToeEnv()
    steps = play(env, ["1", "5", "2", "9", "3"])
    assert [s[0] for s in steps] == ["x", "o", "x", "o", "x", None]
    *_, (role, reward, terminated, truncated, info) = steps
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["role_results"] == {"x": "win", "o": "loss"}
    assert info["role_rewards"] == {"x": 1.0, "o": -1.0}  # zero-sum
    assert info["role_components"] == {"x": {"outcome": 1.0}, "o": {"outcome": -1.0}}


def test_an_invalid_or_taken_cell_loses_at_once() -> None:
    env = TicTacToeEnv()
    *_, last = play(env, ["1", "1"])
    assert last[4]["role_results"] == {"o": "invalid", "x": "win"}
    assert last[1] == -1.0 and last[4]["role_rewards"] == {"o": -1.0, "x": 1.0}
    *_, last = play(env, ["I pass"])
    assert last[4]["role_results"] == {"x": "invalid", "o": "win"}


def test_a_draw_pays_nothing() -> None:
    # X: 5 1 3 8 6 ... a drawn line of play on the empty board.
    env = TicTacToeEnv()
    *_, last = play(env, ["5", "1", "3", "7", "4", "6", "9", "2", "8"])
    assert last[4]["role_results"] == {"x": "draw", "o": "draw"}
    assert last[4]["role_rewards"] == {"x": 0.0, "o": 0.0}


def test_perfect_play_never_loses_against_random() -> None:
    rng = np.random.default_rng(0)
    for seed in range(20):
        env = TicTacToeEnv(opponent="perfect")
        observation, info = env.reset(seed=seed, options={"task_index": 0})
        total, done = 0.0, False
        while not done:
            observation, reward, terminated, truncated, info = env.step(
                random_player(env.match.views["x"], rng)
            )
            total += reward
            done = terminated or truncated
        assert total <= 0.0 and info["role_results"]["x"] in ("loss", "draw")


def test_perfect_against_perfect_always_draws_from_the_empty_board() -> None:
    rng = np.random.default_rng(1)
    for seed in range(10):
        env = TicTacToeEnv(opponent="perfect")
        env.reset(seed=seed, options={"task_index": 0})
        done = False
        while not done:
            *_, terminated, truncated, info = env.step(perfect_player(env.match.views["x"], rng))
            done = terminated or truncated
        assert info["role_results"] == {"x": "draw", "o": "draw"}
        assert info["metrics"]["optimal/x"] == info["metrics"]["optimal/o"] == 1.0


def test_bad_role_settings_are_clear_errors() -> None:
    with pytest.raises(ConfigError, match="unknown role"):
        TicTacToeEnv(policies={"z": "random"})
    with pytest.raises(ConfigError, match="unknown fixed policy 'best'.*perfect, random"):
        TicTacToeEnv(opponent="best")
    with pytest.raises(ConfigError, match="fixes every role"):
        TicTacToeEnv(policies={"x": "random", "o": "random"})
    env = TicTacToeEnv(opponent="envhub.envs.tictactoe:perfect_player")
    assert env.fixed["o"] is perfect_player and env.trained_roles == ("x",)


@pytest.mark.parametrize("opponent", [None, "random", "perfect"])
def test_check_env_passes(opponent: str | None) -> None:
    report = check_env(TicTacToeEnv(opponent=opponent))
    assert report.passed
