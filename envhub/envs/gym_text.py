"""Gymnasium envs with discrete actions, played in text; FrozenLake as the built-in example.

:class:`GymTextEnv` wraps any gymnasium env whose action space is ``Discrete``. The model
sees each observation rendered as text and replies with the name of an action; the reply is
read leniently (see :meth:`GymTextEnv.parse_action`). The wrapped env's ``terminated`` ends the
episode and its ``truncated`` truncates it (``stop_reason="env_truncated"``); the reward is the
wrapped env's return.

A reply that names no action gets a hint, counts in ``metrics["invalid_actions"]``, uses up the
turn without stepping the wrapped env, and is charged ``invalid_penalty``: by default the lowest
reward one step of the wrapped env can give, or 0 if no step reward is negative. Whatever the
policy does next, replacing such a reply by any action pays at least as much, so a policy that
never acts scores ``max_turns * invalid_penalty``, the floor of ``reward_range``, and never
beats one that acts (without the charge, never acting would score 0 and beat every real policy
of an env whose step rewards are negative, CliffWalking's or Taxi's say). The bounds of one step's
reward are read from the transition table ``P`` of gymnasium's tabular toy-text envs
(FrozenLake, CliffWalking, Taxi); any other env declares them with ``step_reward_range``.

Seeding: every task carries a seed, and the wrapped env is reset with it. The task therefore
fixes the initial state and the random stream of the dynamics: all samples of a GRPO group
face the same world, and any episode can be replayed exactly.
"""

from __future__ import annotations

import random
import re
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker, TimeLimit

from envhub.envs.procedural import ProceduralTasks
from envhub.errors import EnvhubError
from envhub.multiturn import MultiTurnEnv
from envhub.rewards.rubric import Rubric, reward
from envhub.state import State
from envhub.types import AssistantTurn, Message, system, user

GymSource = str | gym.Env | Callable[[], gym.Env]
_ACTION_TAG = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)
# The wrappers gymnasium.make adds; none of them changes a reward, so the table P still holds.
_MAKE_WRAPPERS = (TimeLimit, OrderEnforcing, PassiveEnvChecker)


@reward(name="return")
def episode_return(state: State) -> float:
    """The wrapped env's total reward over the episode, plus the charges for invalid replies."""
    return float(state.data.get("episode_return", 0.0))


def seed_tasks(size: int, seed: int) -> ProceduralTasks:
    """``size`` tasks, each only a reset seed for the wrapped env."""
    return ProceduralTasks(
        "gym-text", lambda rng: {"info": {"seed": rng.randrange(2**31)}}, size, seed
    )


