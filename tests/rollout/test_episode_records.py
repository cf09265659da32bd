"""Whole episode records, one-role and multi-role, byte for byte but for timings: every
trajectory field (tokens, masks, logprobs, messages, turns, rewards, components, metrics,
errors, info, outcome) of scenarios covering each way an episode goes and ends (played out,
a fixed opponent, the engine or the env or a fixed policy failing, the tokenizer failing on the
first prompt or on a later turn, the context or the env's token budget running out, an engine
without a tokenizer, solvers sampled ahead, step and episode timeouts), compared with
``data/episode_records.json``, written by ``python -m tests.rollout.test_episode_records``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import envhub
from envhub.envs.calculator import reference_policy as calculator_policy
from envhub.envs.setter_solver import SetterSolverEnv
from envhub.envs.tictactoe import TicTacToeEnv
from envhub.errors import EngineError
from envhub.inference.base import GenerateRequest, Generation
from envhub.multiturn import MultiTurnEnv
from envhub.rollout.runner import RolloutRunner
from envhub.state import State
from envhub.testing import ByteChatTokenizer, ScriptedEngine, replay
from envhub.types import AssistantTurn, Message, Trajectory, user

GOLDEN = Path(__file__).parent / "data" / "episode_records.json"
TIMINGS = {"seconds", "generate_seconds", "env_seconds"}
TASKS = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(4)]


def first_free(messages: list[Message], tools: Any) -> str:
    """Plays the first free cell of the board the actor was last shown."""
    board = [line for line in (messages[-1].content or "").splitlines() if "|" in line]
    cells = [c.strip() for line in board for c in line.split("|")]
    return next(c for c in cells if c.isdigit())


def is_o(messages: list[Message]) -> bool:
    return "as O" in (messages[0].content or "")


def classroom() -> Callable[[list[Message], Any], str]:
    """A setter that poses one problem; solvers answering in turn right, wrong, off-format."""
    answers = iter(["\\boxed{35}", "\\boxed{36}", "35"] * 4)

    def policy(messages: list[Message], tools: Any) -> str:
        if "You write arithmetic problems" in (messages[0].content or ""):
            return "<problem>(3 + 4) * 5</problem>"
        return next(answers)

    return policy


class FailsOnO(ScriptedEngine):
    """The engine raises on O's second turn."""

    async def generate(self, request: GenerateRequest) -> Generation:
        messages = list(request.messages)
        if is_o(messages) and sum(m.role == "assistant" for m in messages) == 1:
            raise EngineError("the server went away")
        return await super().generate(request)


class HangsOnO(ScriptedEngine):
    """Never answers O's first turn."""

    async def generate(self, request: GenerateRequest) -> Generation:
        if is_o(list(request.messages)):
            await asyncio.Event().wait()
        return await super().generate(request)


class RenderFails(ByteChatTokenizer):
    """Raises on rendering a conversation that ``when`` picks."""

    def __init__(self, when: Callable[[list[Message]], bool]) -> None:
        super().__init__()
        self.when = when

    async def render(
        self, messages: list[Message], tools: Any, add_generation_prompt: bool
    ) -> list[int]:
        if self.when(list(messages)):
            raise RuntimeError("tokenize failed")
        return self.render_sync(messages, tools, add_generation_prompt)


class BrokenTicTacToe(TicTacToeEnv):
    """Raises while playing O's second move."""

    def play(self, match: Any, actor: str, turn: Any) -> None:
        if actor == "o" and match.turn == 4:
            raise KeyError("board")
        super().play(match, actor, turn)


class SlowTicTacToe(TicTacToeEnv):
    """Hangs on O's first move (the step times out)."""

    async def astep(self, action: Any) -> Any:
        if self.match is not None and self.match.to_move == "o":
            await asyncio.sleep(5)
        return await super().astep(action)


def crashing_opponent(messages: list[Message], rng: Any) -> str:
    raise RuntimeError("the opponent's script broke")


class Chatter(MultiTurnEnv):
    """Never ends by itself; scores turns / 10; raises on a step of task 3."""

    name = "chatter"

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        if state.task_index == 3 and state.turn == 2:
            raise ValueError("step broke")
        return [user(f"go on ({state.turn})")]

    def default_rubric(self) -> Any:
        from envhub.rewards.rubric import Rubric, reward

        @reward
        def turns(state: State) -> float:
            return state.turn / 10

        return Rubric([turns])


def roll(
    engine: Any, env: Callable[[], Any], tasks: list[int], n: int = 2, **kwargs: Any
) -> list[Trajectory]:
    runner = RolloutRunner(engine, env, max_concurrency=2, seed=3, **kwargs)
    return asyncio.run(runner.run(tasks, samples_per_task=n))


def tokens(max_length: int | None = None) -> ByteChatTokenizer:
    return ByteChatTokenizer(max_length=max_length)


