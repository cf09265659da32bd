"""Episode wall time of ``setter-solver`` with its solvers sampled together (as the env lists
them in ``info["upcoming"]``) against one after another (the baseline: the same env with
``Match.upcoming`` left empty, which is how the runner played every solver before).

Two engines:

- ``scripted``: a scripted policy behind a fixed delay per call (``--delay``, seconds), the
  shape of a remote server that answers requests in parallel;
- ``hf``: :class:`HFEngine` with SmolLM2-135M-Instruct on the CPU (batching the requests that
  arrive together), sampling up to ``--max-tokens`` tokens per turn at temperature 1.

Each runs ``--episodes`` episodes one at a time (``max_concurrency=1``: the speed-up is within
an episode) with ``--attempts`` solvers and the env's ``random`` setter (a model's problems are
often invalid, and then no solver plays), and prints the mean seconds per episode side by side.

    PYTHONPATH=. .venv/bin/python bench/setter_solver_concurrency.py [--engines scripted hf] \
        [--episodes 3] [--attempts 4] [--delay 0.2] [--max-tokens 48]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from envhub.envs.setter_solver import SetterSolverEnv
from envhub.inference.base import GenerateRequest, Generation, SamplingParams
from envhub.roles import Match
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.types import AssistantTurn, Message


class OneAtATime(SetterSolverEnv):
    """The baseline: the same env, listing no upcoming solvers (each sampled on its turn)."""

    def play(self, match: Match, actor: str, turn: AssistantTurn) -> None:
        """As the env plays it, then forget the upcoming solvers."""
        super().play(match, actor, turn)
        match.upcoming = []


def solver(messages: list[Message], tools: Any) -> str:
    """Every solver answers the same."""
    return "\\boxed{40}"


class SlowEngine(ScriptedEngine):
    """The scripted solver, each call taking ``delay`` seconds (calls overlap)."""

    def __init__(self, delay: float) -> None:
        super().__init__(solver, tokenizer=ByteChatTokenizer())
        self.delay = delay

    async def generate(self, request: GenerateRequest) -> Generation:
        """The policy's turn, after the delay."""
        await asyncio.sleep(self.delay)
        return await super().generate(request)


def seconds_per_episode(
    engine: Any, env: type, episodes: int, attempts: int, **runner: Any
) -> float:
    """Mean wall seconds of ``episodes`` episodes played one at a time."""
    factory = lambda: env(attempts=attempts, policies={"setter": "random"})  # noqa: E731
    rollout = RolloutRunner(engine, factory, max_concurrency=1, seed=0, **runner)

    async def play() -> None:
        try:
            await rollout.run(list(range(episodes)))
        finally:
            await engine.aclose()  # an engine's batching task belongs to this event loop

    started = time.perf_counter()
    asyncio.run(play())
    return (time.perf_counter() - started) / episodes


def hf_engine() -> Any:
    """SmolLM2-135M-Instruct in an :class:`HFEngine` on the CPU."""
    import torch  # noqa: TID251 - a script outside the package; it needs torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envhub.trainer.engines import HFEngine
    from envhub.trainer.models import resolve_model

    path = resolve_model("smollm2-135m")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return HFEngine(model, AutoTokenizer.from_pretrained(path), seed=0)


def main() -> None:
    """Parse the arguments and print seconds per episode, one after another vs together."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=["scripted", "hf"])
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--attempts", type=int, default=4)
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    print(f"{'engine':<28} {'one after another s/ep':>22} {'together s/ep':>14} {'speed-up':>9}")
    for name in args.engines:
        if name == "scripted":
            engine, label, runner = SlowEngine(args.delay), f"scripted, {args.delay} s/call", {}
        else:
            engine, label = hf_engine(), "hf SmolLM2-135M, cpu"
            runner = {"sampling": SamplingParams(temperature=1.0, max_tokens=args.max_tokens)}
        for env in (OneAtATime, SetterSolverEnv):  # first-call costs out of the way
            seconds_per_episode(engine, env, 1, args.attempts, **runner)
        before = seconds_per_episode(engine, OneAtATime, args.episodes, args.attempts, **runner)
        after = seconds_per_episode(engine, SetterSolverEnv, args.episodes, args.attempts, **runner)
        print(f"{label:<28} {before:>22.3f} {after:>14.3f} {before / after:>8.2f}x", flush=True)


if __name__ == "__main__":
    main()
