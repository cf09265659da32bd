"""``tic-tac-toe``: a two-player game with a perfect-play checker.

Roles ``x`` and ``o`` take turns; the policy plays both (self-play) unless one is given a fixed
policy: ``random`` or ``perfect`` (exact minimax), through ``opponent=`` (fixes ``o``) or
``policies={"x": ...}``. Rewards are zero-sum: +1 for a win, -1 for a loss, 0 for a draw; a
move that names no free cell loses at once (result ``invalid``, the other side ``win``).

Every move is graded against the exact minimax value of its position: the metric
``optimal/<actor>`` is the share of that actor's moves that keep the best value it could get.
Tasks are the empty board and every opening of one X and one O move (73 in all).
"""

from __future__ import annotations

import functools
import re
from typing import Any, ClassVar

import numpy as np

from envhub.roles import Match, MultiRoleEnv
from envhub.types import AssistantTurn, Message, system, user

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
EMPTY = "." * 9
_ROW = re.compile(r"^\s*(\S) \| (\S) \| (\S)\s*$")
_CELL = re.compile(r"\b([1-9])\b")


def winner(board: str) -> str | None:
    """``x`` or ``o`` when that mark holds a line, else ``None``."""
    for a, b, c in LINES:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return board[a]
    return None


def to_move(board: str) -> str:
    """Whose move it is on ``board`` (X moves first)."""
    return "x" if board.count("x") == board.count("o") else "o"


@functools.cache
def value(board: str) -> int:
    """Exact minimax value of ``board`` for the player to move: +1 win, 0 draw, -1 loss."""
    if winner(board) is not None:
        return -1  # the previous move won
    moves = [i for i in range(9) if board[i] == "."]
    if not moves:
        return 0
    mark = to_move(board)
    return max(-value(board[:i] + mark + board[i + 1 :]) for i in moves)


def best_moves(board: str) -> list[int]:
    """The cells (0-8) whose move keeps the player to move at :func:`value`."""
    mark, target = to_move(board), value(board)
    return [
        i
        for i in range(9)
        if board[i] == "." and -value(board[:i] + mark + board[i + 1 :]) == target
    ]


def render(board: str) -> str:
    """The board as three rows, free cells shown by their number (1-9)."""
    cells = [c.upper() if c != "." else str(i + 1) for i, c in enumerate(board)]
    rows = [" | ".join(cells[r : r + 3]) for r in (0, 3, 6)]
    return "\n---------\n".join(rows)


def parse_board(messages: list[Message]) -> str:
    """The last board drawn in ``messages`` (as :func:`render` draws it).

    Raises:
        ValueError: No board in the messages.
    """
    for message in reversed(messages):
        rows = [m.groups() for m in map(_ROW.match, (message.content or "").splitlines()) if m]
        if len(rows) >= 3:
            cells = [c for row in rows[-3:] for c in row]
            return "".join(c.lower() if c in "XO" else "." for c in cells)
    raise ValueError("no board in the conversation")


def parse_move(text: str) -> int | None:
    """The cell (0-8) a reply names: its last standalone digit 1-9, or ``None``."""
    found = _CELL.findall(text)
    return int(found[-1]) - 1 if found else None


def random_player(messages: list[Message], rng: np.random.Generator) -> str:
    """A fixed policy: any free cell, uniformly."""
    board = parse_board(messages)
    free = [i for i in range(9) if board[i] == "."]
    return str(int(rng.choice(free)) + 1)


def perfect_player(messages: list[Message], rng: np.random.Generator) -> str:
    """A fixed policy: a minimax-optimal cell, uniformly among the optimal ones."""
    return str(int(rng.choice(best_moves(parse_board(messages)))) + 1)


def openings() -> list[dict[str, Any]]:
    """The empty board, then every board after one X move and one O move."""
    tasks = [{"board": EMPTY}]
    for x in range(9):
        for o in range(9):
            if o != x:
                board = list(EMPTY)
                board[x], board[o] = "x", "o"
                tasks.append({"board": "".join(board)})
    return tasks


class TicTacToeEnv(MultiRoleEnv):
    """Tic-tac-toe between the roles ``x`` and ``o`` (see the module doc).

    Args:
        opponent: A fixed policy for ``o`` (``random``, ``perfect`` or ``"module:function"``);
            ``None``: the policy plays both sides.
        policies: Fixed policies by role, for finer control (``{"x": "perfect"}``).
    """

    name = "tic-tac-toe"
    version = "0.1.0"
    roles = ("x", "o")
    reward_mode = "zero_sum"
    reward_range = (-1.0, 1.0)
    fixed_policies: ClassVar = {"random": random_player, "perfect": perfect_player}
    default_max_turns = 9

    def __init__(
        self,
        opponent: str | None = None,
        *,
        policies: dict[str, Any] | None = None,
        max_turns: int | None = None,
    ) -> None:
        policies = dict(policies or {})
        if opponent is not None:
            policies.setdefault("o", opponent)
        super().__init__(policies=policies, max_turns=max_turns)
        self.opponent = opponent

    def tasks(self) -> list[dict[str, Any]]:
        """The openings (:func:`openings`)."""
        return _OPENINGS

    def setup(self, match: Match) -> None:
        """Both sides get the rules; the side to move gets the board."""
        board = match.task["board"]
        match.data["board"] = board
        for actor in self.roles:
            match.tell(actor, system(_rules(actor)))
        mover = to_move(board)
        match.tell(mover, user(f"{render(board)}\n\nYour move."))
        match.to_move = mover

    def play(self, match: Match, actor: str, turn: AssistantTurn) -> None:
        """Place ``actor``'s mark, grade the move, and end the game or pass the turn."""
        board = match.data["board"]
        other = "o" if actor == "x" else "x"
        cell = parse_move(turn.message.content or "")
        match.metrics[f"moves/{actor}"] += 1
        if cell is None or board[cell] != ".":
            match.pay(actor, -1.0)
            match.pay(other, 1.0)
            match.end({actor: "invalid", other: "win"})
            return self._grade(match)
        match.metrics[f"optimal_moves/{actor}"] += cell in best_moves(board)
        board = board[:cell] + actor + board[cell + 1 :]
        match.data["board"] = board
        if winner(board) or "." not in board:
            won = winner(board) == actor
            match.pay(actor, 1.0 if won else 0.0)
            match.pay(other, -1.0 if won else 0.0)
            match.end({actor: "win", other: "loss"} if won else {actor: "draw", other: "draw"})
            return self._grade(match)
        match.tell(
            other, user(f"{actor.upper()} took cell {cell + 1}.\n{render(board)}\n\nYour move.")
        )
        match.to_move = other

    @staticmethod
    def _grade(match: Match) -> None:
        for actor in ("x", "o"):
            moves = match.metrics.get(f"moves/{actor}", 0)
            if moves:
                match.metrics[f"optimal/{actor}"] = (
                    match.metrics.get(f"optimal_moves/{actor}", 0) / moves
                )


def _rules(actor: str) -> str:
    return (
        f"You play tic-tac-toe as {actor.upper()}. Cells are numbered 1-9, left to right, top to "
        "bottom; a free cell shows its number. On your turn, reply with the number of a free "
        "cell. Three in a row wins."
    )


_OPENINGS = openings()
