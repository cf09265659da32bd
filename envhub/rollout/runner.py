"""The rollout runner: many episodes at once against one inference engine.

Each task is rolled out ``samples_per_task`` times (a GRPO group). Episodes run concurrently on
one event loop, up to ``max_concurrency`` at a time, each on its own env instance from a pool.
Every failure (env reset/step raising or hanging, the engine failing, a reward raising, the
episode running out of time) is recorded on that episode's trajectory and the batch goes on.
An env whose step timed out is discarded, since its worker thread may still be running.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from envhub._async import within
from envhub.defaults import EPISODE_TIMEOUT_S, STEP_TIMEOUT_S
from envhub.env import Env, close_quietly
from envhub.errors import ConfigError
from envhub.inference.base import InferenceEngine, SamplingParams
from envhub.rewards.rubric import add_group_scores
from envhub.rollout.episode import EpisodeLoop
from envhub.rollout.gc_scope import relaxed_gc
from envhub.rollout.record import EpisodeRecord
from envhub.rollout.roles import RoleSeats
from envhub.rollout.seating import OneActor, Seating
from envhub.rollout.tool_prompt import ToolsInPrompt
from envhub.state import State
from envhub.types import EnvRef, SamplerRef, Trajectory

_INLINE_FACTORY_SECONDS = 0.001
"""An env factory faster than this is called on the event loop (see RolloutRunner._make_env)."""


def episode_seed(seed: int, task_index: int, sample_index: int) -> int:
    """A stable, independent seed per (run seed, task, sample)."""
    return int(np.random.SeedSequence([seed, task_index, sample_index]).generate_state(1)[0])


class RolloutRunner:
    """Runs groups of episodes of one env against an engine.

    Args:
        engine: Where assistant turns come from.
        env_factory: Makes a fresh env instance (e.g. ``lambda: envhub.make("calculator")``).
        sampling: Sampling parameters for every turn.
        max_concurrency: Episodes in flight at once (= env instances in the pool).
        step_timeout: Seconds an env reset or step may take.
        episode_timeout: Seconds a whole episode may take.
        seed: Run seed; each episode's env seed derives from it, the task and the sample index.
    """

    def __init__(
        self,
        engine: InferenceEngine,
        env_factory: Callable[[], Env],
        *,
        sampling: SamplingParams | None = None,
        max_concurrency: int = 64,
        step_timeout: float | None = STEP_TIMEOUT_S,
        episode_timeout: float | None = EPISODE_TIMEOUT_S,
        seed: int = 0,
    ) -> None:
        self.engine = engine
        self.env_factory = env_factory
        self.sampling = sampling or SamplingParams()
        if max_concurrency < 1:  # an empty env pool would make every episode wait forever
            raise ConfigError(f"max_concurrency must be at least 1, got {max_concurrency}")
        self.max_concurrency = max_concurrency
        self.step_timeout = step_timeout
        self.episode_timeout = episode_timeout
        self.seed = seed
        self._pool: asyncio.Queue[Env | None] | None = None
        self._loop: EpisodeLoop | None = None
        self._created: list[Env] = []
        self._env_ref: EnvRef | None = None
        self._tools_in_prompt: ToolsInPrompt | None = None
        self._factory_seconds = float("inf")
        self._inline_factory: bool | None = None  # unknown until the first env is made
        self._probing: asyncio.Event | None = None
        self.sampler: SamplerRef | None = None
        """What samples this runner's turns (the engine's description and ``sampling``), once
        :meth:`run` has started the engine; recorded on every trajectory."""

    @property
    def env_ref(self) -> EnvRef | None:
        """The env that the last run rolled out (with its Hub commit), once one was made."""
        return self._env_ref

    async def run(
        self,
        task_indices: Sequence[int],
        samples_per_task: int = 1,
        on_trajectory: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Roll out every task ``samples_per_task`` times; trajectories in task, then sample order.

        ``on_trajectory`` is called as each group finishes (for progress bars and streaming).
        """
        await self.engine.start()
        described = await self.engine.describe()
        self.sampler = described.model_copy(
            update={"sampling": self.sampling.model_dump(mode="json")}
        )
        # Made per run, so that a run plays with the settings the runner has when it starts.
        self._loop = EpisodeLoop(self.engine, self.sampling, self.step_timeout)
        self._pool = asyncio.Queue()
        self._probing = None  # a run cut off while timing the factory left its event behind
        for _ in range(self.max_concurrency):  # None = a slot whose env is not made yet
            self._pool.put_nowait(None)
        groups = [
            self._run_group(number, task_index, samples_per_task, on_trajectory)
            for number, task_index in enumerate(task_indices)
        ]
        try:
            with relaxed_gc():
                results = await asyncio.gather(*groups)
        finally:
            self._close_pool()
        return [traj for group in results for traj in group]

    async def _run_group(
        self, number: int, task_index: int, n: int, callback: Callable[[Trajectory], None] | None
    ) -> list[Trajectory]:
        group_id = f"g{number}"
        episodes = [
            EpisodeRecord(task_index, i, group_id, episode_seed(self.seed, task_index, i))
            for i in range(n)
        ]
        rubric_env = await asyncio.gather(*(self._run_episode(ep) for ep in episodes))
        await add_group_scores(next((e for e in rubric_env if e is not None), None), episodes)
        trajectories = [t for ep in episodes for t in self._trajectories(ep)]
        if callback:
            for traj in trajectories:
                callback(traj)
        return trajectories

    # -- one episode ----------------------------------------------------------------------------

    async def _run_episode(self, ep: EpisodeRecord) -> Env | None:
        try:
            env = await self._acquire()
        except Exception as e:
            ep.fail("env.make", e)
            return None
        assert self._loop is not None
        try:
            episode = self._loop.play(env, ep, _seating(env), self._chat_tokenizer())
            if self.episode_timeout is None:
                await episode
            else:
                await within(self.episode_timeout, episode)
        except (asyncio.TimeoutError, TimeoutError):
            ep.fail(
                "episode",
                TimeoutError(f"the episode did not finish within {self.episode_timeout:g} s"),
            )
            ep.discard_env = True
        except Exception as e:
            # Anything not attributed above is still this episode's, not the batch's.
            ep.fail("episode", e)
            ep.discard_env = True
        finally:
            self._release(env, healthy=not ep.discard_env)
        return env

    def _chat_tokenizer(self) -> ToolsInPrompt | None:
        """The engine's tokenizer, wrapped so the model sees the tools whatever its template
        (engines set their tokenizer when they start, so this is looked up per episode)."""
        inner = self.engine.tokenizer
        if inner is None:
            return None
        if self._tools_in_prompt is None or self._tools_in_prompt.inner is not inner:
            self._tools_in_prompt = ToolsInPrompt(inner)
        return self._tools_in_prompt

    # -- groups, pool, output -------------------------------------------------------------------

    def _trajectories(self, ep: EpisodeRecord) -> list[Trajectory]:
        """The episode's trajectory, or with several roles one per actor the policy played
        (each also carrying the episode's own failures, a timeout say)."""
        if not ep.seats:
            return [self._trajectory(ep)]
        out = []
        for actor, seat in ep.seats.items():
            if ep.errors:
                seat.errors.extend(ep.errors)
                seat.stop_reason = ep.stop_reason
            traj = self._trajectory(seat)
            info = {"role_result": seat.result, "actors": len(ep.seats)}
            out.append(traj.model_copy(update={"role": actor, "info": info}))
        return out

    def _trajectory(self, ep: EpisodeRecord) -> Trajectory:
        state = ep.state
        messages = (
            list(state.messages)
            if state is not None and len(state.messages) >= len(ep.messages)
            else ep.messages
        )
        trace = ep.trace if ep.trace is not None and ep.trace.valid else None
        return Trajectory(
            env=self._env_ref or EnvRef(name="unknown"),
            sampler=self.sampler,
            task_index=ep.task_index,
            sample_index=ep.sample_index,
            group_id=ep.group_id,
            seed=ep.seed,
            messages=messages,
            prompt_length=ep.prompt_length,
            tools=ep.tools,
            token_ids=trace.ids if trace else None,
            loss_mask=trace.mask if trace else None,
            sampler_logprobs=trace.logprobs if trace else None,
            prompt_token_count=trace.prompt_length if trace else None,
            segments=ep.segments,
            reward=0.0 if ep.stop_reason in ("error", "timeout") else ep.reward,
            reward_components=ep.components,
            terminated=ep.terminated,
            truncated=ep.truncated or ep.stop_reason in ("error", "timeout"),
            stop_reason=ep.stop_reason,
            turns=ep.turns,
            metrics=self._metrics(ep),
            errors=ep.errors,
            token_drift=ep.drift + (ep.trace.drift if ep.trace is not None else []),
            info=_task_labels(state),
            seconds=time.perf_counter() - ep.started,
        )

    @staticmethod
    def _metrics(ep: EpisodeRecord) -> dict[str, float]:
        metrics = {k: float(v) for k, v in ep.env_metrics.items()}
        metrics["turns"] = float(len(ep.turns))
        metrics["completion_tokens"] = float(sum(t.completion_tokens or 0 for t in ep.turns))
        if ep.trace is not None:
            metrics["total_tokens"] = float(len(ep.trace.ids))
        return metrics

    async def _acquire(self) -> Env:
        assert self._pool is not None
        env = await self._pool.get()
        if env is not None:
            return env
        try:
            env = await self._make_env()
        except BaseException:
            self._pool.put_nowait(None)
            raise
        self._created.append(env)
        if self._env_ref is None:
            # With the commit its package was installed from, when it came from the Hub.
            from envhub.hub.provenance import env_ref

            self._env_ref = env_ref(env)
        return env

    async def _make_env(self) -> Env:
        """A new env from the factory. The first one is made in a thread and timed while other
        episodes wait; from then on envs are made on the loop when that took under a
        millisecond (a thread hop per env cost more than the env: 1024 of them were a tenth of
        a token-level run of bench/rollout_throughput.py), else in threads, so a slow factory
        never stalls the loop. Deciding once keeps the order in which episodes reach the engine
        (and so what a batching engine samples) the same from run to run."""
        if self._inline_factory is None:
            if self._probing is not None:
                await self._probing.wait()
            else:
                self._probing = asyncio.Event()
                try:
                    return await asyncio.to_thread(self._timed_factory)
                finally:
                    self._inline_factory = self._factory_seconds < _INLINE_FACTORY_SECONDS
                    self._probing.set()
        if self._inline_factory:
            return self.env_factory()
        return await asyncio.to_thread(self.env_factory)

    def _timed_factory(self) -> Env:
        started = time.perf_counter()
        try:
            return self.env_factory()
        finally:
            self._factory_seconds = time.perf_counter() - started

    def _release(self, env: Env, healthy: bool) -> None:
        assert self._pool is not None
        if healthy:
            self._pool.put_nowait(env)
            return
        self._created.remove(env)
        self._pool.put_nowait(None)
        close_quietly(env)

    def _close_pool(self) -> None:
        for env in self._created:
            close_quietly(env)
        self._created.clear()


def _seating(env: Env) -> Seating:
    """Who acts in an episode of ``env``: the one actor, or the roles of a multi-role env."""
    return RoleSeats() if env.multi_role else OneActor()


def _task_labels(state: State | None) -> dict[str, Any]:
    """``{"task": name}`` when the episode's task row names itself (``info["name"]``, as a
    Harbor task's row does: ``envhub show`` labels the episode with it), and ``{"image": ...}``
    when it names the image it ran in (a Harbor task in a container, stand-in included)."""
    info = state.task.get("info") if state is not None else None
    if not isinstance(info, dict):
        return {}
    labels = {"task": info.get("name"), "image": info.get("image")}
    return {key: value for key, value in labels.items() if isinstance(value, str) and value}
