"""The episode loop: one episode of an env, turn by turn, against an inference engine.

Each turn belongs to an actor, and each actor has its own record (:mod:`envhub.rollout.record`):
its conversation, its token trace (prompt rendered with the chat template, sampled tokens with
mask 1, whatever it was shown since its last turn appended with mask 0) and its turns. A
:class:`~envhub.rollout.seating.Seating` tells the loop who moves and where that actor's record
lives: a one-role episode is one actor whose record is the episode's; an episode with several
roles seats each actor on a record of its own. The loop is the same for both.

Actors that move one after another without seeing each other's moves (the seating's
``upcoming``: the solvers of one problem) are sampled together: their turns go to the engine at
once, in order (an engine that batches runs them as one batch), and are then played into the env
one by one, exactly as if each had been sampled on its turn. Only actors that have not moved yet
are sampled ahead (their records are fresh), and only without an env token budget (which would
change between their steps); a turn sampled ahead whose actor is then shown something else is
sampled again, and one never reached (the episode ended first) is dropped. So the records are
those of playing them in turn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from envhub._async import within
from envhub.env import NEW_SEGMENT, Env
from envhub.inference.base import GenerateRequest, Generation, InferenceEngine, SamplingParams
from envhub.rollout.record import EpisodeRecord
from envhub.rollout.seating import Seating
from envhub.rollout.tokens import TokenTrace, append_env_turn
from envhub.rollout.tool_prompt import ToolsInPrompt
from envhub.types import AssistantTurn, Message, TokenSegment, TurnRecord, as_message, assistant


@dataclass
class _Turn:
    """One actor's turn, ready to sample and then sampled: its record, what it was shown,
    the request, and the generation or the engine's failure."""

    actor: str | None
    record: EpisodeRecord
    shown: list[Message]
    request: GenerateRequest
    generation: Generation | None = None
    error: Exception | None = None
    seconds: float = 0.0


def as_messages(messages: Sequence[Message | dict[str, Any]]) -> list[Message]:
    """``messages`` as :class:`Message` objects (an env may return plain dicts)."""
    return [as_message(m) for m in messages]


