"""The environment API: a ``gymnasium.Env`` whose observations are chat messages and whose
actions are the model's assistant turns.

    reset(*, seed=None, options=None) -> (messages, info)            the prompt
    step(action) -> (messages, reward, terminated, truncated, info)  the env's reply to one turn

Observations are the *new* messages (the prompt on reset, the env's reply on step); the env
keeps the whole conversation in ``env.state`` (a :class:`~envhub.state.State`). ``terminated``
means the episode reached its end (an answer was given, the game was won or lost); ``truncated``
means a budget ran out (turns or tokens) first. The reward arrives on the final step;
``info["reward_components"]`` holds every component of it.

Async twins ``areset``/``astep`` let the rollout runner drive thousands of episodes on one event
loop. Write either form: the sync methods of an async env run it on a private loop, and the
async methods of a sync env run it in a worker thread.

Classes here, from general to specific:

- :class:`Env` — the bare contract, for envs that manage everything themselves;
- :class:`TaskEnv` — tasks from a dataset, a rubric, message history and budgets; subclass it
  through :class:`SingleTurnEnv` or :class:`~envhub.multiturn.MultiTurnEnv`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, Protocol, runtime_checkable

import gymnasium as gym

from envhub._async import run_sync
from envhub.errors import EnvhubError, EnvLoadError
from envhub.rewards.rubric import Rubric
from envhub.rows import RequiredField, missing_message, needs_argument, rows_without
from envhub.spaces import AssistantTurnSpace, MessagesSpace
from envhub.state import State
from envhub.types import (
    AssistantTurn,
    EnvRef,
    Message,
    as_message,
    assistant,
    system,
    user,
)

logger = logging.getLogger(__name__)

Action = str | Message | AssistantTurn
StepResult = tuple[list[Message], float, bool, bool, dict[str, Any]]

NEW_SEGMENT = "new_segment"
"""A step's ``info`` key: when true, the observation is not a reply but a whole new conversation
(a harness rewrote its history; see :mod:`envhub.harness`), with ``info["tools"]`` its tools.
The rollout runner then starts the episode's next token segment from that conversation."""


def as_turn(action: Action) -> AssistantTurn:
    """Normalise an action to an :class:`AssistantTurn`."""
    if isinstance(action, AssistantTurn):
        return action
    if isinstance(action, str):
        return AssistantTurn(message=assistant(action))
    message = as_message(action)
    if message.role != "assistant":
        raise EnvhubError(f"an action must be an assistant message, got role {message.role!r}")
    return AssistantTurn(message=message)