class GymTextEnv(MultiTurnEnv):
    """A gymnasium env with discrete actions, played by naming actions in text.

    Args:
        gym_env: The env to wrap: a gymnasium id (made with ``gymnasium.make``), an instance,
            or a function of no arguments that makes one. It is made on first use.
        action_names: One name per discrete action, in the order of the action space.
        render_observation: Turns an observation into text (default: ``str``).
        instructions: What the game is about; the system prompt adds the actions and the
            reply format.
        gym_kwargs: Keyword arguments for ``gymnasium.make`` when ``gym_env`` is an id.
        num_tasks: Number of tasks (each is a seed for resetting the wrapped env).
        task_seed: Seed of the tasks' seeds.
        step_reward_range: Lowest and highest reward of one step of the wrapped env. Default:
            read from the transition table ``P`` of a tabular env (gymnasium's FrozenLake,
            CliffWalking, Taxi); any other env must declare it.
        invalid_penalty: Reward of a reply that names no action. Default: the lowest step
            reward if it is negative, else 0; a value above that is refused, since it would
            make not acting pay better than acting.
        reward_range: Bounds of an episode's return. Default: ``max_turns`` turns each
            charged ``invalid_penalty`` below, and each paid the highest step reward (or 0)
            above.
        **kwargs: See :class:`~envhub.env.TaskEnv` (``max_turns``, ``rubric``,
            ``system_prompt``, ...).
    """

    name = "gym-text"
    version = "0.1.0"
    default_max_turns = 20

    def __init__(
        self,
        gym_env: GymSource,
        action_names: Sequence[str],
        *,
        render_observation: Callable[[Any], str] = str,
        instructions: str = "",
        gym_kwargs: dict[str, Any] | None = None,
        num_tasks: int = 1000,
        task_seed: int = 0,
        step_reward_range: tuple[float, float] | None = None,
        invalid_penalty: float | None = None,
        reward_range: tuple[float, float] | None = None,
        **kwargs: Any,
    ) -> None:
        self.action_names = _checked_names(action_names)
        self._action_index = {n.lower(): i for i, n in enumerate(self.action_names)}
        alternatives = "|".join(
            re.escape(n) for n in sorted(self.action_names, key=len, reverse=True)
        )
        self._action_pattern = re.compile(rf"(?<!\w)({alternatives})(?!\w)", re.IGNORECASE)
        self.source, self.gym_kwargs = gym_env, dict(gym_kwargs or {})
        self.render_observation = render_observation
        self.num_tasks, self.task_seed = num_tasks, task_seed
        self._step_rewards = _float_pair(step_reward_range)
        self._invalid_penalty = None if invalid_penalty is None else float(invalid_penalty)
        self._reward_range = _float_pair(reward_range)
        if self._step_rewards is not None:
            _checked_penalty(self._invalid_penalty, self._step_rewards[0])  # fail fast
        self._shared: gym.Env | None = None
        self._made: list[gym.Env] = []
        if kwargs.get("system_prompt") is None:
            kwargs["system_prompt"] = self.build_instructions(instructions)
        super().__init__(**kwargs)

    # -- rewards ------------------------------------------------------------------------------

    @property
    def step_reward_range(self) -> tuple[float, float]:
        """Lowest and highest reward of one step of the wrapped env: as given, else read from
        the transition table of the env of the first task (made now if no episode made one).

        Raises:
            EnvhubError: The bounds were not given and the wrapped env has no table to read.
        """
        if self._step_rewards is None:
            self._step_rewards = self._read_step_rewards(self.gym_env_for(self.dataset[0]))
        return self._step_rewards

    @property
    def invalid_penalty(self) -> float:
        """The reward of a reply that names no action: never above the lowest step reward or 0."""
        return _checked_penalty(self._invalid_penalty, self.step_reward_range[0])

    @property
    def reward_range(self) -> tuple[float, float]:
        """Bounds of an episode's return: as given, else what ``max_turns`` turns can add up to."""
        if self._reward_range is not None:
            return self._reward_range
        best_step = max(self.step_reward_range[1], 0.0)
        return (self.max_turns * self.invalid_penalty, self.max_turns * best_step)

    def _read_step_rewards(self, gym_env: gym.Env) -> tuple[float, float]:
        bounds = table_step_rewards(gym_env)
        if bounds is None:
            what = gym_env.spec.id if gym_env.spec is not None else type(gym_env.unwrapped).__name__
            raise EnvhubError(
                f"{self.name}: cannot tell the lowest reward one step of {what} can give (it has "
                "no transition table P, or a wrapper may change its rewards), and a reply that "
                "names no action must cost at least that much; pass "
                "step_reward_range=(lowest, highest), e.g. (-1.0, 1.0)"
            )
        return bounds

    # -- hooks for subclasses -----------------------------------------------------------------

    def build_instructions(self, instructions: str) -> str:
        """The system prompt: the game's instructions, the actions and the reply format."""
        actions = ", ".join(self.action_names)
        example = f"<action>{self.action_names[0]}</action>"
        reply_format = (
            f"Actions: {actions}. "
            f"Each turn, reply with one action inside <action></action>, e.g. {example}."
        )
        return f"{instructions}\n\n{reply_format}".strip()

    def gym_env_for(self, task: dict[str, Any]) -> gym.Env:
        """The wrapped env to play ``task`` in (default: one env for every task)."""
        if self._shared is None:
            self._shared = self.make_gym_env()
        return self._shared

    def observation_text(self, observation: Any, state: State) -> str:
        """What the model sees of an observation."""
        return self.render_observation(observation)

    def load_dataset(self) -> ProceduralTasks:
        """``num_tasks`` tasks, each a reset seed for the wrapped env, drawn from ``task_seed``."""
        return seed_tasks(self.num_tasks, self.task_seed)

    def default_rubric(self) -> Rubric:
        """One reward: the wrapped env's return over the episode (:func:`episode_return`)."""
        return Rubric([episode_return])

    # -- the game -----------------------------------------------------------------------------

    def make_gym_env(self, **extra_kwargs: Any) -> gym.Env:
        """Make (or take) the wrapped env and check that its actions match ``action_names``."""
        if isinstance(self.source, str):
            made = gym.make(self.source, **{**self.gym_kwargs, **extra_kwargs})
        elif isinstance(self.source, gym.Env):
            made = self.source
        else:
            made = self.source()
        space = made.action_space
        if not isinstance(space, gym.spaces.Discrete) or int(space.n) != len(self.action_names):
            expected = f"Discrete({len(self.action_names)})"
            raise EnvhubError(
                f"{self.name}: the wrapped env's action space is {space}; "
                f"expected {expected}, one action per name"
            )
        if made is not self.source:
            self._made.append(made)
        return made

    def parse_action(self, text: str) -> int | None:
        """The action a reply names: the last action name (any case) inside the last
        ``<action>...</action>``, else the last one anywhere in the reply; ``None`` if none."""
        tags = _ACTION_TAG.findall(text)
        found = self._action_pattern.findall(tags[-1] if tags else text)
        return self._action_index[found[-1].lower()] if found else None

    def format_prompt(self, task: dict[str, Any]) -> list[Message]:
        """The opening messages: only the system prompt, if there is one."""
        # The first observation is added by setup_state, once the wrapped env is reset.
        return [system(self.instructions)] if self.instructions else []

    async def setup_state(self, state: State) -> None:
        """Reset the wrapped env with the task's seed; its first observation ends the prompt.

        Raises:
            EnvhubError: The step rewards are unknown, or ``invalid_penalty`` pays too well.
        """
        gym_env = self.gym_env_for(state.task)
        if self._step_rewards is None:
            self._step_rewards = self._read_step_rewards(gym_env)
        # Read (and check) the charge now, so a bad setting fails at reset, not mid-episode.
        penalty = self.invalid_penalty
        observation, _ = gym_env.reset(seed=state.info.get("seed"))
        state.data.update(
            gym_env=gym_env, observation=observation, episode_return=0.0, invalid_penalty=penalty
        )
        first = user(self.observation_text(observation, state))
        state.prompt.append(first)
        state.messages.append(first)

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        """Step the wrapped env with the action the reply names and show the new observation.

        A reply that names no action is handled by :meth:`invalid_reply`. The wrapped env's
        ``terminated`` ends the episode and its ``truncated`` truncates it; its step rewards add
        up to the episode return.
        """
        action = self.parse_action(turn.message.content or "")
        if action is None:
            return self.invalid_reply(state)
        gym_env: gym.Env = state.data["gym_env"]
        observation, step_reward, terminated, truncated, _ = gym_env.step(
            int(gym_env.action_space.start) + action
        )
        state.data["observation"] = observation
        state.data["episode_return"] += float(step_reward)
        state.metrics["env_steps"] += 1
        if terminated:
            state.done = True
        elif truncated:
            state.truncate("env_truncated")
        return [user(self.observation_text(observation, state))]

    def invalid_reply(self, state: State) -> list[Message]:
        """Charge a reply that names no action ``invalid_penalty`` and answer with a hint.

        The wrapped env is left as it is; the reply counts in ``metrics["invalid_actions"]`` and
        a nonzero charge adds up in ``metrics["invalid_penalty"]``.
        """
        penalty = state.data["invalid_penalty"]
        state.metrics["invalid_actions"] += 1
        state.data["episode_return"] += penalty
        if penalty:
            state.metrics["invalid_penalty"] += penalty
        cost = f" (reward {penalty:g})" if penalty else ""
        names = ", ".join(self.action_names)
        return [
            user(
                f"That is not an action{cost}. Reply with one of: {names}, "
                f"e.g. <action>{self.action_names[0]}</action>."
            )
        ]

    def on_close(self) -> None:
        """Close the gym envs this env made (not one passed in as ``gym_env``)."""
        for made in self._made:
            made.close()
        self._made.clear()
        self._shared = None


