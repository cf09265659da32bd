"""Re-scoring stored trajectories with another env version: new rewards, originals intact, group
rewards per group, replay divergence, training-run folders, failures left as they were."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from envhub.env import SingleTurnEnv
from envhub.envs.calculator import CalculatorEnv
from envhub.envs.calculator import reference_policy as calculator_policy
from envhub.errors import ConfigError
from envhub.evaluation.rescore import find_results, report_lines, rescore_results, stored_env_args
from envhub.inference.base import GenerateRequest, Generation
from envhub.multiturn import MultiTurnEnv
from envhub.rewards.rubric import Rubric, group_reward, reward
from envhub.rollout.io import TrajectoryWriter, read_trajectories
from envhub.rollout.runner import RolloutRunner
from envhub.state import State
from envhub.testing import ByteChatTokenizer, ScriptedEngine, replay
from envhub.tools.parsers import parse_hermes
from envhub.types import AssistantTurn, EnvRef, Message, Trajectory, assistant, user

TASKS = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(4)]


def policy(messages: list[Message], tools: Any) -> str:
    """Answers q{i} with a{i}, except q1 (a long wrong answer)."""
    question = messages[-1].content or ""
    return "no idea" if question == "q1" else "a" + question[1:]


@reward
def exact(response: str, answer: str) -> float:
    """1 for the reference answer."""
    return float(response == answer)


@reward(weight=0.5)
def brevity(response: str) -> float:
    """1 for an answer of at most two characters."""
    return float(len(response) <= 2)


@group_reward
def rank(responses: list[str]) -> list[float]:
    """Each sample's position in its group."""
    return [float(i) for i in range(len(responses))]


@group_reward
def group_solved(responses: list[str], answers: list[str]) -> list[float]:
    """The share of the group that answered right, for every sample of it."""
    share = sum(r == a for r, a in zip(responses, answers, strict=True)) / len(responses)
    return [share] * len(responses)


class Quiz(SingleTurnEnv):
    """Version 0.0.1: exact match only."""

    name = "rescore-quiz"
    version = "0.0.1"

    def load_dataset(self) -> list[dict[str, Any]]:
        return TASKS

    def default_rubric(self) -> Rubric:
        return Rubric([exact])


class QuizV2(Quiz):
    """Version 0.0.2: brevity counts too."""

    version = "0.0.2"

    def default_rubric(self) -> Rubric:
        return Rubric([exact, brevity])


class QuizGroups(Quiz):
    """Version 0.0.3: adds two group rewards."""

    version = "0.0.3"

    def default_rubric(self) -> Rubric:
        return Rubric([exact, rank, group_solved])


def eval_folder(folder: Path, trajectories: list[Trajectory], **config: Any) -> Path:
    """Save trajectories as ``envhub eval`` does (trajectories.jsonl, config.json)."""
    with TrajectoryWriter(folder / "trajectories.jsonl") as writer:
        for t in trajectories:
            writer.write(t)
    (folder / "config.json").write_text(json.dumps({"env_args": {}, **config}))
    return folder


