"""The rollout of an episode with several roles (:mod:`envhub.roles`).

Each actor the policy plays gets its own record (a ``_Episode`` of the runner's, kept in the
episode's ``seats``): its conversation, its token trace and its turns, built exactly as a
one-role episode's are: its prompt rendered with the chat template, its own sampled tokens with
mask 1, and whatever it sees between its turns (the other actors' moves as the env tells them)
appended with mask 0 when it next moves. So each actor's trajectory trains that actor's tokens
only, with that actor's reward.

A failure during an actor's turn (the engine failing to sample it, the env raising on it) is
recorded on that actor's trajectory as the runner records it on any episode, and on every other
actor's as ``role_crashed`` at stage ``role:<actor>``: their episodes were cut short by it, so
none of them is trained on (the outcome is a failure, not a reward of 0).

Actors that move one after another without seeing each other's moves (the env lists them in
``info["upcoming"]``: the solvers of one problem) are sampled together: their turns go to the
engine at once, in the order the env named them (an engine that batches runs them as one
batch), and are then played into the env one by one in that order, exactly as if each had been
sampled on its turn. Only actors that have not moved yet are sampled ahead (their records are
fresh), and only without an env token budget (which would change between their steps); a turn
sampled ahead whose actor is then shown something else is sampled again, and one never reached
(the episode ended first) is dropped. So the records are those of playing them in turn.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envhub.roles import ROLE, ROLE_COMPONENTS, ROLE_RESULTS, ROLE_REWARDS, UPCOMING
from envhub.rollout.tokens import TokenTrace, append_env_turn
from envhub.types import AssistantTurn, ErrorRecord, Message, as_message, assistant

if TYPE_CHECKING:
    from envhub.env import Env
    from envhub.inference.base import GenerateRequest, Generation
    from envhub.rollout.runner import RolloutRunner, _Episode


@dataclass
class _Turn:
    """One actor's turn, ready to sample and then sampled: its record, what it was shown,
    the request, and the generation or the engine's failure."""

    actor: str
    seat: _Episode
    shown: list[Message]
    request: GenerateRequest
    generation: Generation | None = None
    error: Exception | None = None
    seconds: float = 0.0


async def drive_roles(
    runner: RolloutRunner,
    env: Env,
    ep: _Episode,
    observation: list[Message],
    info: dict[str, Any],
) -> None:
    """Play one multi-role episode from its reset (``observation`` and ``info`` are what the
    reset returned); fill ``ep.seats`` with each trained actor's record (see the module doc)."""
    tokenizer = runner._chat_tokenizer()
    actor: str = info[ROLE]
    ahead: dict[str, _Turn] = {}
    while True:
        turn = ahead.pop(actor, None)
        if turn is not None and _same(turn.shown, observation):
            ep.seats[actor] = turn.seat
        else:
            turn = await _ready(runner, env, ep, actor, observation, tokenizer)
            if turn is None:  # the episode ended instead (recorded)
                return None
            later = await _turns_ahead(runner, env, ep, info, ahead, tokenizer)
            if later:
                await asyncio.gather(*(_sample(runner, t) for t in [turn, *later]))
            else:  # awaited in place, as it always was: the loop's schedule is unchanged
                await _sample(runner, turn)
            ahead |= {t.actor: t for t in later}
        index, seat = len(turn.seat.turns), turn.seat
        generation = turn.generation
        if generation is None:
            return _crash(ep, actor, "engine", turn.error, index)
        runner._record_tokens(seat, generation, index)
        action = AssistantTurn(
            message=assistant(generation.text, generation.tool_calls).model_copy(
                update={"actor": actor}
            ),
            num_tokens=len(generation.token_ids) if generation.token_ids is not None else None,
            finish_reason=generation.finish_reason,
        )
        seat.messages.append(action.message)
        seat.last_finish = generation.finish_reason
        stepped = time.perf_counter()
        try:
            observation, _, terminated, truncated, info = await runner._timed(env.astep(action))
        except Exception as e:
            return _crash(ep, actor, "env.step", e, index)
        seconds = (turn.seconds, time.perf_counter() - stepped)
        seat.turns.append(
            runner._turn_record(seat, turn.request, generation, action, (0, 0), *seconds, 0.0)
        )
        _pay(ep, info.get(ROLE_REWARDS, {}))
        if terminated or truncated:
            return _finish(ep, bool(terminated), bool(truncated), info)
        observation, actor = [as_message(m) for m in observation], info[ROLE]


async def _ready(
    runner: RolloutRunner,
    env: Env,
    ep: _Episode,
    actor: str,
    observation: list[Message],
    tokenizer: Any,
) -> _Turn | None:
    """``actor``'s turn, ready to sample: ``observation`` delivered to its record (opened on
    its first turn); ``None`` when the episode ended instead, recorded: the engine's tokenizer
    failed on its view (a crash), or no tokens are left (truncated)."""
    seat = ep.seats.get(actor)
    if seat is None:
        seat = ep.seats[actor] = await _open_seat(ep, observation, env.tool_schemas, tokenizer)
    elif not await _deliver(seat, tokenizer, observation):
        seat.stop_reason = "error"
    if seat.stop_reason == "error":  # the engine's tokenizer failed on the seat's prompt
        _crash(ep, actor, "engine", seat.pending_error, len(seat.turns))
        return None
    max_tokens, reason = runner._turn_budget(env, seat)
    if max_tokens <= 0:
        await _truncate(env, ep, reason)
        return None
    return _Turn(actor, seat, observation, runner._request(seat, max_tokens))