def table_step_rewards(gym_env: gym.Env) -> tuple[float, float] | None:
    """Lowest and highest reward in a tabular env's transition table, gymnasium's toy-text
    ``P[state][action] = [(probability, next_state, reward, terminated), ...]``.

    ``None`` when the env has no such table, or is wrapped in anything but the wrappers
    ``gymnasium.make`` adds (another wrapper may change the rewards).
    """
    while isinstance(gym_env, gym.Wrapper):
        if type(gym_env) not in _MAKE_WRAPPERS:
            return None
        gym_env = gym_env.env
    table = getattr(gym_env, "P", None)
    try:
        rewards = [float(t[2]) for moves in table.values() for ts in moves.values() for t in ts]
    except (AttributeError, TypeError, IndexError, ValueError):
        return None  # P is a convention, not an API: a table of another shape is not read
    return (min(rewards), max(rewards)) if rewards else None


def _checked_penalty(penalty: float | None, lowest_step: float) -> float:
    worst = min(lowest_step, 0.0)
    if penalty is None:
        return worst
    if penalty > worst:
        raise EnvhubError(
            f"invalid_penalty {penalty:g} would make a reply that names no action pay better "
            f"than acting (a step can pay as little as {worst:g}); use at most {worst:g}"
        )
    return penalty


