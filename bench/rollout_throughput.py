"""Episodes/s of the rollout runner on the multi-turn calculator env with a zero-latency
scripted policy, against a plain Python loop calling the same env (the limit).

Each episode is two assistant turns (a tool call, then the answer) plus a reward. The runner is
measured at message level (no tokenizer) and at token level (byte tokenizer: every turn is
rendered and the token trace is kept), at several concurrency levels.

Two rubrics: the env's own (math-verify, which dominates the cost) and exact match (which
leaves the runner's own overhead visible).

    .venv/bin/python bench/rollout_throughput.py [--episodes 2048]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from envhub.envs.calculator import CalculatorEnv, reference_policy
from envhub.rewards.match import exact_match
from envhub.rewards.rubric import Rubric
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.types import Message


def make_env(reward: str) -> CalculatorEnv:
    """A calculator env scored by math-verify (``reward == "math"``) or by exact match.

    math-verify (sympy) costs ~8 ms per episode; exact match shows the runner's own overhead.
    """
    return CalculatorEnv() if reward == "math" else CalculatorEnv(rubric=Rubric([exact_match()]))


def plain_loop(episodes: int, reward: str) -> float:
    """Episodes/s of a synchronous loop calling ``env.step`` with the reference policy.

    This is the limit the runner is compared with: no engine, no asyncio, no concurrency.
    Every episode must earn a reward of 1.
    """
    env = make_env(reward)
    started = time.perf_counter()
    for i in range(episodes):
        observation, _ = env.reset(seed=i, options={"task_index": i % len(env.dataset)})
        messages: list[Message] = list(observation)
        while True:
            text = reference_policy(messages, env.tool_schemas)
            observation, reward, terminated, truncated, _ = env.step(text)
            messages += [Message(role="assistant", content=text), *observation]
            if terminated or truncated:
                assert reward == 1.0
                break
    return episodes / (time.perf_counter() - started)


def runner(episodes: int, concurrency: int, tokens: bool, reward: str) -> float:
    """Episodes/s of :class:`RolloutRunner` driving a scripted reference-policy engine.

    Args:
        episodes: How many episodes to run (one sample per task, cycling over the 1000 tasks).
        concurrency: The runner's ``max_concurrency``.
        tokens: Run at token level (byte tokenizer, token trace kept) instead of message level.
        reward: ``"math"`` for math-verify, anything else for exact match.
    """
    engine = ScriptedEngine(reference_policy, ByteChatTokenizer() if tokens else None)
    run = RolloutRunner(
        engine,
        lambda: make_env(reward),
        max_concurrency=concurrency,
        step_timeout=None,
        episode_timeout=None,
    )
    started = time.perf_counter()
    tasks = [i % 1000 for i in range(episodes)]  # the env has 1000 tasks
    trajectories = asyncio.run(run.run(tasks, samples_per_task=1))
    elapsed = time.perf_counter() - started
    assert all(t.reward == 1.0 for t in trajectories), "the reference policy must solve every task"
    return episodes / elapsed


def best_of(repeats: int, fn, *args) -> float:
    """The highest rate of ``repeats`` calls of ``fn(*args)`` (the least disturbed run)."""
    return max(fn(*args) for _ in range(repeats))


def main() -> None:
    """Print episodes/s of the plain loop and of the runner in each setting, for both rubrics."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{'reward':<7} {'setting':<42} {'episodes/s':>11} {'vs loop':>8}")
    for reward in ("exact", "math"):
        limit = best_of(args.repeats, plain_loop, args.episodes, reward)
        print(f"{reward:<7} {'plain loop (sync env.step)':<42} {limit:>11.0f} {1.0:>8.2f}")
        for tokens in (False, True):
            for concurrency in (1, 64, 1024):
                rate = best_of(args.repeats, runner, args.episodes, concurrency, tokens, reward)
                label = (
                    f"runner, {'token' if tokens else 'message'} level, concurrency {concurrency}"
                )
                print(f"{reward:<7} {label:<42} {rate:>11.0f} {rate / limit:>8.2f}")


if __name__ == "__main__":
    main()
