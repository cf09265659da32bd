"""The adapted env: a verifiers rollout driven turn by turn by envhub's runner."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Coroutine
from typing import Any, TypeVar

from envhub.adapters.verifiers._load import MODEL, _vf
from envhub.adapters.verifiers.bridge import (
    _bridge_client,
    _new_messages,
    _response,
    _to_message,
    _tool_schema,
)
from envhub.adapters.verifiers.rubric import VerifiersRubric
from envhub.env import Action, StepResult, TaskEnv
from envhub.errors import EnvhubError, EnvLoadError
from envhub.state import State
from envhub.tools.executor import count_calls_run_elsewhere
from envhub.tools.parsers import ParsedTurn, check_openai_calls, get_parser
from envhub.types import AssistantTurn, ErrorRecord, Message, is_infrastructure_error

T = TypeVar("T")
TRUNCATING_STOPS = frozenset(
    {
        "max_turns_reached",
        "max_total_completion_tokens_reached",
        "prompt_too_long",
        "timeout_reached",
    }
)
"""verifiers' stop conditions that mean a budget ran out (envhub ``truncated``)."""


class VerifiersEnv(TaskEnv):
    """A verifiers environment instance (``vf.SingleTurnEnv(...)``, ``vf.ToolEnv(...)``, ...)
    driven by envhub (see :mod:`envhub.adapters.verifiers`); ``from_verifiers`` is this class,
    ``envhub.make("verifiers:NAME")`` loads one by name.

    Args:
        vf_env: The verifiers environment.
        name: The env's name on trajectories (default ``verifiers:<env_id or class name>``).
        version: The env's version on trajectories.
        split: ``"train"`` (the env's dataset, else its eval dataset) or ``"eval"`` (the
            reverse, as verifiers' ``evaluate`` reads).
        max_turns: envhub's turn budget; default: the env's own ``max_turns`` when it has one,
            else 10 (verifiers' ``-1``, unlimited, is no budget a training run can have).
        reward_range: Bounds of an episode's reward; default: 0 to the sum of the positive
            weights plus the negative ones below 0 (each function scoring in [0, 1]).
    """

    def __init__(
        self,
        vf_env: Any,
        *,
        name: str | None = None,
        version: str = "0.0.0",
        split: str = "train",
        max_turns: int | None = None,
        reward_range: tuple[float, float] | None = None,
    ) -> None:
        vf = _vf()
        if not isinstance(vf_env, vf.Environment):
            raise EnvLoadError(f"{type(vf_env).__name__} is not a verifiers Environment")
        self.vf_env = vf_env
        self.name = name or f"verifiers:{vf_env.env_id or type(vf_env).__name__}"
        self.version = version
        own_turns = getattr(vf_env, "max_turns", -1)
        super().__init__(
            _dataset(vf_env, split),
            rubric=VerifiersRubric(vf_env.rubric),
            max_turns=max_turns or (own_turns if own_turns > 0 else 10),
        )
        self.reward_range = reward_range or _default_range(vf_env.rubric)
        self.pass_threshold = float(getattr(vf_env, "pass_threshold", 1.0))
        self._parse = get_parser("auto")
        self._single_turn = isinstance(vf_env, vf.SingleTurnEnv)
        """A single-turn env's one turn is its whole task: ``max_turns_reached`` terminates it."""
        self._episode: _Episode | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """The episode's tools (a task's ``info["tool_defs"]`` or the env's) as OpenAI schemas."""
        if self._episode is not None and self._episode.tool_defs is not None:
            defs = self._episode.tool_defs
        else:
            defs = self.vf_env.tool_defs or []
        return [_tool_schema(t) for t in defs] or None

    def format_prompt(self, task: dict[str, Any]) -> list[Message]:
        """The row's ``prompt`` as verifiers formatted it (system prompt and few-shot in)."""
        _vf()
        from verifiers.utils.message_utils import normalize_messages

        return [_to_message(m) for m in normalize_messages(task["prompt"], field_name="prompt")]

    # -- the episode: verifiers' rollout, one model turn at a time ------------------------------

    async def setup_state(self, state: State) -> None:
        """Start verifiers' rollout of the task; the prompt is what it first asks the model."""
        await self._stop_episode()
        self._episode = _Episode(self.vf_env, dict(state.task))
        prompt = await self._episode.next_request()
        if prompt is not None:
            state.prompt = [_to_message(m) for m in prompt]
            state.messages = list(state.prompt)

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        """Give verifiers the turn; reply with what it adds before asking again (tool results,
        a user message), or end the episode when its rollout ends."""
        episode = self._active_episode()
        parsed = self._parse_turn(state, turn)
        if parsed.calls:
            state.messages[-1] = turn.message.model_copy(update={"tool_calls": tuple(parsed.calls)})
        # verifiers runs the calls; a malformed one or one naming no offered tool is invalid
        offered = {t["function"]["name"] for t in self.tool_schemas or ()}
        count_calls_run_elsewhere(state.metrics, parsed, offered)
        if episode.waiting is not None:
            episode.answer(_response(turn, parsed.calls))
        prompt = await episode.next_request()
        if prompt is None:
            self._end(state, episode)
            return _new_messages(state, episode.final["completion"] or [], len(state.prompt))
        reply = _new_messages(state, prompt, strict=True)
        if self._out_of_budget(state):  # envhub's budget ends it first: verifiers must stop too
            await self._cut(
                state, episode, "max_turns" if state.turn >= self.max_turns else "max_tokens"
            )
        return reply

    async def atruncate(self, reason: str) -> tuple[float, dict[str, Any]]:
        """End verifiers' rollout as out of context (``prompt_too_long``), then score it."""
        await self._cut(self._active_state(), self._active_episode(), reason)
        return await super().atruncate(reason)

    def _out_of_budget(self, state: State) -> bool:
        return state.turn >= self.max_turns or (
            self.max_tokens is not None and state.tokens >= self.max_tokens
        )

    async def _cut(self, state: State, episode: _Episode, reason: str) -> None:
        """End a rollout that waits for a turn envhub will not sample: verifiers sees the
        context run out (``prompt_too_long``) and finishes as it would."""
        if episode.waiting is not None:
            episode.fail(_vf().OverlongPromptError(f"envhub ended the episode: {reason}"))
            await episode.next_request()
        state.data["vf_state"] = episode.final

    def _parse_turn(self, state: State, turn: AssistantTurn) -> ParsedTurn:
        message = turn.message
        if message.tool_calls:
            return check_openai_calls(message.content, message.tool_calls)
        return self._parse(message.content or "", f"call_{state.turn}_")

    def _end(self, state: State, episode: _Episode) -> None:
        from verifiers.errors import InfraError

        final = episode.final
        state.data["vf_state"] = final
        stop = final.get("stop_condition") or "completed"
        if final.get("error") is not None:
            error = final["error"]
            cause = error.__cause__ or error
            state.errors.append(
                ErrorRecord(
                    stage="env.step",
                    type=type(cause).__name__,
                    message=f"{type(error).__name__}: {cause}",
                    turn=state.turn - 1,
                    infra=is_infrastructure_error(cause) or isinstance(error, InfraError),
                )
            )
        if stop in TRUNCATING_STOPS and not self._single_turn:
            state.truncate(stop.removesuffix("_reached"))
        else:
            state.done = True

    def _active_episode(self) -> _Episode:
        if self._episode is None:
            raise EnvhubError(f"{self.name}: call reset() before step()")
        return self._episode

    async def _stop_episode(self) -> None:
        if self._episode is not None:
            await self._episode.cancel()
            self._episode = None

    # -- sync API: one private loop, since an episode's rollout task outlives each call ---------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Sync form of :meth:`areset`, on this env's own event loop."""
        return self._sync(self.areset(seed=seed, options=options))

    def step(self, action: Action) -> StepResult:
        """Sync form of :meth:`astep`, on this env's own event loop."""
        return self._sync(self.astep(action))

    def _sync(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._loop.run_until_complete(coro)
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(self._loop.run_until_complete, coro).result()

    def on_close(self) -> None:
        """Cancel an unfinished rollout and close the private loop; the verifiers environment
        itself stays open (others may share it; verifiers tears it down at exit)."""
        episode, self._episode = self._episode, None
        if episode is not None and episode.task is not None and not episode.task.done():
            loop = episode.task.get_loop()
            if loop.is_running():
                loop.call_soon_threadsafe(episode.task.cancel)
            elif not loop.is_closed():
                episode.task.cancel()
                loop.run_until_complete(asyncio.gather(episode.task, return_exceptions=True))
        if self._loop is not None and not self._loop.is_closed():
            self._loop.close()


def _dataset(vf_env: Any, split: str) -> Any:
    if split not in ("train", "eval"):
        raise EnvLoadError(f"split must be 'train' or 'eval', got {split!r}")
    has_train = vf_env.dataset is not None or vf_env.dataset_source is not None
    if split == "train" and has_train:
        return vf_env.get_dataset()
    return vf_env.get_eval_dataset()


def _default_range(rubric: Any) -> tuple[float, float]:
    weights = _flat_weights(rubric)
    return (sum(w for w in weights if w < 0), sum(w for w in weights if w > 0))


def _flat_weights(rubric: Any) -> list[float]:
    if hasattr(rubric, "rubrics"):
        return [w for r in rubric.rubrics for w in _flat_weights(r)]
    return [float(w) for w in rubric.weights]


class _Episode:
    """verifiers' ``rollout`` of one task, as a task on the running loop, and the model request
    it is waiting on (a future the next assistant turn fulfils)."""

    def __init__(self, vf_env: Any, row: dict[str, Any]) -> None:
        self.vf_env = vf_env
        self.row = row
        self.task: asyncio.Task[Any] | None = None
        self.requests: asyncio.Queue[tuple[list[Any], asyncio.Future[Any]]] | None = None
        self.waiting: asyncio.Future[Any] | None = None
        self.final: Any = None
        info = row.get("info")
        if isinstance(info, str):
            info = json.loads(info)
        defs = info.get("tool_defs") if isinstance(info, dict) else None
        self.tool_defs = vf_env._normalize_tool_defs(defs) if defs is not None else None

    async def next_request(self) -> list[Any] | None:
        """The prompt of verifiers' next model request, or ``None`` once its rollout ended
        (then ``final`` is its state). An exception in the rollout propagates."""
        if self.task is None:
            self.requests = asyncio.Queue()
            client = _bridge_client(self.requests)
            self.task = asyncio.ensure_future(self.vf_env.rollout(self.row, client, MODEL, {}))
        self.waiting = None
        getter = asyncio.ensure_future(self.requests.get())
        await asyncio.wait({getter, self.task}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            prompt, self.waiting = getter.result()
            return prompt
        getter.cancel()
        self.final = self.task.result()
        return None

    def answer(self, response: Any) -> None:
        """Fulfil the pending model request with ``response``."""
        assert self.waiting is not None
        self.waiting.set_result(response)

    def fail(self, error: BaseException) -> None:
        """Fail the pending model request with ``error`` (verifiers handles its own errors)."""
        assert self.waiting is not None
        self.waiting.set_exception(error)

    async def cancel(self) -> None:
        """Stop an unfinished rollout (the episode was abandoned)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