def _float_pair(pair: Sequence[float] | None) -> tuple[float, float] | None:
    return None if pair is None else (float(pair[0]), float(pair[1]))


def _checked_names(names: Sequence[str]) -> tuple[str, ...]:
    cleaned = tuple(str(n).strip() for n in names)
    if (
        not cleaned
        or any(not n for n in cleaned)
        or len({n.lower() for n in cleaned}) != len(cleaned)
    ):
        raise EnvhubError(
            f"action_names must be non-empty and distinct (ignoring case), got {list(names)}"
        )
    return cleaned


# -- FrozenLake -----------------------------------------------------------------------------

LAKE_ACTIONS = ("left", "down", "right", "up")
"""FrozenLake's actions, in its action-space order."""
_MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
_GRID_ROW = re.compile(r"^[SFHGP]( [SFHGP])*$")

LAKE_INSTRUCTIONS = (
    "You are crossing a frozen lake, drawn as a grid with the top row first. "
    "P is you, S the start, F safe ice, H a hole and G the goal. "
    "Reach G without stepping into a hole; moving into the edge leaves you where you are."
)


def draw_lake(lake: Sequence[str], position: int) -> str:
    """The map as rows of space-separated tiles, with ``P`` where the agent stands."""
    here = divmod(position, len(lake[0]))
    return "\n".join(
        " ".join("P" if (r, c) == here else tile for c, tile in enumerate(row))
        for r, row in enumerate(lake)
    )


LAKE_LEVELS = {"3x3": 3, "4x4": 4, "6x6": 6, "8x8": 8}
"""FrozenLake's difficulty levels (``level=``), easiest first: the side of the map (and so, by
default, the turns allowed, ``size * size``); the share of holes and the ice stay as given."""


def _lake_level(level: str | None, size: int | None) -> tuple[str | None, int]:
    """The level and the map's side from FrozenLake's arguments: ``level``'s, or ``size``
    (default 4) and the level of that side, if there is one.

    Raises:
        EnvhubError: An unknown level, or a level given with ``size``.
    """
    if level is None:
        size = 4 if size is None else size
        return next((n for n, side in LAKE_LEVELS.items() if side == size), None), size
    if level not in LAKE_LEVELS:
        raise EnvhubError(
            f"frozenlake: level must be one of {', '.join(LAKE_LEVELS)}, got {level!r}"
        )
    if size is not None:
        raise EnvhubError("frozenlake: give either level or size, not both")
    return level, LAKE_LEVELS[level]


def lake_tasks(
    size: int, frozen_probability: float, count: int, seed: int, level: str | None = None
) -> ProceduralTasks:
    """``count`` maps, each a pure function of (seed, index); every map has a path to the goal.
    ``level``, when given, is recorded in each task's ``info``."""
    from gymnasium.envs.toy_text.frozen_lake import generate_random_map

    def make_task(rng: random.Random) -> dict[str, Any]:
        lake = generate_random_map(size=size, p=frozen_probability, seed=rng.randrange(2**31))
        info = {"map": lake, "seed": rng.randrange(2**31)}
        return {"info": info if level is None else info | {"level": level}}

    return ProceduralTasks(f"frozenlake-{size}-{frozen_probability}", make_task, count, seed)


