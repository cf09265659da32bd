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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from envhub._async import within
from envhub.defaults import EPISODE_TIMEOUT_S, STEP_TIMEOUT_S
from envhub.env import NEW_SEGMENT, Env, EpisodeEnv, close_quietly
from envhub.errors import ConfigError
from envhub.inference.base import GenerateRequest, Generation, InferenceEngine, SamplingParams
from envhub.rewards.rubric import add_group_scores
from envhub.roles import ROLE
from envhub.rollout.gc_scope import relaxed_gc
from envhub.rollout.roles import drive_roles
from envhub.rollout.tokens import TokenTrace, append_env_turn
from envhub.rollout.tool_prompt import ToolsInPrompt
from envhub.state import State
from envhub.types import (
    AssistantTurn,
    EnvRef,
    ErrorRecord,
    Message,
    SamplerRef,
    TokenSegment,
    Trajectory,
    TurnRecord,
    as_message,
    assistant,
    is_infrastructure_error,
)

_INLINE_FACTORY_SECONDS = 0.001
"""An env factory faster than this is called on the event loop (see RolloutRunner._make_env)."""


@dataclass
class _Episode:
    """Mutable record of one episode in progress (kept outside the episode coroutine so that a
    timeout still leaves everything recorded so far)."""

    task_index: int
    sample_index: int
    group_id: str
    seed: int
    messages: list[Message] = field(default_factory=list)
    prompt_length: int = 0
    tools: list[dict[str, Any]] | None = None
    trace: TokenTrace | None = None
    segment_start: int = 0
    """Where the current segment's conversation starts in ``messages`` (0 unless the env
    started a new segment: :data:`~envhub.env.NEW_SEGMENT`)."""
    segments: list[TokenSegment] = field(default_factory=list)
    """Token records of the finished segments before ``trace``."""
    segment_turn: int = 0
    """The first turn of the current segment."""
    drift: list[dict[str, Any]] = field(default_factory=list)
    """Drift recorded by the finished segments' traces."""
    turns: list[TurnRecord] = field(default_factory=list)
    errors: list[ErrorRecord] = field(default_factory=list)
    reward: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    env_metrics: dict[str, float] = field(default_factory=dict)
    terminated: bool = False
    truncated: bool = False
    stop_reason: str = "error"
    state: State | None = None
    discard_env: bool = False
    """Set when the env timed out: its worker thread may still run, so it is not reused."""
    started: float = field(default_factory=time.perf_counter)
    seats: dict[str, _Episode] = field(default_factory=dict)
    """In an episode with several roles: each actor the policy played, by actor id, with its
    own record (:mod:`envhub.rollout.roles`); empty for a one-role episode."""
    result: str | None = None
    """A seat's result as the env reported it (``win``, ``crashed``, ...)."""
    last_finish: str | None = None
    """A seat's last turn's finish reason (how its next reply is appended to its tokens)."""
    pending_error: BaseException | None = None

    @property
    def conversation(self) -> list[Message]:
        """The current segment's messages (all of them, unless the env started a new one)."""
        return self.messages[self.segment_start :] if self.segment_start else self.messages

    def fail(self, stage: str, error: BaseException | str, turn: int | None = None) -> None:
        timed_out = isinstance(error, (asyncio.TimeoutError, TimeoutError))
        kind = "timeout" if timed_out else type(error).__name__
        # The engine is infrastructure, whatever it raised; elsewhere the exception tells.
        infra = stage == "engine" or (
            isinstance(error, BaseException) and is_infrastructure_error(error)
        )
        self.errors.append(
            ErrorRecord(stage=stage, type=kind, message=str(error) or kind, turn=turn, infra=infra)
        )
        self.stop_reason = "timeout" if timed_out else "error"
        self.discard_env = self.discard_env or (timed_out and stage.startswith("env."))


def _as_messages(messages: Sequence[Message | dict[str, Any]]) -> list[Message]:
    return [as_message(m) for m in messages]


