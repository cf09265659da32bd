"""The producer of scored groups and its bound on staleness, driven the way the loop drives it
(take, a slow update, a sync, advance) with a scripted engine that stamps its policy version."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from envhub.inference.base import GenerateRequest, Generation
from envhub.testing import ByteChatTokenizer, LetterEnv, ScriptedEngine
from envhub.trainer.config import validate_config
from envhub.trainer.engines.base import RolloutEngine
from envhub.trainer.groups import Taken
from envhub.trainer.producer import GroupProducer
from envhub.trainer.tasks import TaskSchedule


def echo(messages: list[Any], tools: Any) -> str:
    return "eee " + (messages[-1].content or "")[:12]


class Engine(RolloutEngine):
    """Scripted turns, ``delay`` s each, stamped with the version the engine had when the request
    came in; the first request whose prompt holds ``hold`` waits until ``release`` is set."""

    def __init__(self, delay: float = 0.0, hold: str | None = None) -> None:
        self.inner = ScriptedEngine(echo, ByteChatTokenizer())
        self.tokenizer = self.inner.tokenizer
        self.delay = delay
        self.hold = hold
        self.release = asyncio.Event()

    async def generate(self, request: GenerateRequest) -> Generation:
        version = self.weights_version
        prompt = request.messages[-1].content or ""
        if self.hold is not None and self.hold in prompt:
            self.hold = None
            await self.release.wait()
        await asyncio.sleep(self.delay)
        out = await self.inner.generate(request)
        return out.model_copy(update={"weight_version": version})


def _config(max_staleness: int, steps: int, samples: int = 2) -> Any:
    return validate_config({
        "seed": 3, "steps": steps, "envs": [{"name": LetterEnv.name}],
        "algorithm": {"advantage": "grpo" if samples > 1 else "reinforce++"},
        "rollout": {"engine": "vllm", "tasks_per_step": 2, "samples_per_task": samples,
                    "max_tokens": 16, "max_staleness": max_staleness},
    })  # fmt: skip


async def _train(
    config: Any, engine: Engine, update_s: float, between: Any = None
) -> list[tuple[int, Taken, int]]:
    """The loop's side: take, update (a sleep), sync (the version moves), advance; each step's
    (step, what it took, the next draw the producer would launch when it took it)."""
    producer = GroupProducer(config, TaskSchedule.from_specs(config.envs, config.seed), engine)
    producer.start(first_draw=0)
    steps = []
    try:
        for step in range(config.steps):
            taken = await producer.take(step)
            steps.append((step, taken, producer.next_draw))
            await asyncio.sleep(update_s)
            if between is not None:
                between(step)
            engine.weights_version = step + 1
            producer.advance()
    finally:
        await producer.aclose()
    return steps


def test_at_k0_each_update_takes_its_own_draw_sampled_by_the_policy_it_updates(
    letter_env: str,
) -> None:
    steps = asyncio.run(_train(_config(0, steps=3), Engine(delay=0.001), update_s=0.01))
    for step, taken, next_draw in steps:
        assert next_draw == step + 1  # nothing was drawn ahead of the sync
        assert {t.policy_version for t in taken.trajectories} == {step}
        ids = [t.group_id for t in taken.trajectories]
        assert ids == [f"s{step + 1}e0g0"] * 2 + [f"s{step + 1}e0g1"] * 2  # the jobs' order
        assert taken.metrics == {}  # nothing asynchronous to report


@pytest.mark.parametrize("k", [1, 2])
def test_the_staleness_bound_holds_with_a_slow_trainer_and_a_fast_engine(
    letter_env: str, k: int
) -> None:
    steps = asyncio.run(_train(_config(k, steps=6), Engine(delay=0.001), update_s=0.05))
    for step, taken, next_draw in steps:
        ages = [step - t.policy_version for t in taken.trajectories]
        assert max(ages) <= k and min(ages) >= 0
        # Exactly k draws beyond this one had started: the engine ran ahead, as far as allowed.
        assert next_draw == min(step + k + 1, 6)
        assert taken.metrics["async/staleness_max"] == max(ages)
        assert sum(taken.metrics[f"async/staleness_{a}"] for a in range(k + 1)) == 4
        assert taken.metrics["async/groups_ahead"] >= 0
    # Groups are taken as they are ready, oldest first: some were sampled k versions back.
    assert max(taken.metrics["async/staleness_max"] for _, taken, _ in steps) == k


def test_a_group_older_than_the_bound_is_dropped_counted_and_its_task_sampled_again(
    letter_env: str,
) -> None:
    config = _config(1, steps=4, samples=1)
    first_draw = TaskSchedule.from_specs(config.envs, config.seed).draw(0, 2)[0]
    slow_task = first_draw[0]
    engine = Engine(hold=f"({slow_task})")

    def release_after_update_1(step: int) -> None:
        if step == 1:  # the held episode, sampled by version 0, lands now: too old for step 2
            engine.release.set()

    steps = asyncio.run(_train(config, engine, update_s=0.05, between=release_after_update_1))
    taken = [t for _, s, _ in steps for t in s.trajectories]
    assert len(taken) == 4 * 2
    assert all(step - t.policy_version <= 1 for step, s, _ in steps for t in s.trajectories)
    assert sum(s.metrics["async/stale_groups"] for _, s, _ in steps) == 1
    again = [t for t in taken if t.group_id.startswith("s1r1")]
    assert [(t.task_index, t.group_id) for t in again] == [(slow_task, "s1r1e0g0")]
    assert again[0].policy_version >= 2  # sampled again with the newest weights


def test_groups_without_signal_give_their_place_to_new_tasks_within_the_budget(
    letter_env: str,
) -> None:
    """The echo policy answers every sample of a task alike: no group has signal. With two
    rounds, each draw's groups are set aside and replaced by new tasks once; the replacements,
    still without signal, stay (the budget is spent) and the update's filter drops them."""
    config = _config(0, steps=2)
    config.algorithm.dynamic_sampling_rounds = 2
    steps = asyncio.run(_train(config, Engine(), update_s=0.0))
    for step, taken, _ in steps:
        assert taken.metrics == {"batch/refilled_groups": 2.0}
        aside = sorted({t.group_id for t in taken.set_aside})
        assert aside == [f"s{step + 1}e0g0", f"s{step + 1}e0g1"]
        kept = sorted({t.group_id for t in taken.trajectories})
        n = 2 * step  # tasks launched again or instead are numbered across the run
        assert kept == [f"s{step + 1}r{n + 1}e0g0", f"s{step + 1}r{n + 2}e0g0"]  # a new task each
        assert len(taken.trajectories) == 4 and len(taken.set_aside) == 4
    drawn = TaskSchedule.from_specs(config.envs, config.seed)
    first = drawn.draw(0, 2)[0] + drawn.draw(0, 1, extra=1)[0] + drawn.draw(0, 1, extra=2)[0]
    _, taken, _ = steps[0]
    tasks = [t.task_index for t in taken.set_aside + taken.trajectories][::2]
    assert tasks == first  # the drawn tasks, then one new task per replaced group