class FrozenLakeTextEnv(GymTextEnv):
    """FrozenLake in text: walk a 4x4 map to the goal without falling in a hole.

    Each task is a different random map (gymnasium's ``generate_random_map``, which
    guarantees a path). Reward: 1.0 for reaching the goal, else 0, plus ``invalid_penalty``
    (default 0: no step pays less) for each reply that names no move.

    Args:
        size: Side of the square map (default 4).
        frozen_probability: Chance that a tile is ice rather than a hole.
        is_slippery: Gymnasium's slippery ice (moves go astray 2 times in 3).
        num_tasks: Number of maps.
        task_seed: Seed of the maps (different seeds, different maps).
        max_turns: Turns allowed (default ``size * size``, enough for any shortest path).
        level: One of :data:`LAKE_LEVELS` (``"3x3"`` ... ``"8x8"``) instead of ``size``: the
            levels a training curriculum moves between.
        **kwargs: See :class:`GymTextEnv` (``invalid_penalty``) and :class:`~envhub.env.TaskEnv`
            (``rubric``, ``system_prompt``, ...).
    """

    name = "frozenlake"
    version = "0.1.0"
    default_max_turns = 16
    levels = tuple(LAKE_LEVELS)

    def __init__(
        self,
        size: int | None = None,
        frozen_probability: float = 0.8,
        is_slippery: bool = False,
        num_tasks: int = 1000,
        task_seed: int = 0,
        max_turns: int | None = None,
        level: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.level, size = _lake_level(level, size)
        self.size, self.frozen_probability, self.is_slippery = size, frozen_probability, is_slippery
        self._lake: tuple[tuple[str, ...], gym.Env] | None = None
        super().__init__(
            "FrozenLake-v1",
            LAKE_ACTIONS,
            instructions=LAKE_INSTRUCTIONS,
            gym_kwargs={"is_slippery": is_slippery},
            num_tasks=num_tasks,
            task_seed=task_seed,
            step_reward_range=(0.0, 1.0),
            max_turns=size * size if max_turns is None else max_turns,
            **kwargs,
        )
        if is_slippery or self.max_turns < size * size - 1:
            self.reference_policy = None  # the shortest path is no longer sure to arrive in time

    @property
    def reward_range(self) -> tuple[float, float]:
        """As given, else from ``max_turns`` invalid replies up to 1.0 (the only reward, the
        goal's, ends the episode)."""
        if self._reward_range is not None:
            return self._reward_range
        return (self.max_turns * self.invalid_penalty, 1.0)

    def load_dataset(self) -> ProceduralTasks:
        """``num_tasks`` random maps, each with a path to the goal, generated from ``task_seed``."""
        return lake_tasks(
            self.size, self.frozen_probability, self.num_tasks, self.task_seed, self.level
        )

    def gym_env_for(self, task: dict[str, Any]) -> gym.Env:
        """A FrozenLake env on the task's map, made anew (closing the last) when the map changes."""
        lake = tuple(task["info"]["map"])
        if self._lake is None or self._lake[0] != lake:
            if self._lake is not None:
                self._made.remove(self._lake[1])
                self._lake[1].close()
            self._lake = (lake, self.make_gym_env(desc=list(lake)))
        return self._lake[1]

    def observation_text(self, observation: Any, state: State) -> str:
        """The map with the agent on it, its row and column, and a fall or arrival if any."""
        lake = state.info["map"]
        row, col = divmod(int(observation), len(lake[0]))
        outcome = {"H": " You fell into a hole. Game over.", "G": " You reached the goal!"}.get(
            lake[row][col], ""
        )
        return (
            f"{draw_lake(lake, int(observation))}\n"
            f"You are at row {row + 1}, column {col + 1}.{outcome}"
        )

    def on_close(self) -> None:
        """Close the gym envs this env made, the current map's included."""
        super().on_close()
        self._lake = None


def read_lake(messages: list[Message]) -> list[str] | None:
    """The most recent map drawn in the conversation, as rows of tiles."""
    for message in reversed(messages):
        rows = [
            line.replace(" ", "")
            for line in (message.content or "").splitlines()
            if _GRID_ROW.match(line)
        ]
        if message.role != "assistant" and rows:
            return rows
    return None


def shortest_path(lake: Sequence[str]) -> list[str]:
    """Moves of a shortest path from ``P`` to ``G`` around the holes (breadth-first search)."""
    cells = {(r, c): tile for r, row in enumerate(lake) for c, tile in enumerate(row)}
    start = next(cell for cell, tile in cells.items() if tile == "P")
    came_from: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cells[cell] == "G":
            return _walk_back(came_from, cell)
        for move, (dr, dc) in _MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if cells.get(nxt, "H") != "H" and nxt not in came_from:
                came_from[nxt] = (cell, move)
                queue.append(nxt)
    return []


def _walk_back(
    came_from: dict[tuple[int, int], tuple[tuple[int, int], str] | None], cell: tuple[int, int]
) -> list[str]:
    moves = []
    while (step := came_from[cell]) is not None:
        cell, move = step
        moves.append(move)
    return moves[::-1]


def shortest_path_policy(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Takes the first move of a shortest path on the latest map in the conversation."""
    lake = read_lake(messages)
    moves = shortest_path(lake) if lake else []
    return f"<action>{moves[0]}</action>" if moves else "I see no way to the goal."


FrozenLakeTextEnv.reference_policy = staticmethod(shortest_path_policy)
