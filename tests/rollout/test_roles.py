"""The runner on episodes with several roles: one trajectory per actor the policy plays, each
with its own token record, reward and group; a failing role recorded, never raised.

Token expectations are built by hand from the byte tokenizer's ChatML layout: each actor's
record is its own conversation rendered by the template, with mask 1 exactly on its own turns.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

import envhub
from envhub.envs.calculator import reference_policy as calculator_policy
from envhub.envs.tictactoe import TicTacToeEnv
from envhub.errors import EngineError
from envhub.inference.base import GenerateRequest, Generation
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ByteChatTokenizer, ScriptedEngine, replay
from envhub.types import Message, Trajectory

IM_END = ByteChatTokenizer.IM_END
BEFORE = Path(__file__).parent / "data" / "single_role_before_roles.json"


def side(messages: list[Message]) -> str:
    """Which side a conversation belongs to, from its system prompt."""
    return "x" if "as X" in (messages[0].content or "") else "o"


def scripted_game(moves: dict[str, list[str]]) -> Any:
    """A policy that plays ``moves[side][k]`` on that side's k-th turn."""

    def policy(messages: list[Message], tools: Any) -> str:
        turn = sum(m.role == "assistant" for m in messages)
        return moves[side(messages)][turn]

    return policy


def roll(
    env_factory: Any, policy: Any, tasks: list[int], n: int = 1, engine: Any = None
) -> list[Trajectory]:
    engine = engine or ScriptedEngine(policy, tokenizer=ByteChatTokenizer())
    runner = RolloutRunner(engine, env_factory, max_concurrency=2, seed=3)
    return asyncio.run(runner.run(tasks, samples_per_task=n))


def by_role(trajectories: list[Trajectory]) -> dict[str | None, Trajectory]:
    return {t.role: t for t in trajectories}


# X takes 1, 2, 3 (a row) while O takes 5, 9: X wins on its third move.
X_WINS = {"x": ["1", "2", "3"], "o": ["5", "9"]}


def test_self_play_records_one_trajectory_per_side_with_its_own_view() -> None:
    trajectories = roll(TicTacToeEnv, scripted_game(X_WINS), [0])
    assert [t.role for t in trajectories] == ["x", "o"]
    x, o = by_role(trajectories)["x"], by_role(trajectories)["o"]
    assert [(m.role, m.actor) for m in x.messages] == [
        ("system", None),
        ("user", None),
        ("assistant", "x"),
        ("user", "o"),
        ("assistant", "x"),
        ("user", "o"),
        ("assistant", "x"),
    ]
    assert [(m.role, m.actor) for m in o.messages] == [
        ("system", None),
        ("user", "x"),
        ("assistant", "o"),
        ("user", "x"),
        ("assistant", "o"),
    ]
    assert [m.content for m in x.messages if m.role == "assistant"] == ["1", "2", "3"]
    assert [m.content for m in o.messages if m.role == "assistant"] == ["5", "9"]
    assert o.messages[1].content.startswith("X took cell 1.\n")
    assert x.prompt_length == 2 and o.prompt_length == 2


def test_each_sides_rewards_results_and_turn_credit() -> None:
    x, o = roll(TicTacToeEnv, scripted_game(X_WINS), [0])
    assert (x.reward, o.reward) == (1.0, -1.0)
    assert [t.reward for t in x.turns] == [0.0, 0.0, 1.0]
    assert [t.reward for t in o.turns] == [0.0, -1.0]  # paid at X's winning step, on O's last turn
    assert x.info["role_result"] == "win" and o.info["role_result"] == "loss"
    assert x.outcome == o.outcome == "ok" and x.terminated and o.terminated
    # Graded by exact minimax: X's 1, 2 keep the draw and 3 wins (all optimal); O's 5 keeps
    # the draw, but 9 leaves the row 1-2-3 open (O had to take 3).
    assert (x.metrics["moves/x"], x.metrics["optimal/x"]) == (3, 1.0)
    assert (o.metrics["moves/o"], o.metrics["optimal/o"]) == (2, 0.5)


