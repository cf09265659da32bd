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
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from envhub.roles import ROLE, ROLE_COMPONENTS, ROLE_RESULTS, ROLE_REWARDS
from envhub.rollout.tokens import TokenTrace, append_env_turn
from envhub.types import AssistantTurn, ErrorRecord, Message, as_message, assistant

if TYPE_CHECKING:
    from envhub.env import Env
    from envhub.rollout.runner import RolloutRunner, _Episode


async def drive_roles(
    runner: RolloutRunner,
    env: Env,
    ep: _Episode,
    observation: list[Message],
    actor: str,
) -> None:
    """Play one multi-role episode from its reset; fill ``ep.seats`` with each trained
    actor's record (see the module doc)."""
    tokenizer = runner._chat_tokenizer()
    while True:
        seat = ep.seats.get(actor)
        if seat is None:
            seat = await _open_seat(ep, actor, observation, env.tool_schemas, tokenizer)
        elif not await _deliver(seat, tokenizer, observation):
            seat.stop_reason = "error"
        if seat.stop_reason == "error":  # the engine's tokenizer failed on the seat's prompt
            return _crash(ep, actor, "engine", seat.pending_error, len(seat.turns))
        turn = len(seat.turns)
        max_tokens, reason = runner._turn_budget(env, seat)
        if max_tokens <= 0:
            return await _truncate(env, ep, reason)
        request = runner._request(seat, max_tokens)
        started = time.perf_counter()
        try:
            generation = await runner.engine.generate(request)
        except Exception as e:
            return _crash(ep, actor, "engine", e, turn)
        generated = time.perf_counter()
        runner._record_tokens(seat, generation, turn)
        action = AssistantTurn(
            message=assistant(generation.text, generation.tool_calls).model_copy(
                update={"actor": actor}
            ),
            num_tokens=len(generation.token_ids) if generation.token_ids is not None else None,
            finish_reason=generation.finish_reason,
        )
        seat.messages.append(action.message)
        seat.last_finish = generation.finish_reason
        try:
            observation, _, terminated, truncated, info = await runner._timed(env.astep(action))
        except Exception as e:
            return _crash(ep, actor, "env.step", e, turn)
        seconds = (generated - started, time.perf_counter() - generated)
        seat.turns.append(
            runner._turn_record(seat, request, generation, action, (0, 0), *seconds, 0.0)
        )
        _pay(ep, info.get(ROLE_REWARDS, {}))
        if terminated or truncated:
            return _finish(ep, bool(terminated), bool(truncated), info)
        observation, actor = [as_message(m) for m in observation], info[ROLE]


async def _open_seat(
    ep: _Episode,
    actor: str,
    prompt: list[Message],
    tools: list[dict[str, Any]] | None,
    tokenizer: Any,
) -> _Episode:
    """A record for ``actor``'s first turn, its token trace started from its ``prompt``
    (``stop_reason`` ``error``, with ``pending_error``, when the tokenizer failed)."""
    from envhub.rollout.runner import _Episode

    seat = _Episode(ep.task_index, ep.sample_index, ep.group_id, ep.seed)
    seat.messages, seat.prompt_length, seat.tools = list(prompt), len(prompt), tools
    seat.stop_reason = "terminated"
    ep.seats[actor] = seat
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