class EpisodeLoop:
    """Plays episodes turn by turn against ``engine``.

    Args:
        engine: Where assistant turns come from.
        sampling: Sampling parameters for every turn (``max_tokens`` cut to the turn's budget).
        step_timeout: Seconds an env reset or step may take (``None``: no limit).
    """

    def __init__(
        self, engine: InferenceEngine, sampling: SamplingParams, step_timeout: float | None
    ) -> None:
        self.engine, self.sampling, self.step_timeout = engine, sampling, step_timeout

    async def play(
        self,
        env: Env,
        ep: EpisodeRecord,
        seats: Seating,
        tokenizer: ToolsInPrompt | None,
    ) -> None:
        """Play one episode of ``env`` from its reset to its end, filling ``ep`` (and the
        actors' records ``seats`` keeps); every failure is recorded, none raised."""
        try:
            observation, info = await self._timed(
                env.areset(seed=ep.seed, options={"task_index": ep.task_index})
            )
        except Exception as e:
            return ep.fail("env.reset", e)
        actor, shown, ahead = seats.to_move(info), as_messages(observation), {}
        while True:
            turn = ahead.pop(actor, None)
            if turn is not None and _same(turn.shown, shown):
                seats.seat(ep, actor, turn.record)
            else:
                turn = await self._ready(env, ep, seats, actor, shown, info, tokenizer)
                if turn is None:  # the episode ended instead (recorded)
                    return None
                later = await self._turns_ahead(env, ep, seats, info, ahead, tokenizer)
                await self._sample(turn, later)
                ahead |= {t.actor: t for t in later}
            stepped = await self._step(env, ep, seats, turn)
            if stepped is None:  # the episode ended (recorded)
                return None
            shown, info = stepped
            actor = seats.to_move(info)

    async def _timed(self, coro: Any) -> Any:
        """Await ``coro`` within the step timeout (its own timeout's message kept)."""
        if self.step_timeout is None:
            return await coro
        try:
            return await within(self.step_timeout, coro)
        except (asyncio.TimeoutError, TimeoutError) as e:
            if str(e):  # the env's own timeout, with its own message
                raise
            raise TimeoutError(f"did not finish within {self.step_timeout:g} s") from None

    # -- a turn ---------------------------------------------------------------------------------

    async def _ready(
        self,
        env: Env,
        ep: EpisodeRecord,
        seats: Seating,
        actor: str | None,
        shown: list[Message],
        info: dict[str, Any],
        tokenizer: ToolsInPrompt | None,
    ) -> _Turn | None:
        """``actor``'s turn, ready to sample: its record opened on ``shown`` (its first turn) or
        brought up to date with it; ``None`` when the episode ended instead, recorded (the
        tokenizer failed, or no tokens are left)."""
        record = seats.record(ep, actor)
        if record is None:
            record = seats.new_record(ep, env)
            seats.seat(ep, actor, record)
            error = await _open(record, shown, env.tool_schemas, tokenizer)
        else:
            error = await self._catch_up(record, shown, info, tokenizer)
        if error is not None:  # the tokenizer belongs to the engine (e.g. a server's /tokenize)
            seats.fail(ep, actor, "engine", error, len(record.turns))
            return None
        max_tokens, reason = self._turn_budget(env, record)
        if max_tokens <= 0:
            await seats.truncate(env, ep, reason)
            return None
        return _Turn(actor, record, shown, self._request(record, max_tokens))

    async def _turns_ahead(
        self,
        env: Env,
        ep: EpisodeRecord,
        seats: Seating,
        info: dict[str, Any],
        ahead: dict[str | None, _Turn],
        tokenizer: ToolsInPrompt | None,
    ) -> list[_Turn]:
        """The turns of the seating's upcoming actors, ready to sample now, in order: up to the
        first that has a record already, is sampled ahead already, or could not be made ready
        (its tokenizer failed, no tokens left: that is recorded when its turn comes). None under
        an env token budget, which changes with every step."""
        upcoming = seats.upcoming(info)
        if not upcoming or env.remaining_tokens is not None:
            return []
        turns: list[_Turn] = []
        for actor, shown in upcoming.items():
            if seats.record(ep, actor) is not None or actor in ahead:
                break
            shown = as_messages(shown)
            record = seats.new_record(ep, env)
            failed = await _open(record, shown, env.tool_schemas, tokenizer)
            max_tokens, _ = self._turn_budget(env, record)
            if failed is not None or max_tokens <= 0:
                break
            turns.append(_Turn(actor, record, shown, self._request(record, max_tokens)))
        return turns

    async def _sample(self, turn: _Turn, later: list[_Turn]) -> None:
        """Sample ``turn``, and the ``later`` ones with it in one go."""
        if later:
            await asyncio.gather(*(self._generate(t) for t in [turn, *later]))
        else:  # awaited in place: the event loop's schedule is that of one call
            await self._generate(turn)

    async def _generate(self, turn: _Turn) -> None:
        """Ask the engine for ``turn``: its generation, or the failure, and how long it took."""
        started = time.perf_counter()
        try:
            turn.generation = await self.engine.generate(turn.request)
        except Exception as e:
            turn.error = e
        turn.seconds = time.perf_counter() - started

    async def _step(
        self, env: Env, ep: EpisodeRecord, seats: Seating, turn: _Turn
    ) -> tuple[list[Message], dict[str, Any]] | None:
        """Play the sampled ``turn`` into the env and record it; what the next actor is shown
        and the step's ``info``, or ``None`` when the episode ended (recorded)."""
        record, actor, generation = turn.record, turn.actor, turn.generation
        index = len(record.turns)
        if generation is None:
            assert turn.error is not None
            return seats.fail(ep, actor, "engine", turn.error, index)
        self._record_tokens(record, generation, index)
        action = _action(generation, actor)
        record.messages.append(action.message)
        record.last_finish = generation.finish_reason
        tools_before, started = record.tool_counts(), time.perf_counter()
        try:
            observation, reward, terminated, truncated, info = await self._timed(env.astep(action))
        except Exception as e:
            return seats.fail(ep, actor, "env.step", e, index)
        observation, env_seconds = as_messages(observation), time.perf_counter() - started
        _show(seats.record(ep, seats.to_move(info)), observation, info)
        paid = seats.payments(reward, info)
        record.turns.append(
            _turn_record(record, turn, action, tools_before, env_seconds, paid.get(actor, 0.0))
        )
        _pay(ep, seats, actor, paid)
        if terminated or truncated:
            return seats.finish(ep, terminated, truncated, info)
        return observation, info

    # -- the token record -----------------------------------------------------------------------

    async def _catch_up(
        self,
        record: EpisodeRecord,
        shown: list[Message],
        info: dict[str, Any],
        tokenizer: ToolsInPrompt | None,
    ) -> Exception | None:
        """Bring ``record``'s tokens up to what it was ``shown`` since its last turn (already in
        its messages): a new segment when the env started one, else the env's turn appended;
        the tokenizer's failure, if it failed."""
        try:
            if info.get(NEW_SEGMENT):
                await self._start_segment(record, tokenizer, info.get("tools"))
            elif tokenizer is not None and record.trace is not None and record.trace.valid:
                # drift is recorded against the coming turn, whose prompt this builds
                await append_env_turn(
                    record.trace,
                    tokenizer,
                    record.conversation,
                    shown,
                    record.tools,
                    len(record.turns),
                    record.last_finish == "stop",
                )
        except Exception as e:
            return e
        return None

    async def _start_segment(
        self,
        record: EpisodeRecord,
        tokenizer: ToolsInPrompt | None,
        tools: list[dict[str, Any]] | None,
    ) -> None:
        """Close the current token record as a segment and start the next one from the
        conversation the env just sent (a harness that rewrote its history)."""
        trace = record.trace
        if trace is not None:
            record.drift.extend(trace.drift)
            if trace.valid and 1 in trace.mask:
                trace.trim_to_last_sampled()
                record.segments.append(
                    TokenSegment(
                        token_ids=trace.ids,
                        loss_mask=trace.mask,
                        sampler_logprobs=trace.logprobs,
                        prompt_token_count=trace.prompt_length,
                        first_turn=record.segment_turn,
                    )
                )
        record.tools, record.segment_turn, record.trace = tools, len(record.turns), None
        if tokenizer is not None:  # a chat-level engine's next generation starts the record
            prompt_ids = await tokenizer.render(
                record.conversation, tools, add_generation_prompt=True
            )
            record.trace = TokenTrace()
            record.trace.start(prompt_ids)

    def _record_tokens(self, record: EpisodeRecord, generation: Generation, turn: int) -> None:
        """Chat-level engines report each turn's prompt ids: check them against the record."""
        if generation.token_ids is None:
            if record.trace is not None:
                record.trace.valid = False
            return
        if generation.prompt_token_ids is not None:
            if record.trace is None:
                record.trace = TokenTrace()
                record.trace.start(generation.prompt_token_ids)
            elif record.trace.valid and not record.trace.extend_to(
                generation.prompt_token_ids, turn
            ):
                record.trace.valid = False
        if record.trace is not None and record.trace.valid:
            record.trace.add_sampled(generation.token_ids, generation.logprobs)

    def _request(self, record: EpisodeRecord, max_tokens: int) -> GenerateRequest:
        sampling = self.sampling.model_copy(update={"max_tokens": max_tokens})
        prompt_ids = (
            list(record.trace.ids)
            if record.trace is not None and self.engine.tokenizer is not None
            else None
        )
        return GenerateRequest(
            messages=record.conversation,
            tools=record.tools,
            prompt_ids=prompt_ids,
            sampling=sampling,
        )

    def _turn_budget(self, env: Env, record: EpisodeRecord) -> tuple[int, str]:
        """The turn's ``max_tokens``: the smallest of the sampling's, the env's budget and the
        room left in the context, with the reason when it is not the sampling's."""
        limit, reason = self.sampling.max_tokens, ""
        remaining = env.remaining_tokens
        if remaining is not None and remaining < limit:
            limit, reason = remaining, "max_tokens"
        tokenizer = self.engine.tokenizer
        if tokenizer is not None and tokenizer.max_length and record.trace is not None:
            room = tokenizer.max_length - len(record.trace.ids)
            if room < limit:
                limit, reason = room, "max_context"
        return limit, reason