def test_each_sides_tokens_are_its_own_conversation_with_only_its_turns_trainable() -> None:
    tokenizer = ByteChatTokenizer()
    for t in roll(TicTacToeEnv, scripted_game(X_WINS), [0]):
        full = tokenizer.render_sync(t.messages, None, add_generation_prompt=False)
        assert full[-1] == ord("\n") and t.token_ids == full[:-1]  # sampling stops at <|im_end|>
        expected = [0] * len(t.token_ids)
        for k, message in enumerate(t.messages):
            if message.role != "assistant":
                continue
            start = len(tokenizer.render_sync(t.messages[:k], None, add_generation_prompt=True))
            span = tokenizer.encode(message.content) + [IM_END]
            assert t.token_ids[start : start + len(span)] == span
            expected[start : start + len(span)] = [1] * len(span)
        assert t.loss_mask == expected, t.role
        assert t.prompt_token_count == len(
            tokenizer.render_sync(t.messages[:2], None, add_generation_prompt=True)
        )
        sampled = [i for i, m in zip(t.token_ids, t.loss_mask, strict=True) if m]
        turns = [m.content for m in t.messages if m.role == "assistant"]
        assert tokenizer.decode(sampled) == "".join(f"{text}<|im_end|>" for text in turns)


def test_groups_are_per_task_and_role() -> None:
    trajectories = roll(TicTacToeEnv, scripted_game(X_WINS), [0, 0], n=2)
    assert [t.group_key for t in trajectories] == ["g0/x", "g0/o"] * 2 + ["g1/x", "g1/o"] * 2
    assert [t.sample_index for t in trajectories] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert all(t.info["actors"] == 2 for t in trajectories)


def test_a_fixed_opponent_leaves_one_trajectory_that_of_the_trained_side() -> None:
    trajectories = roll(lambda: TicTacToeEnv(opponent="perfect"), scripted_game(X_WINS), [0])
    [x] = trajectories
    assert x.role == "x" and x.info["actors"] == 1
    assert all(m.actor in (None, "x", "o") for m in x.messages)
    assert x.reward in (-1.0, 0.0)  # nobody beats perfect play


class FailsOn(ScriptedEngine):
    """Raises on the side ``who``'s turn ``at`` (an engine failure: infrastructure)."""

    def __init__(self, policy: Any, who: str, at: int) -> None:
        super().__init__(policy, tokenizer=ByteChatTokenizer())
        self.who, self.at = who, at

    async def generate(self, request: GenerateRequest) -> Generation:
        turn = sum(m.role == "assistant" for m in request.messages)
        if side(list(request.messages)) == self.who and turn == self.at:
            raise EngineError("the server went away")
        return await super().generate(request)


def test_a_side_whose_policy_call_fails_is_recorded_and_the_other_side_is_kept_out() -> None:
    engine = FailsOn(scripted_game(X_WINS), "o", 1)
    x, o = roll(TicTacToeEnv, None, [0], engine=engine)
    assert [(e.stage, e.type, e.infra) for e in o.errors] == [("engine", "EngineError", True)]
    assert o.info["role_result"] == "crashed" and o.outcome == "infra_failure"
    assert [(e.stage, e.type) for e in x.errors] == [("role:o", "role_crashed")]
    assert "EngineError: the server went away" in x.errors[0].message
    assert x.info["role_result"] == "aborted" and x.outcome == "infra_failure"
    assert x.reward == o.reward == 0.0


def crashing_opponent(messages: list[Message], rng: Any) -> str:
    raise RuntimeError("the opponent's script broke")


def test_a_fixed_policy_that_raises_is_recorded_as_that_role_crashing() -> None:
    env = lambda: TicTacToeEnv(policies={"o": crashing_opponent})  # noqa: E731
    [x] = roll(env, scripted_game(X_WINS), [0])
    assert [(e.stage, e.type, e.message) for e in x.errors] == [
        ("role:o", "RuntimeError", "the opponent's script broke")
    ]
    assert x.outcome == "env_failure" and x.stop_reason == "error"
    assert x.info["role_result"] == "aborted"
    assert [m.role for m in x.messages] == ["system", "user", "assistant"]


class BrokenTicTacToe(TicTacToeEnv):
    """Raises while playing O's second move (a bug in the env's own code)."""

    def play(self, match: Any, actor: str, turn: Any) -> None:
        if actor == "o" and match.turn == 4:
            raise KeyError("board")
        super().play(match, actor, turn)