class Env(gym.Env[list[Message], Action]):
    """Base class of every envhub environment.

    Subclasses set ``name`` (and usually ``version``), implement ``reset``/``step`` or
    ``areset``/``astep``, and may declare ``tools`` (OpenAI schemas through ``tool_schemas``).
    """

    name: ClassVar[str] = "env"
    version: ClassVar[str] = "0.0.0"
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}
    reward_range: tuple[float, float] = (float("-inf"), float("inf"))
    """Bounds every episode's total reward stays within; ``check_env`` enforces them."""
    pass_threshold: float = 1.0
    """An episode whose reward reaches this counts as solved (for pass@k)."""
    reference_policy: Callable[..., str] | None = None
    """A policy ``(messages, tools) -> str`` that solves every task, if the env has one;
    ``check_env`` verifies that it reaches the top of ``reward_range``. An instance whose
    settings void the guarantee (fewer turns, say) sets it to ``None``."""
    audit_floor: float | None = None
    """The most an episode may score without solving anything (``None``: the floor of
    ``reward_range``). An env that pays for the answer's form alone (0.1 for a ``\\boxed{}``,
    say) declares that pay here; :func:`envhub.audit_env` fails when a degenerate policy
    (empty, echo, junk in the answer format, ...) scores above it."""
    levels: ClassVar[tuple[str, ...]] = ()
    """Difficulty levels, easiest first, that a training curriculum may move the env between
    (the trainer's ``curriculum.levels``); empty: the env has none. ``level_arg`` names the
    constructor argument that selects one (``envhub.make(name, **{level_arg: level})``), and
    :meth:`current_level` says which one an instance plays."""
    level_arg: ClassVar[str] = "level"
    cheats: Mapping[str, Callable[..., str]] = MappingProxyType({})
    """Name -> a policy ``(messages, tools) -> str`` that exploits a weakness this env once had
    or could have (boxing the question's own expression, say). :func:`envhub.audit_env` runs
    each one with its built-in degenerate policies: none may score above ``audit_floor``."""

    def __init__(self) -> None:
        self.observation_space = MessagesSpace()
        self.action_space = AssistantTurnSpace()
        self.render_mode = "ansi"
        self._closed = False

    def current_level(self) -> str | None:
        """The level this instance plays: the value of its ``level_arg`` attribute, ``None``
        when the env has no ``levels`` or its settings match none of them."""
        if not self.levels:
            return None
        level = getattr(self, self.level_arg, None)
        return level if level in self.levels else None

    @property
    def ref(self) -> EnvRef:
        """The env's name and version, as recorded on trajectories."""
        return EnvRef(name=self.name, version=self.version)

    @property
    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """OpenAI-format tool schemas offered to the model, or ``None`` when the env has none."""
        return None

    @property
    def remaining_tokens(self) -> int | None:
        """Tokens the policy may still sample this episode, if the env has a token budget."""
        return None

    @property
    def multi_role(self) -> bool:
        """Whether an episode is a match between several actors taking turns
        (:class:`~envhub.roles.MultiRoleEnv`): the reset's and each step's ``info`` then name
        the actor to move, and the runner records one trajectory per actor the policy plays."""
        return False

    # -- sync/async bridging: subclasses override one side of each pair ------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode and return ``(prompt messages, info)``.

        This default runs ``areset`` to completion; a subclass overrides this method or
        ``areset``.

        Args:
            seed: Seed for this episode; the same seed must reproduce the same episode.
            options: Env-specific options for this episode.

        Raises:
            NotImplementedError: The subclass implements neither ``reset`` nor ``areset``.
        """
        if type(self).areset is Env.areset:
            raise NotImplementedError(f"{type(self).__name__} must implement reset() or areset()")
        return run_sync(self.areset(seed=seed, options=options))

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Async twin of :meth:`reset`; this default runs ``reset`` in a worker thread.

        Raises:
            NotImplementedError: The subclass implements neither ``reset`` nor ``areset``.
        """
        if type(self).reset is Env.reset:
            raise NotImplementedError(f"{type(self).__name__} must implement reset() or areset()")
        return await asyncio.to_thread(lambda: self.reset(seed=seed, options=options))

    def step(self, action: Action) -> StepResult:
        """Take one assistant turn; return ``(messages, reward, terminated, truncated, info)``.

        This default runs ``astep`` to completion; a subclass overrides this method or ``astep``.

        Raises:
            NotImplementedError: The subclass implements neither ``step`` nor ``astep``.
        """
        if type(self).astep is Env.astep:
            raise NotImplementedError(f"{type(self).__name__} must implement step() or astep()")
        return run_sync(self.astep(action))

    async def astep(self, action: Action) -> StepResult:
        """Async twin of :meth:`step`; this default runs ``step`` in a worker thread.

        Raises:
            NotImplementedError: The subclass implements neither ``step`` nor ``astep``.
        """
        if type(self).step is Env.step:
            raise NotImplementedError(f"{type(self).__name__} must implement step() or astep()")
        return await asyncio.to_thread(self.step, action)

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Release resources. Safe to call more than once."""
        if not self._closed:
            self._closed = True
            self.on_close()

    def on_close(self) -> None:
        """Hook for subclasses: release resources (called once by ``close``)."""

    def __enter__(self) -> Env:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def close_quietly(env: Env) -> None:
    """Close ``env``, logging a failure instead of raising it.

    A ``close`` that raises is the env's bug: it must not lose the rest of a rollout batch, nor
    a server's other sessions.
    """
    try:
        env.close()
    except Exception:
        logger.warning("closing env %r raised", env, exc_info=True)


class TaskEnv(Env):
    """An env that draws tasks from a dataset and scores episodes with a rubric.

    Args:
        dataset: Tasks: a ``datasets.Dataset``, a list of dicts, or any sequence of dicts.
            Defaults to :meth:`load_dataset`.
        rubric: Reward functions; defaults to :meth:`default_rubric`.
        system_prompt: Replaces the class's ``system_prompt``.
        max_turns: Assistant turns before the episode is truncated.
        max_tokens: Sampled tokens per episode before it is truncated (``None``: no limit).
    """

    system_prompt: ClassVar[str | None] = None
    default_max_turns: ClassVar[int] = 1
    reward_range = (0.0, 1.0)

    def __init__(
        self,
        dataset: Sequence[dict[str, Any]] | None = None,
        *,
        rubric: Rubric | None = None,
        system_prompt: str | None = None,
        max_turns: int | None = None,
        max_tokens: int | None = None,
    ) -> None:
        super().__init__()
        rows = dataset if dataset is not None else self.load_dataset()
        self.dataset = _as_sequence(rows)
        if len(self.dataset) == 0:
            raise EnvhubError(f"{self.name}: the dataset is empty")
        self.rubric = rubric if rubric is not None else self.default_rubric()
        # Data is checked row by row (a datasets.Dataset by column, in milliseconds); rows that
        # code generates on demand (procedural tasks) are not: generating them all would cost
        # every construction of the env (176 ms for the calculator's 1000), and `envhub check`
        # runs the prompt over every row anyway.
        if isinstance(rows, (list, tuple)) or hasattr(rows, "column_names"):
            self._check_rows(rows)
        self.instructions = system_prompt if system_prompt is not None else self.system_prompt
        self.max_turns = max_turns if max_turns is not None else self.default_max_turns
        self.max_tokens = max_tokens
        self.state: State | None = None

    # -- hooks for subclasses ---------------------------------------------------------------

    def load_dataset(self) -> Sequence[dict[str, Any]]:
        """Tasks to use when none are passed in."""
        raise EnvhubError(f"{self.name}: pass `dataset=` or override `load_dataset()`")

    def default_rubric(self) -> Rubric:
        """Reward functions to use when none are passed in."""
        return Rubric()

    def required_fields(self) -> list[RequiredField]:
        """Fields every dataset row must have; checked over all rows when the env is made.

        By default: ``answer`` when a reward asks for it (an ``answer`` or ``answers`` parameter
        without a default value), and ``prompt`` or ``question`` unless :meth:`format_prompt` is
        overridden. Override it (and extend ``super()``'s list) to name the fields your own
        hooks read, so that a bad row is named when the env is made, not found mid-training.
        """
        fields = []
        readers = [
            f.name
            for f in self.rubric.funcs
            if needs_argument(f, "answers" if f.group else "answer")
        ]
        if readers:
            names = ", ".join(f"`{name}`" for name in readers)
            fields.append(
                RequiredField(("answer",), f"the reward{'s' * (len(readers) > 1)} {names}")
            )
        if type(self).format_prompt is TaskEnv.format_prompt:
            fields.append(RequiredField(("prompt", "question"), "format_prompt"))
        return fields

    def format_prompt(self, task: dict[str, Any]) -> list[Message]:
        """The first messages of an episode: the system prompt and the task's question."""
        if "prompt" in task and isinstance(task["prompt"], list):
            return [as_message(m) for m in task["prompt"]]
        text = task.get("prompt") or task.get("question")
        if text is None:
            raise EnvhubError(
                f"{self.name}: task has neither 'prompt' nor 'question' ({sorted(task)})"
            )
        head = [system(self.instructions)] if self.instructions else []
        return [*head, user(str(text))]

    async def setup_state(self, state: State) -> None:
        """Per-episode set-up after the task is chosen (draw a secret, open a sandbox, ...).
        Use ``self.np_random`` for randomness so that seeds reproduce episodes."""

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        """Reply to an assistant turn. Set ``state.done = True`` to end the episode."""
        state.done = True
        return []

    # -- the gym API --------------------------------------------------------------------------

    @property
    def remaining_tokens(self) -> int | None:
        """Tokens left under ``max_tokens`` this episode; ``None`` without a limit or episode."""
        if self.max_tokens is None or self.state is None:
            return None
        return max(0, self.max_tokens - self.state.tokens)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Seed the env, choose a task, build its prompt and run :meth:`setup_state`.

        Args:
            seed: Seeds ``self.np_random``, which picks the task unless ``options`` names one.
            options: ``{"task_index": i}`` picks a dataset row; ``{"task": {...}}`` passes a
                task directly (with an optional ``"task_index"`` to record).

        Returns:
            The prompt messages and ``{"task_index": index}``.

        Raises:
            EnvhubError: ``task_index`` is outside the dataset.
        """
        gym.Env.reset(self, seed=seed)
        index, task = self._choose_task(options or {})
        prompt = self.format_prompt(task)
        self.state = State(task=task, task_index=index, prompt=list(prompt), messages=list(prompt))
        await self.setup_state(self.state)
        return list(self.state.prompt), {"task_index": index}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Sync form of :meth:`areset`."""
        return run_sync(self.areset(seed=seed, options=options))

    async def astep(self, action: Action) -> StepResult:
        """Record the assistant turn, get the env's reply and score the episode if it ended.

        The episode terminates when :meth:`env_response` sets ``state.done``, and is truncated
        when ``max_turns`` or ``max_tokens`` runs out first. The reward is what the reply hook
        paid for the turn (``state.pay``, 0.0 by default) plus, on the final step, the rubric's
        total; the final step's info carries ``stop_reason``, ``reward_components``, ``metrics``
        and ``errors``.

        Raises:
            EnvhubError: No episode is active (``reset`` was not called, or the episode ended).
        """
        state = self._active_state()
        turn = as_turn(action)
        state.messages.append(turn.message)
        state.turn += 1
        state.tokens += turn.num_tokens or 0
        if turn.finish_reason == "length":
            state.metrics["length_stopped_turns"] += 1
        state.step_reward = 0.0
        observation = list(await self.env_response(state, turn))
        state.messages.extend(observation)
        terminated, truncated = state.done, False
        if not terminated:
            truncated = self._budget_exhausted(state)
        reward = state.step_reward
        if terminated or truncated:
            reward += await self._finish(state)
        return (
            observation,
            reward,
            terminated,
            truncated,
            self._step_info(state, terminated or truncated),
        )

    def step(self, action: Action) -> StepResult:
        """Sync form of :meth:`astep`."""
        return run_sync(self.astep(action))

    async def atruncate(self, reason: str) -> tuple[float, dict[str, Any]]:
        """End the episode from outside (the runner ran out of context or budget) and score it."""
        state = self._active_state()
        state.stop_reason = reason
        reward = await self._finish(state)
        return reward, self._step_info(state, ended=True)

    def render(self) -> str:
        """The conversation so far as plain text."""
        if self.state is None:
            return ""
        return "\n\n".join(f"[{m.role}] {m.content or ''}" for m in self.state.messages)

    # -- internals ----------------------------------------------------------------------------

    def _choose_task(self, options: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if "task" in options:
            return int(options.get("task_index", -1)), dict(options["task"])
        if "task_index" in options:
            index = int(options["task_index"])
            if not 0 <= index < len(self.dataset):
                raise EnvhubError(
                    f"{self.name}: task_index {index} is outside 0..{len(self.dataset) - 1}"
                )
        else:
            index = int(self.np_random.integers(len(self.dataset)))
        return index, dict(self.dataset[index])

    def _check_rows(self, rows: Any) -> None:
        for need in self.required_fields():
            missing = rows_without(rows, need.names)
            if missing:
                raise EnvLoadError(missing_message(self.name, need, missing, len(self.dataset)))

    def _active_state(self) -> State:
        if self.state is None:
            raise EnvhubError(f"{self.name}: call reset() before step()")
        if self.state.stop_reason is not None:
            raise EnvhubError(
                f"{self.name}: the episode has ended ({self.state.stop_reason}); call reset()"
            )
        return self.state

    def _budget_exhausted(self, state: State) -> bool:
        if state.turn >= self.max_turns:
            state.stop_reason = "max_turns"
        elif self.max_tokens is not None and state.tokens >= self.max_tokens:
            state.stop_reason = "max_tokens"
        return state.stop_reason is not None

    async def _finish(self, state: State) -> float:
        state.stop_reason = state.stop_reason or "terminated"
        score = await self.rubric.score(state)
        state.reward_components = state.paid | score.components
        state.errors.extend(score.errors)
        return score.total

    def _step_info(self, state: State, ended: bool) -> dict[str, Any]:
        info: dict[str, Any] = {"turn": state.turn}
        if ended:
            info.update(
                stop_reason=state.stop_reason,
                reward_components=dict(state.reward_components),
                metrics=dict(state.metrics),
                errors=list(state.errors),
            )
        return info


@runtime_checkable
class EpisodeEnv(Protocol):
    """What the rollout runner and a replay read of an env beyond ``Env``: its episode's state,
    and a way to end and score an episode the runner cuts short. A ``TaskEnv`` has both; so does
    a ``RemoteEnv`` (its ``state`` is ``None`` unless it serves a ``TaskEnv``)."""

    state: State | None

    async def atruncate(self, reason: str) -> tuple[float, dict[str, Any]]:
        """End the episode from outside and score it."""
        ...


class SingleTurnEnv(TaskEnv):
    """One prompt, one answer, one reward."""

    default_max_turns = 1


class _Sequence(Sequence):
    def __init__(self, items: Any) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: Any) -> Any:
        return self.items[i]


def _as_sequence(dataset: Any) -> Sequence[dict[str, Any]]:
    """Datasets and lists index directly; any other iterable is read into a list once."""
    if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
        return dataset if isinstance(dataset, Sequence) else _Sequence(dataset)
    return list(dataset)


def _answer_param(func: Any) -> str:
    """The parameter a reward reads the answer from: ``answers`` (group rewards) or ``answer``."""
    return "answers" if func.group else "answer"