async def _open(
    record: EpisodeRecord,
    prompt: list[Message],
    tools: list[dict[str, Any]] | None,
    tokenizer: ToolsInPrompt | None,
) -> Exception | None:
    """Start ``record`` on its first turn's ``prompt``, its token trace rendered from it; the
    tokenizer's failure, if it failed."""
    record.messages, record.prompt_length, record.tools = list(prompt), len(prompt), tools
    if tokenizer is None:
        return None
    try:
        prompt_ids = await tokenizer.render(record.messages, tools, add_generation_prompt=True)
    except Exception as e:
        return e
    record.trace = TokenTrace()
    record.trace.start(prompt_ids)
    return None


def _same(a: list[Message], b: list[Message]) -> bool:
    """Whether two lists of messages say the same (a turn sampled ahead was shown ``a``)."""
    return [m.model_dump() for m in a] == [m.model_dump() for m in b]


def _action(generation: Generation, actor: str | None) -> AssistantTurn:
    """The sampled turn as the env's action, its message labelled with the actor (if named)."""
    message = assistant(generation.text, generation.tool_calls)
    if actor is not None:
        message = message.model_copy(update={"actor": actor})
    return AssistantTurn(
        message=message,
        num_tokens=len(generation.token_ids) if generation.token_ids is not None else None,
        finish_reason=generation.finish_reason,
    )


