"""Episodes with several roles taking turns: self-play, fixed opponents, setter and solver.

A :class:`MultiRoleEnv` is an ``Env`` whose episode is a match between *actors*. An actor id is
a role name (``x``, ``o``) or a role and a seat (``solver#2``: one of several attempts of the
role ``solver`` at what its episode posed). Each actor sees its own conversation; the env says
whose turn it is. The gym API is kept, read per actor:

    reset() -> (the first actor's prompt, info)
    step(action of info["to_move"]) -> (what the *next* actor sees now, reward of the actor that
                                     acted, terminated, truncated, info)

``info["to_move"]`` names the actor to move next (the one the observation is for);
``info["role_rewards"]`` holds what every actor was paid at this step; on the final step
``info["role_results"]`` says how each actor's episode ended (``win``, ``loss``, ``draw``,
``solved``, ``invalid``, ``crashed``, ...). When several actors move next one after another
without seeing each other's moves (the solvers of one problem), ``info["upcoming"]`` lists
those after ``to_move`` with what each will be shown, so the runner may sample their turns at
once (an env says so with :attr:`Match.upcoming`). A role can be played by a *fixed policy* (a
Python function ``(messages, rng) -> str``: a scripted opponent the env ships, named in
``fixed_policies``, or one the config names as ``"module:function"``); the env plays those turns
itself, so the runner only ever sees the actors that the policy being trained plays. An env
whose other roles are all fixed therefore looks, from outside, like a one-role env.

A fixed policy that raises ends the episode with an error recorded at stage ``role:<actor>``
and that actor's result ``crashed``: the episode is data, not a crash of the run. The rollout
runner (:mod:`envhub.rollout.roles`) records one trajectory per actor the policy played.

Write a subclass by declaring ``roles`` and ``reward_mode`` and implementing :meth:`setup`
(prompts and the first mover) and :meth:`play` (apply one actor's turn: tell the others, pay,
pick the next mover or end), both reading and writing a :class:`Match`.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import gymnasium as gym
import numpy as np

from envhub.env import Action, Env, StepResult, as_turn
from envhub.errors import ConfigError, EnvhubError
from envhub.types import AssistantTurn, ErrorRecord, Message, actor_role, assistant

RewardMode = Literal["zero_sum", "cooperative", "general"]
"""How the roles' rewards relate: ``zero_sum`` (they sum to 0 in every finished episode),
``cooperative`` (every role gets the same reward) or ``general`` (each its own)."""

FixedPolicy = Callable[[list[Message], np.random.Generator], str]
"""A scripted player: the actor's conversation so far and the episode's random generator in,
the actor's reply out."""

ROLE = "to_move"
"""Step/reset ``info`` key: the actor to move next (whose view the observation is)."""
ROLE_REWARDS = "role_rewards"
"""Step ``info`` key: ``{actor: reward}`` paid at this step."""
ROLE_RESULTS = "role_results"
"""Final-step ``info`` key: ``{actor: result}``."""
ROLE_COMPONENTS = "role_components"
"""Final-step ``info`` key: ``{actor: {component: total}}``."""
UPCOMING = "upcoming"
"""Reset/step ``info`` key, when the env set :attr:`Match.upcoming`: ``{actor: messages}``, the
trained actors that move after ``to_move``, in order, with what each will be shown."""