def multi_role() -> dict[str, Callable[[], list[Trajectory]]]:
    """Tic-tac-toe and setter-solver episodes, each ending its own way."""
    return {
        "ttt_self_play": lambda: roll(ScriptedEngine(first_free, tokens()), TicTacToeEnv, [0, 9]),
        "ttt_fixed_opponent": lambda: roll(
            ScriptedEngine(first_free, tokens()),
            lambda: TicTacToeEnv(opponent="random"),
            [0, 9],
        ),
        "ttt_engine_fails": lambda: roll(FailsOnO(first_free, tokens()), TicTacToeEnv, [0], 1),
        "ttt_env_raises": lambda: roll(ScriptedEngine(first_free, tokens()), BrokenTicTacToe, [0]),
        "ttt_fixed_policy_crashes": lambda: roll(
            ScriptedEngine(first_free, tokens()),
            lambda: TicTacToeEnv(policies={"o": crashing_opponent}),
            [0],
            1,
        ),
        "ttt_context_runs_out": lambda: roll(
            ScriptedEngine(first_free, tokens(450)), TicTacToeEnv, [0, 9], 1
        ),
        "ttt_first_prompt_fails": lambda: roll(
            ScriptedEngine(first_free, RenderFails(is_o)), TicTacToeEnv, [0], 1
        ),
        "ttt_later_turn_fails": lambda: roll(
            ScriptedEngine(first_free, RenderFails(lambda m: len(m) > 4)), TicTacToeEnv, [0], 1
        ),
        "ttt_no_tokenizer": lambda: roll(ScriptedEngine(first_free), TicTacToeEnv, [0, 9], 1),
        "ttt_step_timeout": lambda: roll(
            ScriptedEngine(first_free, tokens()), SlowTicTacToe, [0], 1, step_timeout=0.2
        ),
        "ttt_episode_timeout": lambda: roll(
            HangsOnO(first_free, tokens()), TicTacToeEnv, [0], 1, episode_timeout=0.3
        ),
        "setter_solver_ahead": lambda: roll(
            ScriptedEngine(classroom(), tokens()), lambda: SetterSolverEnv(attempts=3), [0, 4]
        ),
    }


def one_role() -> dict[str, Callable[[], list[Trajectory]]]:
    """One-role episodes: a tool env, a game, and each way an episode ends."""
    chatter = lambda: Chatter(TASKS, max_turns=4)  # noqa: E731
    return {
        "calculator": lambda: roll(
            ScriptedEngine(calculator_policy, tokens()), lambda: envhub.make("calculator"), [0, 3]
        ),
        "calculator_no_tokenizer": lambda: roll(
            ScriptedEngine(calculator_policy), lambda: envhub.make("calculator"), [0], 1
        ),
        "guess_number": lambda: roll(
            ScriptedEngine(replay("50", "25", "75", "12"), tokens()),
            lambda: envhub.make("guess-number"),
            [0, 1],
        ),
        "chatter_turns_and_step_failure": lambda: roll(
            ScriptedEngine(replay("more"), tokens()), chatter, [0, 3], 1
        ),
        "chatter_context_runs_out": lambda: roll(
            ScriptedEngine(replay("a" * 9), tokens(60)), chatter, [0], 1
        ),
        "chatter_token_budget": lambda: roll(
            ScriptedEngine(replay("a" * 9), tokens()),
            lambda: Chatter(TASKS, max_tokens=25),
            [0],
            1,
        ),
        "chatter_first_prompt_fails": lambda: roll(
            ScriptedEngine(replay("more"), RenderFails(lambda m: True)), chatter, [0], 1
        ),
        "chatter_later_turn_fails": lambda: roll(
            ScriptedEngine(replay("more"), RenderFails(lambda m: len(m) > 3)), chatter, [0], 1
        ),
    }


def scenarios() -> dict[str, Callable[[], list[Trajectory]]]:
    return {**multi_role(), **one_role()}


def record(t: Trajectory) -> dict[str, Any]:
    """A trajectory's identity: everything it holds but timings, hashed, with a few fields
    to read."""
    data = t.model_dump(mode="json", exclude={"seconds"})
    data["turns"] = [{k: v for k, v in turn.items() if k not in TIMINGS} for turn in data["turns"]]
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    return {
        "role": t.role,
        "reward": t.reward,
        "outcome": t.outcome,
        "stop_reason": t.stop_reason,
        "errors": [f"{e.stage}:{e.type}" for e in t.errors],
        "tokens": len(t.token_ids or []),
        "sha256": digest,
    }


@pytest.mark.parametrize("name", list(scenarios()))
def test_episode_records_are_as_recorded(name: str) -> None:
    golden = json.loads(GOLDEN.read_text())[name]
    assert [record(t) for t in scenarios()[name]()] == golden


if __name__ == "__main__":  # record the runner's behaviour (on the commit before a change)
    records = {name: [record(t) for t in make()] for name, make in scenarios().items()}
    GOLDEN.write_text(json.dumps(records, indent=1) + "\n")