def test_an_env_that_raises_on_a_sides_turn_is_an_env_failure_for_both() -> None:
    x, o = roll(BrokenTicTacToe, scripted_game(X_WINS), [0])
    assert [(e.stage, e.type) for e in o.errors] == [("env.step", "KeyError")]
    assert [(e.stage, e.type) for e in x.errors] == [("role:o", "role_crashed")]
    assert x.outcome == o.outcome == "env_failure"


def record(t: Trajectory) -> dict[str, Any]:
    data = {
        "env": t.env.name,
        "group_id": t.group_id,
        "token_ids": t.token_ids,
        "loss_mask": t.loss_mask,
        "sampler_logprobs": t.sampler_logprobs,
        "reward": t.reward,
        "messages": [m.to_openai() for m in t.messages],
        "turn_rewards": [r.reward for r in t.turns],
        "stop_reason": t.stop_reason,
    }
    return {
        "env": t.env.name,
        "group_id": t.group_id,
        "tokens": len(t.token_ids or []),
        "reward": t.reward,
        "sha256": hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest(),
    }


@pytest.mark.parametrize(
    ("name", "policy", "tasks"),
    [
        ("calculator", calculator_policy, [0, 3]),
        ("guess-number", replay("50", "25", "75", "12", "88", "37", "62"), [0, 1]),
    ],
)
def test_one_role_rollouts_are_token_identical_to_before_roles(
    name: str, policy: Any, tasks: list[int]
) -> None:
    """Recorded with the runner as it was before roles (commit 11c63b9): token ids, masks,
    logprobs, messages and rewards of a tool env and a multi-turn game, byte for byte."""
    engine = ScriptedEngine(policy, tokenizer=ByteChatTokenizer())
    runner = RolloutRunner(engine, lambda: envhub.make(name), max_concurrency=2, seed=7)
    trajectories = asyncio.run(runner.run(tasks, samples_per_task=2))
    before = [r for r in json.loads(BEFORE.read_text()) if r["env"] == name]
    assert [record(t) for t in trajectories] == before
    assert all(t.role is None and t.group_key == t.group_id for t in trajectories)


class HangsOn(ScriptedEngine):
    """Never answers O's first turn."""

    async def generate(self, request: GenerateRequest) -> Generation:
        if side(list(request.messages)) == "o":
            await asyncio.Event().wait()
        return await super().generate(request)


def test_an_episode_timeout_is_recorded_on_every_side() -> None:
    engine = HangsOn(scripted_game(X_WINS), tokenizer=ByteChatTokenizer())
    runner = RolloutRunner(engine, TicTacToeEnv, max_concurrency=1, episode_timeout=0.5)
    x, o = asyncio.run(runner.run([0]))
    for t in (x, o):
        assert [(e.stage, e.type) for e in t.errors] == [("episode", "timeout")]
        assert t.outcome == "timeout" and t.reward == 0.0
    assert [m.content for m in x.messages if m.role == "assistant"] == ["1"]
    assert sum(x.loss_mask) == 2 and sum(o.loss_mask) == 0  # "1" + <|im_end|>; O sampled nothing


class SlowTicTacToe(TicTacToeEnv):
    """Hangs on O's first move (the step times out)."""

    async def astep(self, action: Any) -> Any:
        if self.match is not None and self.match.to_move == "o":
            await asyncio.sleep(5)
        return await super().astep(action)


def test_an_env_whose_step_timed_out_on_a_sides_turn_is_not_reused() -> None:
    made: list[TicTacToeEnv] = []

    def make() -> TicTacToeEnv:
        made.append(SlowTicTacToe())
        return made[-1]

    engine = ScriptedEngine(scripted_game(X_WINS), tokenizer=ByteChatTokenizer())
    runner = RolloutRunner(engine, make, max_concurrency=1, step_timeout=0.2)
    trajectories = asyncio.run(runner.run([0, 0]))
    outcomes = [(t.role, t.outcome) for t in trajectories]
    assert outcomes == [("x", "env_failure"), ("o", "timeout")] * 2
    assert len(made) == 2  # the second episode had a fresh env