@dataclass
class Match:
    """Everything about the current episode of a :class:`MultiRoleEnv`."""

    task: dict[str, Any]
    task_index: int
    views: dict[str, list[Message]] = field(default_factory=dict)
    """Each actor's conversation as it has seen it (its prompt, replies and own turns)."""
    pending: dict[str, list[Message]] = field(default_factory=dict)
    """Messages told to an actor that it will see on its next turn."""
    to_move: str | None = None
    """The actor whose turn is next; set by :meth:`MultiRoleEnv.setup` and ``play``."""
    upcoming: list[str] = field(default_factory=list)
    """Actors that move after ``to_move``, in this order, none of them told anything by the
    others' moves in between: what each is shown is already pending, so the runner may sample
    their turns together with ``to_move``'s (the solvers of one problem). Emptied at every turn;
    an env sets it with ``to_move``. A hint: a turn sampled ahead whose actor is then shown
    something else is sampled again."""
    acting: str | None = None
    """The actor whose turn is being played (what :meth:`tell` labels messages with)."""
    turn: int = 0
    done: bool = False
    stop_reason: str | None = None
    step_rewards: dict[str, float] = field(default_factory=dict)
    rewards: dict[str, float] = field(default_factory=dict)
    """Every actor's total so far."""
    components: dict[str, dict[str, float]] = field(default_factory=dict)
    results: dict[str, str] = field(default_factory=dict)
    errors: list[ErrorRecord] = field(default_factory=list)
    metrics: Counter[str] = field(default_factory=Counter)
    data: dict[str, Any] = field(default_factory=dict)
    """Scratch space for the env (the board, the problem, ...)."""

    def tell(self, actor: str, *messages: Message) -> None:
        """Queue ``messages`` for ``actor`` (seen on its next turn), labelled with the actor
        whose turn produced them (``None`` during :meth:`MultiRoleEnv.setup`)."""
        queue = self.pending.setdefault(actor, [])
        queue.extend(
            m if m.actor else m.model_copy(update={"actor": self.acting}) for m in messages
        )

    def pay(self, actor: str, amount: float, component: str = "outcome") -> None:
        """Pay ``actor`` ``amount`` at this step (its total and ``component`` grow by it)."""
        self.step_rewards[actor] = self.step_rewards.get(actor, 0.0) + amount
        self.rewards[actor] = self.rewards.get(actor, 0.0) + amount
        parts = self.components.setdefault(actor, {})
        parts[component] = parts.get(component, 0.0) + amount

    def end(self, results: Mapping[str, str]) -> None:
        """End the episode with each actor's result (``win``, ``loss``, ``solved``, ...)."""
        self.results.update(results)
        self.done = True
        self.to_move = None

    def deliver(self, actor: str) -> list[Message]:
        """Move ``actor``'s pending messages into its view and return them."""
        new = self.pending.pop(actor, [])
        self.views.setdefault(actor, []).extend(new)
        return new


def load_fixed_policy(spec: str | FixedPolicy, shipped: Mapping[str, FixedPolicy]) -> FixedPolicy:
    """A fixed policy from its name among the env's ``shipped`` ones, a ``"module:function"``
    import string, or a callable.

    Raises:
        ConfigError: The name is unknown or the import fails.
    """
    if callable(spec):
        return spec
    if spec in shipped:
        return shipped[spec]
    module, sep, name = spec.partition(":")
    if not sep:
        known = ", ".join(sorted(shipped)) or "none"
        raise ConfigError(
            f"unknown fixed policy {spec!r}: name one the env ships ({known}) or give "
            "'module:function'"
        )
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"cannot load fixed policy {spec!r}: {e}") from e


def role_totals_problem(env: MultiRoleEnv, totals: Mapping[str, float], failed: bool) -> str | None:
    """What is wrong with one episode's ``{actor: total}`` (``None``: nothing): a total outside
    its role's range, or (in an episode without errors) totals that break ``reward_mode``."""
    for actor, total in totals.items():
        low, high = env.role_reward_range(actor_role(actor))
        if not low - 1e-9 <= total <= high + 1e-9:
            return f"{actor} totals {total}, outside its role's range ({low}, {high})"
    if failed or len(totals) < 2:
        return None
    values = list(totals.values())
    if env.reward_mode == "zero_sum" and abs(sum(values)) > 1e-9:
        return f"reward_mode is zero_sum but the totals {dict(totals)} sum to {sum(values)}"
    if env.reward_mode == "cooperative" and max(values) - min(values) > 1e-9:
        return f"reward_mode is cooperative but the totals differ: {dict(totals)}"
    return None


