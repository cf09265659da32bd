"""`verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ environments as envhub envs.

``envhub.make("verifiers:NAME")`` loads an installed verifiers environment with verifiers' own
``load_environment(NAME, **kwargs)``; :func:`from_verifiers` adapts one already built. The
adapter targets verifiers' classic environment API (``vf.SingleTurnEnv``, ``vf.MultiTurnEnv``,
``vf.ToolEnv``, ``vf.StatefulToolEnv``, ``vf.Rubric``), which verifiers 0.3 keeps under
``verifiers.legacy`` and still answers at ``import verifiers as vf``; verifiers 0.4 dropped it
for its ``verifiers.v1`` stack, which this adapter does not cover.

How verifiers' concepts map to envhub's:

- dataset rows (``prompt``/``question``, ``answer``, ``info``, ``example_id``) are the tasks of a
  :class:`~envhub.env.TaskEnv`, formatted by verifiers itself (system prompt, few-shot);
- an episode *is* verifiers' own ``env.rollout(...)``, run as a task on the caller's event
  loop with a client that hands each model request to envhub and waits for the turn that
  envhub's runner sampled: ``setup_state``, ``env_response``, stop conditions
  (``is_completed``), ``final_env_response``, tool calls (executed by the verifiers env's own
  functions, ``update_tool_args`` included) all run as verifiers runs them. The adapter only
  passes messages: envhub's runner renders and records the tokens, so the token contract holds;
- the ``tool_defs`` of the env (or of a task's ``info``) become OpenAI tool schemas; a turn's
  calls are the engine's structured ones or, from raw text, those envhub's parsers read;
- the rubric is verifiers' own ``score_rollout`` (``score_group`` for group rewards): the
  episode's reward is its weighted total and every function's value (metrics included) is a
  reward component. A reward function that raises scores 0, as in verifiers, and is also
  recorded on the trajectory as an error (verifiers itself only logs it);
- verifiers' stop conditions map to ``terminated``, except ``max_turns_reached`` (but for a
  ``SingleTurnEnv``, whose one turn is the task), ``max_total_completion_tokens_reached``,
  ``prompt_too_long`` and ``timeout_reached``, which truncate; a rollout error
  (``state["error"]``) is recorded with stage ``env.step``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import functools
import inspect
import json
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from contextvars import ContextVar
from importlib import metadata, util
from typing import Any, TypeVar

from envhub.env import Action, State, StepResult, TaskEnv
from envhub.errors import EnvhubError, EnvLoadError, EnvNotFoundError, MissingDependencyError
from envhub.rewards.rubric import Rubric, Score
from envhub.tools.parsers import ParsedTurn, check_openai_calls, get_parser
from envhub.types import AssistantTurn, ErrorRecord, Message, ToolCall, is_infrastructure_error

__all__ = ["VerifiersEnv", "from_verifiers", "list_envs", "make_env"]

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
MODEL = "envhub"
"""The model name verifiers records on its state; envhub's runner knows the real sampler."""

_reward_errors: ContextVar[list[ErrorRecord] | None] = ContextVar("_reward_errors", default=None)
_loaded: dict[str, Any] = {}


def _vf() -> Any:
    """``import verifiers as vf`` (the classic API), or say what to install."""
    try:
        import verifiers as vf

        vf.Environment  # noqa: B018 -- the classic API loads on first touch: fail here if absent
    except ImportError as e:
        raise MissingDependencyError.for_extra("verifiers", "verifiers") from e
    except AttributeError as e:
        raise MissingDependencyError(
            f"the installed verifiers ({getattr(vf, '__version__', '?')}) lacks its classic "
            f"environment API ({e}); run `pip install 'envhub[verifiers]'`"
        ) from e
    _allow_off_main_thread(vf)
    return vf


def _allow_off_main_thread(vf: Any) -> None:
    """verifiers' ``Environment.__init__`` installs SIGINT/SIGTERM handlers, which Python allows
    only on the main thread, and envhub makes envs in worker threads (the runner's pool). This
    gives verifiers' environment module a ``signal`` that installs handlers on the main thread
    and skips them elsewhere (its ``atexit`` teardown still runs). Scoped to that one module,
    idempotent; ``test_verifiers_still_installs_signal_handlers`` notices an upstream change."""
    module = inspect.getmodule(vf.Environment)
    if getattr(module, "signal", None) is signal:
        module.signal = _MainThreadSignals()


class _MainThreadSignals:
    """The ``signal`` module, except that ``signal()`` off the main thread does nothing."""

    def __getattr__(self, name: str) -> Any:
        return getattr(signal, name)

    def signal(self, signalnum: int, handler: Any) -> Any:
        """``signal.signal`` on the main thread; elsewhere the current handler, unchanged."""
        if threading.current_thread() is threading.main_thread():
            return signal.signal(signalnum, handler)
        return signal.getsignal(signalnum)


# -- discovery and loading ------------------------------------------------------------------------