def _show(record: EpisodeRecord | None, observation: list[Message], info: dict[str, Any]) -> None:
    """Add what the next actor is shown to its messages (its tokens follow on its turn); an
    actor without a record yet is shown it as its first prompt."""
    if record is None:
        return
    if info.get(NEW_SEGMENT):
        record.segment_start = len(record.messages)
    record.messages.extend(observation)


def _pay(
    ep: EpisodeRecord, seats: Seating, acting: str | None, paid: Mapping[str | None, float]
) -> None:
    """Add each actor's pay at this step to its total, and to its latest turn (per-turn
    credit) but for the acting actor's, which was recorded with it."""
    for actor, amount in paid.items():
        record = seats.record(ep, actor)
        if record is None or not record.turns:
            continue
        record.reward += float(amount)
        if actor != acting:
            last = record.turns[-1]
            record.turns[-1] = last.model_copy(update={"reward": last.reward + float(amount)})


def _turn_record(
    record: EpisodeRecord,
    turn: _Turn,
    action: AssistantTurn,
    tools_before: tuple[int, int],
    env_seconds: float,
    reward: float,
) -> TurnRecord:
    """What a turn leaves on its actor's record."""
    assert turn.generation is not None
    generation, request = turn.generation, turn.request
    calls, errors = (
        after - before for after, before in zip(record.tool_counts(), tools_before, strict=True)
    )
    prompt = request.prompt_ids if request.prompt_ids is not None else generation.prompt_token_ids
    return TurnRecord(
        prompt_tokens=len(prompt) if prompt is not None else None,
        completion_tokens=action.num_tokens,
        finish_reason=generation.finish_reason,
        tool_calls=calls,
        tool_errors=errors,
        generate_seconds=turn.seconds,
        env_seconds=env_seconds,
        policy_version=generation.weight_version,
        structured_tool_calls=bool(generation.tool_calls),
        reward=float(reward),
    )