def rollouts(engine: Any, factory: Any, tasks: list[int], samples: int = 2) -> list[Trajectory]:
    return asyncio.run(RolloutRunner(engine, factory, max_concurrency=1).run(tasks, samples))


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_rescoring_with_a_changed_reward_gives_the_new_rewards_and_keeps_the_originals(
    tmp_path: Path,
) -> None:
    results = eval_folder(tmp_path / "eval", rollouts(ScriptedEngine(policy), Quiz, [0, 1, 2]))
    before = snapshot(results)
    report = rescore_results(results, QuizV2, tmp_path / "new")
    assert snapshot(results) == before  # byte for byte
    old = read_trajectories(results / "trajectories.jsonl")
    new = read_trajectories(tmp_path / "new" / "trajectories.jsonl")
    assert [t.reward for t in old] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert [t.reward for t in new] == [1.5, 1.5, 0.0, 0.0, 1.5, 1.5]
    assert [t.reward_components for t in new] == [
        {"exact": e, "brevity": e} for e in (1.0, 1.0, 0.0, 0.0, 1.0, 1.0)
    ]
    assert {t.env for t in new} == {EnvRef(name="rescore-quiz", version="0.0.2")}
    assert new[2].info["rescore"] == {
        "env": {"name": "rescore-quiz", "version": "0.0.1", "commit": None},
        "reward": 0.0,
        "reward_components": {"exact": 0.0},
        "divergence": None,
    }
    # Everything the policy did is kept as it was.
    assert [(t.messages, t.seed, t.sampler, t.turns) for t in new] == [
        (t.messages, t.seed, t.sampler, t.turns) for t in old
    ]
    assert report_lines(report) == [
        "rescored 6 of 6 episodes with rescore-quiz 0.0.2 (scored by rescore-quiz 0.0.1)",
        "reward: 0.667 -> 1.000 (+0.333)",
        "  exact: 0.667 -> 0.667",
        "  brevity: - -> 0.667",
        "changed: 4 rewards, 6 component sets (of 6 episodes)",
        "biggest changes:",
        "  trajectories.jsonl:0 (task 0, sample 0): 1.000 -> 1.500 (+0.500)",
        "  trajectories.jsonl:1 (task 0, sample 1): 1.000 -> 1.500 (+0.500)",
        "  trajectories.jsonl:4 (task 2, sample 0): 1.000 -> 1.500 (+0.500)",
        "  trajectories.jsonl:5 (task 2, sample 1): 1.000 -> 1.500 (+0.500)",
        "replay diverged: 0 episodes",
        f"saved: {tmp_path / 'new'}",
    ]
    saved = json.loads((tmp_path / "new" / "summary.json").read_text())
    assert (saved["reward_mean"], saved["components"]) == (1.0, {"brevity": 2 / 3, "exact": 2 / 3})
    assert json.loads((tmp_path / "new" / "rescore.json").read_text())["changed"] == 4


def test_group_rewards_are_recomputed_per_group_in_sample_order(tmp_path: Path) -> None:
    stored = rollouts(ScriptedEngine(policy), Quiz, [1, 0], 3)
    # Groups interleaved and a group's samples out of order, as no writer here leaves them:
    # each group is still scored alone, its samples in sample order.
    lines = [stored[i] for i in (2, 3, 0, 4, 1, 5)]
    rescore_results(eval_folder(tmp_path / "eval", lines), QuizGroups, tmp_path / "new")
    new = read_trajectories(tmp_path / "new" / "trajectories.jsonl")
    assert [(t.group_id, t.sample_index) for t in new] == [
        ("g0", 2), ("g1", 0), ("g0", 0), ("g1", 1), ("g0", 1), ("g1", 2),
    ]  # fmt: skip
    assert [t.reward_components for t in new] == [
        {"exact": 0.0, "rank": 2.0, "group_solved": 0.0},
        {"exact": 1.0, "rank": 0.0, "group_solved": 1.0},
        {"exact": 0.0, "rank": 0.0, "group_solved": 0.0},
        {"exact": 1.0, "rank": 1.0, "group_solved": 1.0},
        {"exact": 0.0, "rank": 1.0, "group_solved": 0.0},
        {"exact": 1.0, "rank": 2.0, "group_solved": 1.0},
    ]
    assert [t.reward for t in new] == [2.0, 2.0, 0.0, 3.0, 1.0, 4.0]


class Guess(MultiTurnEnv):
    """Guess the task's number; the reply says higher or lower. Solving is in the env's state."""

    name = "rescore-guess"
    version = "0.1.0"
    higher = "higher"

    def load_dataset(self) -> list[dict[str, Any]]:
        return [{"question": "Guess 1-5.", "secret": s} for s in (3, 1)]

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        guess = int((turn.message.content or "0").strip() or 0)
        if guess == state.task["secret"]:
            state.data["solved"] = True
            state.done = True
            return []
        return [user(self.higher if guess < state.task["secret"] else "lower")]

    def default_rubric(self) -> Rubric:
        @reward
        def solved(state: State) -> float:
            return float(state.data.get("solved", False))

        return Rubric([solved])