def list_envs() -> dict[str, str]:
    """Installed verifiers environments: distributions that require ``verifiers`` and whose
    module (the name with ``-`` as ``_``) defines ``load_environment``; ``{}`` without
    verifiers. Nothing is imported: the module's source is read."""
    if util.find_spec("verifiers") is None:
        return {}
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name == "verifiers" or not any(
            r.split(";")[0].strip().lower().startswith("verifiers") for r in dist.requires or ()
        ):
            continue
        if _defines_load_environment(name.replace("-", "_")):
            found[name] = dist.metadata["Summary"] or f"verifiers environment {name}"
    return found


def _defines_load_environment(module: str) -> bool:
    try:
        spec = util.find_spec(module)
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    try:
        with open(spec.origin, encoding="utf-8") as f:
            return "def load_environment" in f.read()
    except OSError:
        return False


def make_env(name: str, **kwargs: Any) -> VerifiersEnv:
    """The verifiers environment ``name`` (``load_environment(name, **kwargs)``), adapted.

    One verifiers environment serves every adapted env made with the same name and arguments
    in this process (verifiers runs many rollouts on one environment), so a runner's pool of
    envs loads the dataset once.

    Raises:
        EnvNotFoundError: No installed verifiers environment is called ``name``.
        EnvLoadError: Its ``load_environment`` failed.
        MissingDependencyError: verifiers is not installed.
    """
    vf = _vf()
    key = f"{name}\0{json.dumps(kwargs, sort_keys=True, default=repr)}"
    if key not in _loaded:
        module = name.replace("-", "_").split("/")[-1]
        if util.find_spec(module) is None:
            known = ", ".join(sorted(list_envs())) or "none"
            raise EnvNotFoundError(
                f"no verifiers environment {name!r} is installed (no module {module!r}); "
                f"install its package first. Installed: {known}"
            )
        try:
            _loaded[key] = vf.load_environment(name, **kwargs)
        except Exception as e:
            cause = e.__cause__ or e
            raise EnvLoadError(
                f"verifiers environment {name!r} failed to load: {type(cause).__name__}: {cause}"
            ) from e
    return from_verifiers(_loaded[key], name=f"verifiers:{name}", version=_version(name))


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "0.0.0"