class MultiRoleEnv(Env):
    """An env whose episodes are matches between several roles (see the module doc).

    Args:
        policies: ``{role: policy}`` for roles played by a fixed policy (a name from
            ``fixed_policies``, ``"module:function"`` or a callable); every other role is
            played by the policy being trained or evaluated.
        max_turns: Turns (all actors together) before the episode is truncated.
    """

    roles: ClassVar[tuple[str, ...]] = ()
    """The roles, in no particular order; actors are these names or ``role#seat``."""
    reward_mode: ClassVar[RewardMode] = "general"
    fixed_policies: ClassVar[Mapping[str, FixedPolicy]] = {}
    """Scripted players the env ships, by name (``random``, ``perfect``, ...)."""
    default_max_turns: ClassVar[int] = 32

    def __init__(
        self,
        *,
        policies: Mapping[str, str | FixedPolicy] | None = None,
        max_turns: int | None = None,
    ) -> None:
        super().__init__()
        policies = dict(policies or {})
        unknown = sorted(set(policies) - set(self.roles))
        if unknown:
            raise ConfigError(
                f"{self.name}: policies names unknown role(s) {unknown}; roles are "
                f"{list(self.roles)}"
            )
        self.fixed = {r: load_fixed_policy(p, self.fixed_policies) for r, p in policies.items()}
        if len(self.fixed) == len(self.roles):
            raise ConfigError(
                f"{self.name}: policies fixes every role ({list(self.roles)}); leave at least "
                "one to the policy being trained"
            )
        self.max_turns = max_turns if max_turns is not None else self.default_max_turns
        self.match: Match | None = None

    def role_reward_range(self, role: str) -> tuple[float, float]:
        """Bounds of one role's episode total (``reward_range`` unless a role's are tighter);
        ``check_env`` holds every actor to its role's, and the null policy to its floor."""
        return self.reward_range

    @property
    def multi_role(self) -> bool:
        """Always: an episode is a match between actors (see the module doc)."""
        return True

    @property
    def trained_roles(self) -> tuple[str, ...]:
        """The roles the policy plays (those without a fixed policy)."""
        return tuple(r for r in self.roles if r not in self.fixed)

    @property
    def dataset(self) -> Sequence[dict[str, Any]]:
        """The tasks (:meth:`tasks`), by the name the trainer and ``eval`` count them by."""
        return self.tasks()

    # -- hooks for subclasses ---------------------------------------------------------------

    def tasks(self) -> Sequence[dict[str, Any]]:
        """The env's tasks (one dict each); one empty task by default."""
        return [{}]

    def setup(self, match: Match) -> None:
        """Start a match: :meth:`Match.tell` each actor its prompt and set ``to_move``."""
        raise NotImplementedError(f"{type(self).__name__} must implement setup()")

    def play(self, match: Match, actor: str, turn: AssistantTurn) -> None:
        """Apply ``actor``'s turn: tell the others, pay, set the next ``to_move`` or
        :meth:`Match.end` the match."""
        raise NotImplementedError(f"{type(self).__name__} must implement play()")

    # -- the gym API --------------------------------------------------------------------------

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start a match; return the first trained actor's prompt and ``{"to_move": actor, ...}``.

        Args:
            seed: Seeds ``self.np_random`` (the task, the fixed policies' choices).
            options: ``{"task_index": i}`` picks a task.

        Raises:
            EnvhubError: ``task_index`` is out of range, or the match ended before any actor
                the policy plays had a turn.
        """
        gym.Env.reset(self, seed=seed)
        index, task = self._choose_task(options or {})
        self.match = Match(task=task, task_index=index)
        self.setup(self.match)
        self._play_fixed(self.match)
        if self.match.to_move is None:
            raise EnvhubError(f"{self.name}: the match ended before the policy had a turn")
        observation = self.match.deliver(self.match.to_move)
        return observation, {"task_index": index, ROLE: self.match.to_move, **self._upcoming()}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Sync form of :meth:`areset`."""
        from envhub._async import run_sync

        return run_sync(self.areset(seed=seed, options=options))

    async def astep(self, action: Action) -> StepResult:
        """Play the turn of the actor ``info["to_move"]`` named, then every fixed policy's turn
        up to the next trained actor's; return what that actor sees now.

        Raises:
            EnvhubError: No match is active.
        """
        match = self._active()
        actor = match.to_move
        assert actor is not None
        match.step_rewards = {}
        self._apply(match, actor, as_turn(action))
        self._play_fixed(match)
        truncated = False
        if not match.done and match.turn >= self.max_turns:
            match.stop_reason, truncated = "max_turns", True
        ended = match.done or truncated
        observation = [] if ended else match.deliver(match.to_move)
        reward = match.step_rewards.get(actor, 0.0)
        return observation, reward, match.done, truncated, self._info(match, ended)

    def step(self, action: Action) -> StepResult:
        """Sync form of :meth:`astep`."""
        from envhub._async import run_sync

        return run_sync(self.astep(action))

    async def atruncate(self, reason: str) -> tuple[float, dict[str, Any]]:
        """End the match from outside (the runner ran out of context) as truncated."""
        match = self._active()
        match.stop_reason = reason
        match.step_rewards = {}
        return 0.0, self._info(match, ended=True)

    def render(self) -> str:
        """Every actor's view so far, as plain text."""
        if self.match is None:
            return ""
        return "\n\n".join(
            f"== {actor}\n" + "\n".join(f"[{m.role}] {m.content or ''}" for m in view)
            for actor, view in self.match.views.items()
        )

    # -- internals ----------------------------------------------------------------------------

    def _apply(self, match: Match, actor: str, turn: AssistantTurn) -> None:
        message = turn.message.model_copy(update={"actor": actor})
        match.views.setdefault(actor, []).append(message)
        match.acting = actor
        match.turn += 1
        match.upcoming = []
        self.play(match, actor, turn.model_copy(update={"message": message}))
        match.acting = None

    def _play_fixed(self, match: Match) -> None:
        """Play fixed policies' turns until a trained actor is to move or the match ends."""
        while not match.done and match.to_move is not None:
            actor = match.to_move
            policy = self.fixed.get(actor_role(actor))
            if policy is None:
                return
            match.deliver(actor)
            try:
                text = policy(list(match.views[actor]), self.np_random)
            except Exception as e:
                return self._crash(match, actor, e)
            self._apply(match, actor, AssistantTurn(message=assistant(str(text))))

    @staticmethod
    def _crash(match: Match, actor: str, error: Exception) -> None:
        match.errors.append(
            ErrorRecord(
                stage=f"role:{actor}", type=type(error).__name__, message=str(error) or "raised"
            )
        )
        match.results[actor] = "crashed"
        match.stop_reason = "error"
        match.done = True
        match.to_move = None

    def _info(self, match: Match, ended: bool) -> dict[str, Any]:
        info: dict[str, Any] = {
            "turn": match.turn,
            ROLE: match.to_move,
            ROLE_REWARDS: dict(match.step_rewards),
        }
        if not ended:
            info.update(self._upcoming())
        if ended:
            info.update(
                stop_reason=match.stop_reason or "terminated",
                role_results=dict(match.results),
                role_components={a: dict(c) for a, c in match.components.items()},
                reward_components={},
                metrics=dict(match.metrics),
                errors=list(match.errors),
            )
        return info

    def _upcoming(self) -> dict[str, Any]:
        """``{"upcoming": {actor: pending messages}}`` for the trained actors the env listed
        in :attr:`Match.upcoming` (nothing when it listed none)."""
        match = self.match
        assert match is not None
        upcoming = {
            actor: list(match.pending.get(actor, []))
            for actor in match.upcoming
            if actor != match.to_move and actor_role(actor) not in self.fixed
        }
        return {UPCOMING: upcoming} if upcoming else {}

    def _active(self) -> Match:
        if self.match is None:
            raise EnvhubError(f"{self.name}: call reset() before step()")
        if self.match.done or self.match.stop_reason is not None:
            raise EnvhubError(f"{self.name}: the match has ended; call reset()")
        return self.match

    def _choose_task(self, options: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        tasks = self.tasks()
        if "task_index" in options:
            index = int(options["task_index"])
            if not 0 <= index < len(tasks):
                raise EnvhubError(f"{self.name}: task_index {index} is outside 0..{len(tasks) - 1}")
        else:
            index = int(self.np_random.integers(len(tasks)))
        return index, dict(tasks[index])