def _tool_counts(ep: _Episode) -> tuple[int, int]:
    """Tool calls and failed calls so far, from the env's metrics (a :class:`TaskEnv`'s state)."""
    metrics = ep.state.metrics if ep.state is not None else {}
    return int(metrics.get("tool_calls", 0)), int(metrics.get("tool_errors", 0))


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
            _Episode(task_index, i, group_id, episode_seed(self.seed, task_index, i))
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

    async def _run_episode(self, ep: _Episode) -> Env | None:
        try:
            env = await self._acquire()
        except Exception as e:
            ep.fail("env.make", e)
            return None
        try:
            if self.episode_timeout is None:
                await self._drive(env, ep)
            else:
                await within(self.episode_timeout, self._drive(env, ep))
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

    async def _drive(self, env: Env, ep: _Episode) -> None:
        try:
            observation, info = await self._timed(
                env.areset(seed=ep.seed, options={"task_index": ep.task_index})
            )
        except Exception as e:
            return ep.fail("env.reset", e)
        if isinstance(info.get(ROLE), str):  # several roles: each trained actor has its own
            return await drive_roles(self, env, ep, _as_messages(observation), info)
        ep.messages, ep.prompt_length, ep.tools = (
            _as_messages(observation),
            len(observation),
            env.tool_schemas,
        )
        ep.state = env.state if isinstance(env, EpisodeEnv) else None
        tokenizer = self._chat_tokenizer()
        if tokenizer is not None:
            try:
                prompt_ids = await tokenizer.render(
                    ep.messages, ep.tools, add_generation_prompt=True
                )
            except Exception as e:
                # The tokenizer belongs to the engine (e.g. a server's /tokenize).
                return ep.fail("engine", e, 0)
            ep.trace = TokenTrace()
            ep.trace.start(prompt_ids)
        while True:
            turn = len(ep.turns)
            max_tokens, limit_reason = self._turn_budget(env, ep)
            if max_tokens <= 0:
                return await self._truncate(env, ep, limit_reason)
            request = self._request(ep, max_tokens)
            started = time.perf_counter()
            try:
                generation = await self.engine.generate(request)
            except Exception as e:
                return ep.fail("engine", e, turn)
            gen_seconds = time.perf_counter() - started
            self._record_tokens(ep, generation, turn)
            action = AssistantTurn(
                message=assistant(generation.text, generation.tool_calls),
                num_tokens=len(generation.token_ids) if generation.token_ids is not None else None,
                finish_reason=generation.finish_reason,
            )
            tools_before, started = _tool_counts(ep), time.perf_counter()
            try:
                observation, reward, terminated, truncated, info = await self._timed(
                    env.astep(action)
                )
            except Exception as e:
                ep.messages.append(action.message)
                return ep.fail("env.step", e, turn)
            observation = _as_messages(observation)
            ep.messages.append(action.message)
            new_segment = bool(info.get(NEW_SEGMENT))
            if new_segment:
                ep.segment_start = len(ep.messages)
            ep.messages.extend(observation)
            env_seconds = time.perf_counter() - started
            ep.turns.append(
                self._turn_record(
                    ep, request, generation, action, tools_before, gen_seconds, env_seconds, reward
                )
            )
            ep.reward += float(reward)  # the episode's reward is the sum of its steps'
            if terminated or truncated:
                return self._finish(ep, terminated, truncated, info)
            if new_segment:
                try:
                    await self._start_segment(ep, tokenizer, info.get("tools"))
                except Exception as e:
                    return ep.fail("engine", e, turn + 1)
            elif tokenizer is not None and ep.trace is not None and ep.trace.valid:
                try:  # drift is recorded against the next turn, whose prompt this builds
                    await append_env_turn(
                        ep.trace,
                        tokenizer,
                        ep.conversation,
                        observation,
                        ep.tools,
                        turn + 1,
                        generation.finish_reason == "stop",
                    )
                except Exception as e:
                    return ep.fail("engine", e, turn + 1)

    async def _start_segment(
        self, ep: _Episode, tokenizer: ToolsInPrompt | None, tools: list[dict[str, Any]] | None
    ) -> None:
        """Close the current token record as a segment and start the next one from the
        conversation the env just sent (a harness that rewrote its history)."""
        trace = ep.trace
        if trace is not None:
            ep.drift.extend(trace.drift)
            if trace.valid and 1 in trace.mask:
                trace.trim_to_last_sampled()
                ep.segments.append(
                    TokenSegment(
                        token_ids=trace.ids,
                        loss_mask=trace.mask,
                        sampler_logprobs=trace.logprobs,
                        prompt_token_count=trace.prompt_length,
                        first_turn=ep.segment_turn,
                    )
                )
        ep.tools, ep.segment_turn, ep.trace = tools, len(ep.turns), None
        if tokenizer is not None:  # a chat-level engine's next generation starts the record
            prompt_ids = await tokenizer.render(ep.conversation, tools, add_generation_prompt=True)
            ep.trace = TokenTrace()
            ep.trace.start(prompt_ids)

    def _chat_tokenizer(self) -> ToolsInPrompt | None:
        """The engine's tokenizer, wrapped so the model sees the tools whatever its template
        (engines set their tokenizer when they start, so this is looked up per episode)."""
        inner = self.engine.tokenizer
        if inner is None:
            return None
        if self._tools_in_prompt is None or self._tools_in_prompt.inner is not inner:
            self._tools_in_prompt = ToolsInPrompt(inner)
        return self._tools_in_prompt

    def _request(self, ep: _Episode, max_tokens: int) -> GenerateRequest:
        sampling = self.sampling.model_copy(update={"max_tokens": max_tokens})
        prompt_ids = (
            list(ep.trace.ids)
            if ep.trace is not None and self.engine.tokenizer is not None
            else None
        )
        return GenerateRequest(
            messages=ep.conversation,
            tools=ep.tools,
            prompt_ids=prompt_ids,
            sampling=sampling,
        )

    def _turn_budget(self, env: Env, ep: _Episode) -> tuple[int, str]:
        limit, reason = self.sampling.max_tokens, ""
        remaining = env.remaining_tokens
        if remaining is not None and remaining < limit:
            limit, reason = remaining, "max_tokens"
        tokenizer = self.engine.tokenizer
        if tokenizer is not None and tokenizer.max_length and ep.trace is not None:
            room = tokenizer.max_length - len(ep.trace.ids)
            if room < limit:
                limit, reason = room, "max_context"
        return limit, reason

    def _record_tokens(self, ep: _Episode, generation: Generation, turn: int) -> None:
        """Chat-level engines report each turn's prompt ids: check them against the record."""
        if generation.token_ids is None:
            if ep.trace is not None:
                ep.trace.valid = False
            return
        if generation.prompt_token_ids is not None:
            if ep.trace is None:
                ep.trace = TokenTrace()
                ep.trace.start(generation.prompt_token_ids)
            elif ep.trace.valid and not ep.trace.extend_to(generation.prompt_token_ids, turn):
                ep.trace.valid = False
        if ep.trace is not None and ep.trace.valid:
            ep.trace.add_sampled(generation.token_ids, generation.logprobs)

    async def _truncate(self, env: Env, ep: _Episode, reason: str) -> None:
        if ep.trace is not None:  # the env's last reply will never be answered: keep it out
            ep.trace.trim_to_last_sampled()
        if isinstance(env, EpisodeEnv) and env.state is not None and env.state.stop_reason is None:
            reward, info = await env.atruncate(reason)
            ep.reward += float(reward)  # a score no turn returned
            self._finish(ep, False, True, info)
        else:
            ep.truncated, ep.stop_reason = True, reason

    def _finish(
        self, ep: _Episode, terminated: bool, truncated: bool, info: dict[str, Any]
    ) -> None:
        ep.terminated, ep.truncated = bool(terminated), bool(truncated)
        ep.stop_reason = info.get("stop_reason") or ("terminated" if terminated else "truncated")
        ep.components = dict(info.get("reward_components", {}))
        ep.env_metrics = dict(info.get("metrics", {}))
        ep.errors.extend(info.get("errors", []))

    @staticmethod
    def _turn_record(
        ep: _Episode,
        request: GenerateRequest,
        generation: Generation,
        action: AssistantTurn,
        tools_before: tuple[int, int],
        gen_s: float,
        env_s: float,
        reward: float,
    ) -> TurnRecord:
        calls, errors = (
            after - before for after, before in zip(_tool_counts(ep), tools_before, strict=True)
        )
        prompt = (
            request.prompt_ids if request.prompt_ids is not None else generation.prompt_token_ids
        )
        return TurnRecord(
            prompt_tokens=len(prompt) if prompt is not None else None,
            completion_tokens=action.num_tokens,
            finish_reason=generation.finish_reason,
            tool_calls=calls,
            tool_errors=errors,
            generate_seconds=gen_s,
            env_seconds=env_s,
            policy_version=generation.weight_version,
            structured_tool_calls=bool(generation.tool_calls),
            reward=float(reward),
        )

    async def _timed(self, coro: Any) -> Any:
        if self.step_timeout is None:
            return await coro
        try:
            return await within(self.step_timeout, coro)
        except (asyncio.TimeoutError, TimeoutError) as e:
            if str(e):  # the env's own timeout, with its own message
                raise
            raise TimeoutError(f"did not finish within {self.step_timeout:g} s") from None

    # -- groups, pool, output -------------------------------------------------------------------

    def _trajectories(self, ep: _Episode) -> list[Trajectory]:
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

    def _trajectory(self, ep: _Episode) -> Trajectory:
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
            info=_task_name(state),
            seconds=time.perf_counter() - ep.started,
        )

    @staticmethod
    def _metrics(ep: _Episode) -> dict[str, float]:
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


def _task_name(state: State | None) -> dict[str, Any]:
    """``{"task": name}`` when the episode's task row names itself (``info["name"]``, as a
    Harbor task's row does: ``envhub show`` labels the episode with it), else nothing."""
    info = state.task.get("info") if state is not None else None
    name = info.get("name") if isinstance(info, dict) else None
    return {"task": name} if isinstance(name, str) and name else {}
