"""The rollout runner: groups, concurrency, failures recorded per episode, timeouts, budgets."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from envhub.env import Env, SingleTurnEnv
from envhub.errors import ConfigError, EngineError
from envhub.inference.base import GenerateRequest, Generation, SamplingParams
from envhub.multiturn import MultiTurnEnv
from envhub.rewards.match import exact_match
from envhub.rewards.rubric import Rubric, group_reward, reward
from envhub.rollout.runner import RolloutRunner, episode_seed
from envhub.state import State
from envhub.testing import ByteChatTokenizer, ScriptedEngine, replay
from envhub.types import AssistantTurn, EnvRef, ErrorRecord, Message, Trajectory, assistant, user

TASKS = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(8)]


def answer(messages: list[Message], tools: Any) -> str:
    """Answers task i with a{i}."""
    question = next(m.content or "" for m in messages if m.role == "user")
    return "a" + question[1:]


def run(
    runner: RolloutRunner, tasks: list[int], samples: int = 1, **kwargs: Any
) -> list[Trajectory]:
    return asyncio.run(runner.run(tasks, samples, **kwargs))


class Quiz(SingleTurnEnv):
    """Answer a{i} to q{i}. Can be told to fail at reset or step for chosen tasks."""

    name = "quiz"
    version = "1.2.3"

    def __init__(
        self,
        log: list[Any] | None = None,
        fail_reset: int = -1,
        fail_step: int = -1,
        rubric: Rubric | None = None,
    ) -> None:
        super().__init__(TASKS, rubric=rubric or Rubric([exact_match(extract=False)]))
        self.log = log if log is not None else []
        self.fail_reset, self.fail_step = fail_reset, fail_step

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        self.log.append((seed, options))
        if (options or {}).get("task_index") == self.fail_reset:
            raise RuntimeError("reset broke")
        return await super().areset(seed=seed, options=options)

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        if state.task_index == self.fail_step:
            raise ValueError("step broke")
        return await super().env_response(state, turn)


def test_groups_share_task_and_group_and_get_distinct_seeds_in_order() -> None:
    log: list[Any] = []
    runner = RolloutRunner(ScriptedEngine(answer), lambda: Quiz(log), max_concurrency=4, seed=7)
    trajectories = run(runner, [0, 2], samples=3)
    assert [(t.task_index, t.sample_index, t.group_id) for t in trajectories] == [
        (0, 0, "g0"), (0, 1, "g0"), (0, 2, "g0"), (2, 0, "g1"), (2, 1, "g1"), (2, 2, "g1"),
    ]  # fmt: skip
    seeds = [episode_seed(7, task, sample) for task in (0, 2) for sample in range(3)]
    assert [t.seed for t in trajectories] == seeds
    assert len(set(seeds)) == 6
    assert sorted(log, key=lambda e: e[0]) == sorted(
        ((s, {"task_index": t}) for s, t in zip(seeds, [0, 0, 0, 2, 2, 2], strict=True)),
        key=lambda e: e[0],
    )
    first = trajectories[0]
    assert first.env == EnvRef(name="quiz", version="1.2.3")
    assert (first.messages, first.prompt_length, first.reward, first.reward_components) == (
        [user("q0"), assistant("a0")],
        1,
        1.0,
        {"exact_match": 1.0},
    )
    assert (first.terminated, first.truncated, first.stop_reason, first.errors) == (
        True,
        False,
        "terminated",
        [],
    )
    assert first.metrics == {"turns": 1.0, "completion_tokens": 0.0}


def test_seeds_depend_on_the_run_seed() -> None:
    assert episode_seed(0, 1, 2) == episode_seed(0, 1, 2)
    assert (
        len(
            {
                episode_seed(0, 1, 2),
                episode_seed(1, 1, 2),
                episode_seed(0, 2, 1),
                episode_seed(0, 1, 3),
            }
        )
        == 4
    )


def test_max_concurrency_bounds_env_instances_and_episodes_in_flight() -> None:
    created: list[Env] = []
    live = {"now": 0, "most": 0}

    class Slow(Quiz):
        async def areset(self, **kwargs: Any) -> Any:
            live["now"] += 1
            live["most"] = max(live["most"], live["now"])
            return await super().areset(**kwargs)

        async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
            await asyncio.sleep(0.01)
            live["now"] -= 1
            return await super().env_response(state, turn)

    def factory() -> Env:
        created.append(Slow())
        return created[-1]

    trajectories = run(
        RolloutRunner(ScriptedEngine(answer), factory, max_concurrency=2), list(range(4)), samples=2
    )
    assert [t.reward for t in trajectories] == [1.0] * 8
    assert len(created) == 2
    assert live == {"now": 0, "most": 2}
    assert all(env._closed for env in created)  # closed when the run ends


def test_failures_are_recorded_on_their_own_episode_and_the_rest_go_on() -> None:
    def policy(messages: list[Message], tools: Any) -> str:
        if messages[-1].content == "q3":
            raise EngineError("model crashed")
        return answer(messages, tools)

    runner = RolloutRunner(
        ScriptedEngine(policy), lambda: Quiz(fail_reset=1, fail_step=2), max_concurrency=1
    )
    ok, bad_reset, bad_step, bad_engine, ok_again = run(runner, [0, 1, 2, 3, 4])
    for good in (ok, ok_again):
        assert (good.reward, good.stop_reason, good.errors) == (1.0, "terminated", [])
    assert bad_reset.errors == [
        ErrorRecord(stage="env.reset", type="RuntimeError", message="reset broke")
    ]
    assert (bad_reset.messages, bad_reset.turns) == ([], [])
    assert bad_step.errors == [
        ErrorRecord(stage="env.step", type="ValueError", message="step broke", turn=0)
    ]
    assert bad_step.messages == [user("q2"), assistant("a2")]
    assert bad_engine.errors == [
        ErrorRecord(stage="engine", type="EngineError", message="model crashed", turn=0)
    ]
    assert bad_engine.messages == [user("q3")]
    for bad in (bad_reset, bad_step, bad_engine):
        assert (bad.reward, bad.stop_reason, bad.truncated, bad.terminated, bad.ok) == (
            0.0,
            "error",
            True,
            False,
            False,
        )


def test_a_failing_env_factory_is_recorded_and_the_pool_recovers() -> None:
    calls = []

    def factory() -> Env:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("no sandbox")
        return Quiz()

    first, second = run(RolloutRunner(ScriptedEngine(answer), factory, max_concurrency=1), [0, 1])
    assert first.errors == [ErrorRecord(stage="env.make", type="OSError", message="no sandbox")]
    assert second.env == EnvRef(name="quiz", version="1.2.3")
    assert (second.reward, second.errors) == (1.0, [])


class Blocking(Env):
    """A sync env whose step blocks (for task 0) until released."""

    name = "blocking"
    instances: list[Blocking] = []

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release
        self.task = -1
        Blocking.instances.append(self)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        self.task = (options or {})["task_index"]
        return [user(f"q{self.task}")], {}

    def step(self, action: Any) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        if self.task == 0:
            self.release.wait(10)
        return [], 1.0, True, False, {}


def test_a_hanging_step_times_out_and_its_env_is_replaced_without_deadlock() -> None:
    Blocking.instances = []
    release = threading.Event()
    runner = RolloutRunner(
        ScriptedEngine(answer), lambda: Blocking(release), max_concurrency=1, step_timeout=0.1
    )

    async def main() -> tuple[list[Trajectory], float]:
        started = time.perf_counter()
        try:
            return await runner.run([0, 1]), time.perf_counter() - started
        finally:
            release.set()  # let the abandoned worker thread end

    (hung, fine), elapsed = asyncio.run(main())
    assert elapsed < 20.0  # ~0.2 s; without the timeout the hung step never returns
    assert hung.errors == [
        ErrorRecord(stage="env.step", type="timeout", message="did not finish within 0.1 s", turn=0)
    ]
    assert (hung.stop_reason, hung.reward, hung.truncated) == ("timeout", 0.0, True)
    assert (fine.stop_reason, fine.reward, fine.errors) == ("terminated", 1.0, [])
    assert len(Blocking.instances) == 2  # the hung env was discarded and a fresh one made
    assert [env.task for env in Blocking.instances] == [0, 1]
    assert all(env._closed for env in Blocking.instances)


class Chatter(MultiTurnEnv):
    """Never ends by itself; the rubric scores turns / 10."""

    name = "chatter"

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        await asyncio.sleep(self.delay)
        return [user("go on")]

    delay = 0.0

    def default_rubric(self) -> Rubric:
        @reward
        def turns(state: State) -> float:
            return state.turn / 10

        return Rubric([turns])


def test_the_episode_timeout_keeps_what_was_recorded() -> None:
    class SlowChatter(Chatter):
        delay = 0.02

    runner = RolloutRunner(
        ScriptedEngine(replay("more")),
        lambda: SlowChatter(TASKS, max_turns=10_000),
        episode_timeout=0.2,
    )
    started = time.perf_counter()
    (trajectory,) = run(runner, [0])
    assert time.perf_counter() - started < 20.0  # ~0.2 s; 10,000 turns would take 200 s
    assert trajectory.errors == [
        ErrorRecord(
            stage="episode", type="timeout", message="the episode did not finish within 0.2 s"
        )
    ]
    assert (trajectory.stop_reason, trajectory.reward, trajectory.truncated) == (
        "timeout",
        0.0,
        True,
    )
    assert len(trajectory.turns) >= 2
    assert trajectory.messages[:3] == [user("q0"), assistant("more"), user("go on")]


def test_the_envs_token_budget_truncates_and_the_rubric_still_scores() -> None:
    engine = ScriptedEngine(
        replay("a" * 9), ByteChatTokenizer()
    )  # 10 tokens a turn with <|im_end|>
    (trajectory,) = run(RolloutRunner(engine, lambda: Chatter(TASKS, max_tokens=25)), [0])
    assert [(t.completion_tokens, t.finish_reason) for t in trajectory.turns] == [
        (10, "stop"),
        (10, "stop"),
        (5, "length"),
    ]
    assert (trajectory.terminated, trajectory.truncated, trajectory.stop_reason) == (
        False,
        True,
        "max_tokens",
    )
    assert (trajectory.reward, trajectory.reward_components, trajectory.errors) == (
        0.3,
        {"turns": 0.3},
        [],
    )
    assert sum(trajectory.loss_mask or []) == 25 and trajectory.loss_mask[-1] == 1
    assert trajectory.metrics["length_stopped_turns"] == 1.0


def test_the_context_length_truncates_and_the_rubric_still_scores() -> None:
    tokenizer = ByteChatTokenizer()
    prompt = tokenizer.render_sync([user("q0")], None, True)
    engine = ScriptedEngine(replay("a" * 9), ByteChatTokenizer(max_length=len(prompt) + 5))
    (trajectory,) = run(RolloutRunner(engine, lambda: Chatter(TASKS)), [0])
    assert [(t.completion_tokens, t.finish_reason) for t in trajectory.turns] == [(5, "length")]
    assert (trajectory.terminated, trajectory.truncated, trajectory.stop_reason) == (
        False,
        True,
        "max_context",
    )
    assert (trajectory.reward, trajectory.reward_components, trajectory.errors) == (
        0.1,
        {"turns": 0.1},
        [],
    )
    assert trajectory.messages == [user("q0"), assistant("aaaaa"), user("go on")]
    # The unanswered reply is not in the token record: it ends on the last sampled token.
    assert (
        trajectory.token_ids == prompt + list(b"aaaaa")
        and trajectory.loss_mask == [0] * len(prompt) + [1] * 5
    )
    assert len(trajectory.token_ids) <= len(prompt) + 5


def test_the_turn_budget_is_the_smallest_of_sampling_env_and_context() -> None:
    seen: list[int] = []

    class Spy(ScriptedEngine):
        async def generate(self, request: GenerateRequest) -> Generation:
            seen.append(request.sampling.max_tokens)
            return await super().generate(request)

    engine = Spy(replay("a" * 2), ByteChatTokenizer())
    run(
        RolloutRunner(
            engine,
            lambda: Chatter(TASKS, max_tokens=7, max_turns=3),
            sampling=SamplingParams(max_tokens=4, temperature=0.5),
        ),
        [0],
    )
    assert seen == [4, 4, 1]


def test_group_rewards_are_added_to_each_sample() -> None:
    @group_reward(weight=0.5)
    def rank(responses: list[str]) -> list[float]:
        return [float(i) for i in range(len(responses))]

    rubric = Rubric([exact_match(extract=False), rank])
    trajectories = run(
        RolloutRunner(ScriptedEngine(answer), lambda: Quiz(rubric=rubric)), [5], samples=3
    )
    assert [t.reward for t in trajectories] == [1.0, 1.5, 2.0]
    assert [t.reward_components for t in trajectories] == [
        {"exact_match": 1.0, "rank": float(i)} for i in range(3)
    ]


def test_on_trajectory_sees_every_trajectory_in_order() -> None:
    seen: list[Trajectory] = []
    trajectories = run(
        RolloutRunner(ScriptedEngine(answer), Quiz, max_concurrency=3),
        [3, 1],
        samples=2,
        on_trajectory=seen.append,
    )
    assert seen == trajectories
    assert [(t.task_index, t.sample_index) for t in seen] == [(3, 0), (3, 1), (1, 0), (1, 1)]


def test_a_fast_env_factory_runs_on_the_loop_and_a_slow_one_in_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A wide margin on both sides of the line, so a busy machine cannot move a factory across it.
    monkeypatch.setattr("envhub.rollout.runner._INLINE_FACTORY_SECONDS", 0.1)

    def made_where(delay: float) -> list[str]:
        places: list[str] = []

        def factory() -> Quiz:
            places.append(threading.current_thread().name)
            time.sleep(delay)
            return Quiz()

        runner = RolloutRunner(ScriptedEngine(answer), factory, max_concurrency=3)
        run(runner, [0, 1, 2])
        run(runner, [3, 4])  # a new pool: its envs are made again
        return places

    # The first is timed in a thread while the others wait; then all on the loop, or threads.
    assert made_where(0.0)[1:] == ["MainThread"] * 4
    assert "MainThread" not in made_where(0.2)


def test_a_failing_tokenizer_is_recorded_as_the_engines_error() -> None:
    class Flaky(ByteChatTokenizer):
        async def render(
            self, messages: list[Message], tools: Any, add_generation_prompt: bool
        ) -> list[int]:
            if any(m.content == "q1" for m in messages):
                raise RuntimeError("tokenize failed")
            return self.render_sync(messages, tools, add_generation_prompt)

    good, bad = run(RolloutRunner(ScriptedEngine(answer, Flaky()), Quiz), [0, 1])
    assert (good.reward, good.errors) == (1.0, [])
    assert bad.errors == [
        ErrorRecord(stage="engine", type="RuntimeError", message="tokenize failed", turn=0)
    ]
    assert (bad.stop_reason, bad.reward) == ("error", 0.0)


def test_observations_given_as_dicts_are_accepted() -> None:
    class Dicts(Env):
        name = "dicts"

        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
            return [{"role": "user", "content": "q0"}], {}

        def step(self, action: Any) -> Any:
            return (
                [{"role": "user", "content": "thanks"}],
                1.0,
                False,
                True,
                {"stop_reason": "max_turns"},
            )

    (trajectory,) = run(RolloutRunner(ScriptedEngine(answer, ByteChatTokenizer()), Dicts), [0])
    assert trajectory.messages == [user("q0"), assistant("a0"), user("thanks")]
    assert (trajectory.reward, trajectory.stop_reason, trajectory.truncated) == (
        1.0,
        "max_turns",
        True,
    )
    assert trajectory.token_ids is not None


@pytest.mark.parametrize("factory", [lambda: Quiz(fail_reset=0), lambda: Quiz(fail_step=0)])
def test_a_whole_batch_of_failures_still_returns_every_trajectory(
    factory: Callable[[], Env],
) -> None:
    trajectories = run(
        RolloutRunner(ScriptedEngine(answer), factory, max_concurrency=2), [0, 0, 0], samples=2
    )
    assert len(trajectories) == 6
    assert {t.stop_reason for t in trajectories} == {"error"}


def test_an_env_whose_close_raises_does_not_lose_the_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class BadClose(Blocking):
        def on_close(self) -> None:
            raise RuntimeError("close broke")

    release = threading.Event()
    runner = RolloutRunner(
        ScriptedEngine(answer), lambda: BadClose(release), max_concurrency=1, step_timeout=0.1
    )

    async def main() -> list[Trajectory]:
        try:
            return await runner.run(
                [0, 1]
            )  # the first env is discarded, the second closed at the end
        finally:
            release.set()

    hung, fine = asyncio.run(main())
    assert (hung.stop_reason, fine.stop_reason, fine.reward) == ("timeout", "terminated", 1.0)
    assert caplog.text.count("RuntimeError: close broke") == 2


def test_a_failure_mid_episode_keeps_everything_recorded_so_far() -> None:
    def policy(messages: list[Message], tools: Any) -> str:
        if any(m.role == "assistant" for m in messages):
            raise EngineError("connection reset")
        return "first"

    tokenizer = ByteChatTokenizer()
    (trajectory,) = run(
        RolloutRunner(ScriptedEngine(policy, ByteChatTokenizer()), lambda: Chatter(TASKS)), [0]
    )
    assert trajectory.errors == [
        ErrorRecord(stage="engine", type="EngineError", message="connection reset", turn=1)
    ]
    assert trajectory.messages == [user("q0"), assistant("first"), user("go on")]
    expected = tokenizer.render_sync(trajectory.messages, None, True)
    assert (
        trajectory.token_ids == expected
    )  # prompt, the sampled turn, the env's reply and the next prompt
    assert sum(trajectory.loss_mask or []) == len("first") + 1
    assert (trajectory.stop_reason, trajectory.reward, len(trajectory.turns)) == ("error", 0.0, 1)


def test_max_concurrency_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="^max_concurrency must be at least 1, got 0$"):
        RolloutRunner(ScriptedEngine(answer), Quiz, max_concurrency=0)


def test_each_turn_records_the_policy_version_that_sampled_it() -> None:
    class Updated(ScriptedEngine):
        """The trainer's weights change after the second turn (version 3 -> 4)."""

        async def generate(self, request: GenerateRequest) -> Generation:
            out = await super().generate(request)
            return out.model_copy(update={"weight_version": 3 if self.requests <= 2 else 4})

    runner = RolloutRunner(Updated(replay("more")), lambda: Chatter(TASKS, max_turns=3))
    (trajectory,) = run(runner, [0])
    assert [t.policy_version for t in trajectory.turns] == [3, 3, 4]
    assert trajectory.policy_version == 3  # the oldest: staleness counts from there
    (unversioned,) = run(RolloutRunner(ScriptedEngine(replay("x")), lambda: Quiz()), [0])
    assert unversioned.turns[0].policy_version is None and unversioned.policy_version is None
