"""Gymnasium envs with discrete actions, played in text; FrozenLake as the built-in example.

:class:`GymTextEnv` wraps any gymnasium env whose action space is ``Discrete``. The model
sees each observation rendered as text and replies with the name of an action; the reply is
read leniently (see :meth:`GymTextEnv.parse_action`). A reply that names no action gets a hint,
counts in ``metrics["invalid_actions"]`` and uses up the turn without stepping the wrapped
env. The wrapped env's ``terminated`` ends the episode and its ``truncated`` truncates it
(``stop_reason="env_truncated"``); the reward is the wrapped env's return.

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

from envhub.env import State
from envhub.envs.procedural import ProceduralTasks
from envhub.errors import EnvhubError
from envhub.multiturn import MultiTurnEnv
from envhub.rewards.rubric import Rubric, reward
from envhub.types import AssistantTurn, Message, system, user

GymSource = str | gym.Env | Callable[[], gym.Env]
_ACTION_TAG = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)


@reward(name="return")
def episode_return(state: State) -> float:
    """The wrapped env's total reward over the episode."""
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
        reward_range: Bounds of the wrapped env's return over one episode.
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
        reward_range: tuple[float, float] = (0.0, 1.0),
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
        self.reward_range = (float(reward_range[0]), float(reward_range[1]))
        self._shared: gym.Env | None = None
        self._made: list[gym.Env] = []
        if kwargs.get("system_prompt") is None:
            kwargs["system_prompt"] = self.build_instructions(instructions)
        super().__init__(**kwargs)

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
        """Reset the wrapped env with the task's seed; its first observation ends the prompt."""
        gym_env = self.gym_env_for(state.task)
        observation, _ = gym_env.reset(seed=state.info.get("seed"))
        state.data.update(gym_env=gym_env, observation=observation, episode_return=0.0)
        first = user(self.observation_text(observation, state))
        state.prompt.append(first)
        state.messages.append(first)

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        """Step the wrapped env with the action the reply names and show the new observation.

        A reply that names no action gets a hint, counts in ``metrics["invalid_actions"]`` and
        leaves the wrapped env as it is. The wrapped env's ``terminated`` ends the episode and
        its ``truncated`` truncates it; its step rewards add up to the episode return.
        """
        action = self.parse_action(turn.message.content or "")
        if action is None:
            state.metrics["invalid_actions"] += 1
            names = ", ".join(self.action_names)
            return [
                user(
                    f"That is not an action. Reply with one of: {names}, "
                    f"e.g. <action>{self.action_names[0]}</action>."
                )
            ]
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

    def on_close(self) -> None:
        """Close the gym envs this env made (not one passed in as ``gym_env``)."""
        for made in self._made:
            made.close()
        self._made.clear()
        self._shared = None


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


def lake_tasks(size: int, frozen_probability: float, count: int, seed: int) -> ProceduralTasks:
    """``count`` maps, each a pure function of (seed, index); every map has a path to the goal."""
    from gymnasium.envs.toy_text.frozen_lake import generate_random_map

    def make_task(rng: random.Random) -> dict[str, Any]:
        lake = generate_random_map(size=size, p=frozen_probability, seed=rng.randrange(2**31))
        return {"info": {"map": lake, "seed": rng.randrange(2**31)}}

    return ProceduralTasks(f"frozenlake-{size}-{frozen_probability}", make_task, count, seed)


class FrozenLakeTextEnv(GymTextEnv):
    """FrozenLake in text: walk a 4x4 map to the goal without falling in a hole.

    Each task is a different random map (gymnasium's ``generate_random_map``, which
    guarantees a path). Reward: 1.0 for reaching the goal, else 0.

    Args:
        size: Side of the square map.
        frozen_probability: Chance that a tile is ice rather than a hole.
        is_slippery: Gymnasium's slippery ice (moves go astray 2 times in 3).
        num_tasks: Number of maps.
        task_seed: Seed of the maps (different seeds, different maps).
        max_turns: Turns allowed (default ``size * size``, enough for any shortest path).
        **kwargs: See :class:`~envhub.env.TaskEnv` (``rubric``, ``system_prompt``, ...).
    """

    name = "frozenlake"
    version = "0.1.0"
    default_max_turns = 16

    def __init__(
        self,
        size: int = 4,
        frozen_probability: float = 0.8,
        is_slippery: bool = False,
        num_tasks: int = 1000,
        task_seed: int = 0,
        max_turns: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.size, self.frozen_probability, self.is_slippery = size, frozen_probability, is_slippery
        self._lake: tuple[tuple[str, ...], gym.Env] | None = None
        super().__init__(
            "FrozenLake-v1",
            LAKE_ACTIONS,
            instructions=LAKE_INSTRUCTIONS,
            gym_kwargs={"is_slippery": is_slippery},
            num_tasks=num_tasks,
            task_seed=task_seed,
            reward_range=(0.0, 1.0),
            max_turns=size * size if max_turns is None else max_turns,
            **kwargs,
        )
        if is_slippery or self.max_turns < size * size - 1:
            self.reference_policy = None  # the shortest path is no longer sure to arrive in time

    def load_dataset(self) -> ProceduralTasks:
        """``num_tasks`` random maps, each with a path to the goal, generated from ``task_seed``."""
        return lake_tasks(self.size, self.frozen_probability, self.num_tasks, self.task_seed)

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