def from_verifiers(
    vf_env: Any,
    *,
    name: str | None = None,
    version: str = "0.0.0",
    split: str = "train",
    max_turns: int | None = None,
    reward_range: tuple[float, float] | None = None,
) -> VerifiersEnv:
    """Adapt a verifiers environment instance (``vf.SingleTurnEnv(...)``, ``vf.ToolEnv(...)``,
    ...) as an envhub env.

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
    return VerifiersEnv(
        vf_env,
        name=name,
        version=version,
        split=split,
        max_turns=max_turns,
        reward_range=reward_range,
    )


# -- the env ----------------------------------------------------------------------------------


class VerifiersEnv(TaskEnv):
    """A verifiers environment driven by envhub (see the module docstring); make one with
    :func:`from_verifiers` or ``envhub.make("verifiers:NAME")``."""

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
            state.metrics["tool_calls"] += len(parsed.calls)
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


@functools.cache
def _bridge_class() -> type:
    from verifiers.clients.client import Client

    class EnvhubTurnClient(Client):
        """A verifiers client whose responses are the turns envhub's runner sampled: each
        request is queued with a future, and the rollout waits on that future."""

        def __init__(self, requests: asyncio.Queue) -> None:
            super().__init__(None)
            self.requests = requests

        def setup_client(self, config: Any) -> Any:
            return None

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
            return messages, {}

        async def get_native_response(self, prompt: Any, model: str, sampling_args: Any,
                                      tools: Any = None, **kwargs: Any) -> Any:  # fmt: skip
            reply = asyncio.get_running_loop().create_future()
            await self.requests.put((prompt, reply))
            return await reply

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: Any) -> Any:
            return response

        async def close(self) -> None:
            return None

    return EnvhubTurnClient


def _bridge_client(requests: asyncio.Queue) -> Any:
    return _bridge_class()(requests)


# -- messages, tools and turns --------------------------------------------------------------------


def _text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
        if kind != "text":
            raise EnvhubError(f"verifiers message part of type {kind!r}: envhub carries text only")
        parts.append(part["text"] if isinstance(part, dict) else part.text)
    return "".join(parts)


def _to_message(message: Any) -> Message:
    """An envhub message from a verifiers one (a pydantic message or an OpenAI dict)."""
    get = message.get if isinstance(message, dict) else functools.partial(getattr, message)
    calls = get("tool_calls", None)
    return Message(
        role=get("role", None),
        content=_text(get("content", None)),
        tool_calls=tuple(_to_call(c) for c in calls) if calls else None,
        tool_call_id=get("tool_call_id", None),
    )


def _to_call(call: Any) -> ToolCall:
    if isinstance(call, dict):
        function = call.get("function") or call
        return ToolCall.make(call["id"], function["name"], function["arguments"])
    return ToolCall.make(call.id, call.name, call.arguments)


def _tool_schema(tool: Any) -> dict[str, Any]:
    """An OpenAI function schema from a ``vf.Tool`` (name, description, parameters)."""
    function = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _response(turn: AssistantTurn, calls: Sequence[ToolCall]) -> Any:
    """The ``vf.Response`` verifiers would have got from a server for this turn."""
    from verifiers.types import Response, ResponseMessage, Usage
    from verifiers.types import ToolCall as VfToolCall

    length = turn.finish_reason == "length"
    message = ResponseMessage(
        content=turn.message.content or "",
        tool_calls=[
            VfToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments) for c in calls
        ]
        or None,
        finish_reason="length" if length else ("tool_calls" if calls else "stop"),
        is_truncated=length,
    )
    usage = None
    if turn.num_tokens is not None:
        usage = Usage(
            prompt_tokens=0,
            reasoning_tokens=0,
            completion_tokens=turn.num_tokens,
            total_tokens=turn.num_tokens,
        )
    return Response(id="envhub", created=int(time.time()), model=MODEL, usage=usage,
                    message=message)  # fmt: skip


def _new_messages(
    state: State, vf_messages: Sequence[Any], offset: int = 0, strict: bool = False
) -> list[Message]:
    """What verifiers' conversation has beyond envhub's (``offset``: where ``vf_messages``
    starts in it); verifiers may only append, as envhub's token record does (``strict``: a
    shorter history is an error, not an episode that ended before its first request)."""
    known = len(state.messages) - offset
    if len(vf_messages) < known and strict:
        raise EnvhubError(
            "the verifiers environment rewrote the conversation (its history is shorter than "
            "envhub's); envhub needs each turn's prompt to extend the last"
        )
    return [_to_message(m) for m in vf_messages[known:]]


# -- the rubric -----------------------------------------------------------------------------------


class VerifiersRubric(Rubric):
    """An envhub rubric whose scores are the verifiers rubric's own: ``score_rollout`` on the
    episode's verifiers state (``score_group`` over a group when it has group rewards).

    Args:
        vf_rubric: The verifiers environment's rubric.
    """

    def __init__(self, vf_rubric: Any) -> None:
        super().__init__()
        self.vf_rubric = _instrumented(vf_rubric)
        self.grouped = bool(vf_rubric.has_group_rewards)

    @property
    def group_funcs(self) -> list[Any]:
        """Non-empty when the verifiers rubric has group rewards: the runner then scores each
        group with :meth:`score_group` (and :meth:`score` scores nothing)."""
        return [self.vf_rubric] if self.grouped else []

    async def score(self, state: State) -> Score:
        """The verifiers rubric's score of the finished episode (0 for a grouped rubric)."""
        vf_state = state.data.get("vf_state")
        if self.grouped or vf_state is None:
            return Score()
        return (await self._scored([vf_state], lambda s: self.vf_rubric.score_rollout(s[0])))[0]

    async def score_group(self, states: Sequence[State]) -> list[Score]:
        """The verifiers rubric's ``score_group`` over a group's finished episodes."""
        vf_states = [s.data.get("vf_state") for s in states]
        if any(v is None for v in vf_states):
            return [Score() for _ in states]
        return await self._scored(vf_states, self.vf_rubric.score_group)

    async def _scored(self, vf_states: list[Any], scorer: Callable[[Any], Any]) -> list[Score]:
        errors: list[ErrorRecord] = []
        token = _reward_errors.set(errors)
        try:
            await scorer(vf_states)
            for vf_state in vf_states:
                await self.vf_rubric.cleanup(vf_state)
        finally:
            _reward_errors.reset(token)
        return [
            Score(
                total=float(v["reward"]),
                components={k: float(x) for k, x in (v["metrics"] or {}).items()},
                errors=list(errors),
            )
            for v in vf_states
        ]


def _instrumented(vf_rubric: Any) -> Any:
    """A shallow copy of a verifiers rubric (and of the rubrics of a ``RubricGroup``) whose
    reward functions record what they raise before verifiers scores it 0."""
    rubric = copy.copy(vf_rubric)
    if isinstance(getattr(rubric, "rubrics", None), list):
        rubric.rubrics = [_instrumented(r) for r in rubric.rubrics]
    rubric.funcs = [_recording(f) for f in rubric.funcs]
    return rubric


def _recording(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func``, same name and signature (verifiers injects arguments by name), recording an
    exception on the episode being scored before re-raising it."""

    def record(e: Exception) -> None:
        errors = _reward_errors.get()
        if errors is not None:
            errors.append(
                ErrorRecord(
                    stage=f"reward:{getattr(func, '__name__', repr(func))}",
                    type=type(e).__name__,
                    message=str(e),
                    infra=is_infrastructure_error(e),
                )
            )

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return await func(*args, **kwargs)
            except Exception as e:
                record(e)
                raise

    else:

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return func(*args, **kwargs)
            except Exception as e:
                record(e)
                raise

    return wrapper