class GuessFast(Guess):
    """0.2.0: solving sooner is worth more (a reward that reads the turn count)."""

    version = "0.2.0"

    def default_rubric(self) -> Rubric:
        @reward
        def solved_fast(state: State) -> float:
            return float(state.data.get("solved", False)) / state.turn

        return Rubric([solved_fast])


class GuessWorded(GuessFast):
    """0.3.0: words its replies differently."""

    version = "0.3.0"
    higher = "Higher!"


def test_replay_rebuilds_env_state_and_reports_where_replies_diverge(tmp_path: Path) -> None:
    stored = rollouts(ScriptedEngine(replay("1", "2", "3")), Guess, [0, 1], samples=1)
    assert [(t.reward, len(t.turns)) for t in stored] == [(1.0, 3), (1.0, 1)]
    results = eval_folder(tmp_path / "eval", stored)
    same = rescore_results(results, GuessFast, tmp_path / "fast")
    assert [t.reward for t in read_trajectories(tmp_path / "fast" / "trajectories.jsonl")] == [
        1 / 3,
        1.0,
    ]
    assert same.divergences == []
    worded = rescore_results(results, GuessWorded, tmp_path / "worded")
    rescored = read_trajectories(tmp_path / "worded" / "trajectories.jsonl")
    assert [t.reward for t in rescored] == [1 / 3, 1.0]  # scored on the stored turns
    detail = "turn 0: user 'Higher!' where the stored episode has user 'higher'"
    assert rescored[0].info["rescore"]["divergence"] == detail
    assert rescored[1].info["rescore"]["divergence"] is None
    assert report_lines(worded)[-3:] == [
        "replay diverged: 1 episodes",
        f"  trajectories.jsonl:0 (task 0, sample 0): {detail}",
        f"saved: {tmp_path / 'worded'}",
    ]


class Chatter(MultiTurnEnv):
    """Never ends by itself; 0.0.1 scores turns / 10."""

    name = "rescore-chatter"
    version = "0.0.1"
    per_turn = 0.1

    def load_dataset(self) -> list[dict[str, Any]]:
        return TASKS

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        return [user("go on")]

    def default_rubric(self) -> Rubric:
        @reward
        def turns(state: State) -> float:
            return state.turn * self.per_turn

        return Rubric([turns])


class ChatterV2(Chatter):
    version = "0.0.2"
    per_turn = 0.2


def test_an_episode_the_runner_cut_at_the_context_limit_is_cut_there_again(
    tmp_path: Path,
) -> None:
    one_turn = [user("q0"), assistant("a" * 9), user("go on")]
    room = len(ByteChatTokenizer().render_sync(one_turn, None, True)) + 10
    tokenizer = ByteChatTokenizer(max_length=room)  # room for two turns of 10 tokens
    stored = rollouts(ScriptedEngine(replay("a" * 9), tokenizer), Chatter, [0], samples=1)
    assert [(t.stop_reason, t.reward, len(t.turns)) for t in stored] == [("max_context", 0.2, 2)]
    report = rescore_results(eval_folder(tmp_path / "eval", stored), ChatterV2, tmp_path / "new")
    (new,) = read_trajectories(tmp_path / "new" / "trajectories.jsonl")
    assert (new.reward, new.stop_reason, new.outcome) == (0.4, "max_context", "policy_failure")
    assert report.divergences == []


class Flaky(Quiz):
    """Its step raised for q2 when the results were made."""

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        if state.task_index == 2:
            raise ValueError("step broke")
        return await super().env_response(state, turn)