async def _turns_ahead(
    runner: RolloutRunner,
    env: Env,
    ep: _Episode,
    info: dict[str, Any],
    ahead: dict[str, _Turn],
    tokenizer: Any,
) -> list[_Turn]:
    """The turns of the actors ``info["upcoming"]`` names, ready to sample now, in order: up
    to the first that has a record already, is sampled ahead already, or could not be made
    ready (its tokenizer failed, no tokens left: that is recorded when its turn comes). None
    under an env token budget, which changes with every step."""
    upcoming = info.get(UPCOMING) or {}
    if not upcoming or env.remaining_tokens is not None:
        return []
    turns: list[_Turn] = []
    for actor, shown in upcoming.items():
        if actor in ep.seats or actor in ahead:
            break
        shown = [as_message(m) for m in shown]
        seat = await _open_seat(ep, shown, env.tool_schemas, tokenizer)
        max_tokens, _ = runner._turn_budget(env, seat)
        if seat.stop_reason == "error" or max_tokens <= 0:
            break
        turns.append(_Turn(actor, seat, shown, runner._request(seat, max_tokens)))
    return turns


async def _sample(runner: RolloutRunner, turn: _Turn) -> None:
    """Ask the engine for ``turn``: its generation, or the failure, and how long it took."""
    started = time.perf_counter()
    try:
        turn.generation = await runner.engine.generate(turn.request)
    except Exception as e:
        turn.error = e
    turn.seconds = time.perf_counter() - started


def _same(a: list[Message], b: list[Message]) -> bool:
    """Whether two lists of messages say the same (a turn sampled ahead was shown ``a``)."""
    return [m.model_dump() for m in a] == [m.model_dump() for m in b]


async def _open_seat(
    ep: _Episode,
    prompt: list[Message],
    tools: list[dict[str, Any]] | None,
    tokenizer: Any,
) -> _Episode:
    """A record for an actor's first turn (the caller files it in ``ep.seats``), its token
    trace started from its ``prompt`` (``stop_reason`` ``error``, with ``pending_error``, when
    the tokenizer failed)."""
    from envhub.rollout.runner import _Episode

    seat = _Episode(ep.task_index, ep.sample_index, ep.group_id, ep.seed)
    seat.messages, seat.prompt_length, seat.tools = list(prompt), len(prompt), tools
    seat.stop_reason = "terminated"
    if tokenizer is not None:
        try:
            ids = await tokenizer.render(seat.messages, tools, add_generation_prompt=True)
        except Exception as e:
            seat.pending_error, seat.stop_reason = e, "error"
            return seat
        seat.trace = TokenTrace()
        seat.trace.start(ids)
    return seat


async def _deliver(seat: _Episode, tokenizer: Any, observation: list[Message]) -> bool:
    """Append what ``seat`` sees since its last turn to its messages and token trace; False
    when the tokenizer failed (``seat.pending_error`` holds why)."""
    seat.messages.extend(observation)
    trace = seat.trace
    if tokenizer is None or trace is None or not trace.valid:
        return True
    try:
        await append_env_turn(
            trace,
            tokenizer,
            seat.messages,
            observation,
            seat.tools,
            len(seat.turns),
            seat.last_finish == "stop",
        )
    except Exception as e:
        seat.pending_error = e
        return False
    return True


def _pay(ep: _Episode, rewards: dict[str, float]) -> None:
    """Add each actor's pay at this step to its total and to its latest turn (per-turn
    credit); pay to an actor the policy does not play, or that has not moved yet, has no
    tokens to go to."""
    for actor, amount in rewards.items():
        seat = ep.seats.get(actor)
        if seat is None or not seat.turns:
            continue
        seat.reward += float(amount)
        last = seat.turns[-1]
        seat.turns[-1] = last.model_copy(update={"reward": last.reward + float(amount)})


def _finish(ep: _Episode, terminated: bool, truncated: bool, info: dict[str, Any]) -> None:
    """Close every actor's record with the episode's end as the env reported it."""
    results = info.get(ROLE_RESULTS, {})
    components = info.get(ROLE_COMPONENTS, {})
    errors = [e if isinstance(e, ErrorRecord) else ErrorRecord(**e) for e in info.get("errors", [])]
    for actor, seat in ep.seats.items():
        seat.terminated, seat.truncated = terminated, truncated
        seat.stop_reason = info.get("stop_reason") or ("terminated" if terminated else "truncated")
        seat.components = dict(components.get(actor, {}))
        seat.env_metrics = dict(info.get("metrics", {}))
        seat.errors.extend(errors)
        seat.result = results.get(actor) or ("aborted" if errors else None)
    ep.stop_reason = "terminated"


async def _truncate(env: Env, ep: _Episode, reason: str) -> None:
    """The acting actor has no tokens or context left: end the whole match as truncated."""
    for seat in ep.seats.values():
        if seat.trace is not None:
            seat.trace.trim_to_last_sampled()
    atruncate = getattr(env, "atruncate", None)
    info = (await atruncate(reason))[1] if atruncate is not None else {"stop_reason": reason}
    _finish(ep, False, True, info)


def _crash(ep: _Episode, actor: str, stage: str, error: BaseException, turn: int) -> None:
    """Record ``actor``'s failure on its own record, and on every other actor's as the reason
    its episode was cut short."""
    ep.seats[actor].fail(stage, error, turn)
    own = ep.seats[actor].errors[-1]
    ep.seats[actor].result = "crashed"
    for other, seat in ep.seats.items():
        if other == actor:
            continue
        seat.errors.append(
            ErrorRecord(
                stage=f"role:{actor}",
                type="role_crashed",
                message=f"the episode ended when {actor} failed: {own.type}: {own.message}",
                turn=turn,
                infra=own.infra,
            )
        )
        seat.stop_reason, seat.result = "error", "aborted"
    ep.stop_reason = "error"