def test_a_checkpoint_keeps_the_buffer_and_the_tasks_in_flight_so_no_task_is_skipped(
    letter_env: str,
) -> None:
    """Stop after two updates with draws running ahead (k = 1), save the producer's state as a
    checkpoint does (JSON), go on in a new producer: every drawn task is trained exactly once."""
    config = _config(1, steps=4)

    async def run() -> list[str]:
        schedule = TaskSchedule.from_specs(config.envs, config.seed)
        engine = Engine(delay=0.002)
        first = GroupProducer(config, schedule, engine)
        first.start(first_draw=0)
        trained = []
        for step in range(2):
            trained += [t.group_id for t in (await first.take(step)).trajectories]
            await asyncio.sleep(0.02)
            engine.weights_version = step + 1
        state = json.loads(json.dumps({"producer": first.state_dict(), **schedule.state_dict()}))
        assert state["producer"]["ready"] or state["producer"]["in_flight"]  # it ran ahead
        await first.aclose()
        resumed_schedule = TaskSchedule.from_specs(config.envs, config.seed)
        resumed_schedule.load_state_dict({"cursors": state["cursors"]})
        second = GroupProducer(config, resumed_schedule, Engine(delay=0.002))
        second.load_state_dict(state["producer"])
        second.engine.weights_version = 2
        second.start(first_draw=2)
        for step in range(2, 4):
            trained += [t.group_id for t in (await second.take(step)).trajectories]
            second.engine.weights_version = step + 1
        await second.aclose()
        return trained

    trained = asyncio.run(run())
    groups = sorted(set(trained))
    assert groups == [f"s{d}e0g{g}" for d in range(1, 5) for g in range(2)]
    assert len(trained) == 4 * 2 * 2  # each group once, with both of its samples