def test_failed_episodes_and_other_envs_are_copied_and_counted(tmp_path: Path) -> None:
    quiz = rollouts(ScriptedEngine(policy), Flaky, [0, 2], samples=1)
    chatter = rollouts(ScriptedEngine(replay("x")), lambda: Chatter(max_turns=1), [0], samples=1)
    chatter[0] = chatter[0].model_copy(update={"group_id": "g9"})
    results = eval_folder(tmp_path / "eval", quiz + chatter)
    report = rescore_results(results, QuizV2, tmp_path / "new")
    ok, failed, other = read_trajectories(tmp_path / "new" / "trajectories.jsonl")
    assert (ok.reward, ok.env.version) == (1.5, "0.0.2")
    assert failed.info["rescore"] == {"skipped": "failed", "why": "failed before its end (error)"}
    assert (failed.env, failed.errors) == (quiz[1].env, quiz[1].errors)
    assert other.info["rescore"] == {
        "skipped": "other_env",
        "why": "made by env rescore-chatter, not rescore-quiz",
    }
    assert (report.rescored, report.failed, report.other_env) == (1, 1, 1)
    assert report_lines(report)[-2] == "not rescored: 1 failed before their end, 1 of another env"


def test_a_training_run_keeps_its_layout_and_its_env_arguments(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for step, tasks in ((1, [0]), (2, [2])):
        with TrajectoryWriter(run / "trajectories" / f"step-{step:06d}.jsonl") as writer:
            for t in rollouts(ScriptedEngine(policy), Quiz, tasks):
                writer.write(t)
    specs = [{"name": "rescore-quiz", "args": {"max_turns": 1}, "weight": 1.0}]
    (run / "config.json").write_text(json.dumps({"envs": specs}))
    source = find_results(run)
    assert (source.kind, source.files) == (
        "train",
        [Path("trajectories/step-000001.jsonl"), Path("trajectories/step-000002.jsonl")],
    )
    assert stored_env_args(source, "anything") == {"max_turns": 1}  # the run's only env
    rescore_results(run, QuizV2, tmp_path / "new")
    for step in ("step-000001.jsonl", "step-000002.jsonl"):
        new = read_trajectories(tmp_path / "new" / "trajectories" / step)
        assert [t.reward for t in new] == [1.5, 1.5]
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["rescore.json", "trajectories"]


def test_nothing_is_written_when_no_episode_is_of_the_env(tmp_path: Path) -> None:
    results = eval_folder(tmp_path / "eval", rollouts(ScriptedEngine(policy), Quiz, [0]))
    with pytest.raises(ConfigError, match=r"is of env rescore-chatter: they are of rescore-quiz$"):
        rescore_results(results, Chatter, tmp_path / "new")
    assert not (tmp_path / "new").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ConfigError, match="full is not empty; give another --output$"):
        rescore_results(results, QuizV2, tmp_path / "full")
    with pytest.raises(ConfigError, match="holds no trajectories: give an `envhub eval` folder"):
        find_results(tmp_path / "full")


class ServerParsed(ScriptedEngine):
    """Like an OpenAI server that parses tool calls itself: the calls come back structured and
    the markup is gone from the text."""

    async def generate(self, request: GenerateRequest) -> Generation:
        out = await super().generate(request)
        parsed = parse_hermes(out.text, "srv_")
        return out.model_copy(update={"text": parsed.content, "tool_calls": parsed.calls or None})


@pytest.mark.parametrize("engine", [ScriptedEngine, ServerParsed])
def test_a_tool_env_replays_to_the_same_scores_whoever_parsed_the_calls(
    tmp_path: Path, engine: type
) -> None:
    calculator = lambda: CalculatorEnv(num_tasks=6)  # noqa: E731
    stored = rollouts(engine(calculator_policy), calculator, [0, 3, 5], samples=1)
    assert [(t.reward, len(t.turns), t.metrics["tool_calls"]) for t in stored] == [
        (1.0, 2, 1.0)
    ] * 3
    assert stored[0].turns[0].structured_tool_calls is (engine is ServerParsed)
    report = rescore_results(eval_folder(tmp_path / "eval", stored), calculator, tmp_path / "new")
    new = read_trajectories(tmp_path / "new" / "trajectories.jsonl")
    assert [(t.reward, t.reward_components, t.metrics) for t in new] == [
        (t.reward, t.reward_components, t.metrics) for t in stored
    ]
    assert (report.changed, report.components_changed, report.divergences) == (0, 0, [])
