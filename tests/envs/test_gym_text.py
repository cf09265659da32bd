"""The gymnasium text adapter, and FrozenLake played through it."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import pytest
from gymnasium.wrappers import TimeLimit, TransformReward

from envhub.checks.checker import check_env
from envhub.envs.gym_text import (
    LAKE_LEVELS,
    FrozenLakeTextEnv,
    GymTextEnv,
    lake_tasks,
    read_lake,
    shortest_path,
    shortest_path_policy,
    table_step_rewards,
)
from envhub.errors import EnvhubError
from envhub.types import assistant, user

CLASSIC = ["SFFF", "FHFH", "FFFH", "HFFG"]
CLASSIC_TASK = {"info": {"map": CLASSIC, "seed": 0}}


class Corridor(gym.Env):
    """Cells 0..length-1; action 1 walks right, 0 walks left; reward 1 at the last cell."""

    def __init__(self, length: int = 4) -> None:
        self.length = length
        self.action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.spaces.Discrete(length)
        self.reset_seeds: list[int | None] = []
        self.closed = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[int, dict]:
        super().reset(seed=seed)
        self.reset_seeds.append(seed)
        self.position = 0
        return 0, {}

    def step(self, action: int) -> tuple[int, float, bool, bool, dict]:
        self.position = max(0, self.position + (1 if action == 1 else -1))
        at_end = self.position == self.length - 1
        return self.position, float(at_end), at_end, False, {}

    def close(self) -> None:
        self.closed = True


def corridor_env(gym_env: Any, **kwargs: Any) -> GymTextEnv:
    return GymTextEnv(
        gym_env,
        ["back", "forward"],
        render_observation=lambda cell: f"You are in cell {cell}.",
        instructions="Walk to the end.",
        step_reward_range=(0.0, 1.0),
        **kwargs,
    )


def play(env: GymTextEnv, *actions: str) -> list[tuple[str, float, bool, bool]]:
    out = []
    for action in actions:
        observation, reward, terminated, truncated, _ = env.step(action)
        out.append((observation[0].content, reward, terminated, truncated))
    return out


# -- FrozenLake -----------------------------------------------------------------------------


def test_a_walk_to_the_goal_on_the_classic_map() -> None:
    env = FrozenLakeTextEnv()
    prompt, _ = env.reset(seed=0, options={"task": CLASSIC_TASK})
    assert [m.role for m in prompt] == ["system", "user"]
    assert prompt[0].content.endswith(
        "Actions: left, down, right, up. "
        "Each turn, reply with one action inside <action></action>, e.g. <action>left</action>."
    )
    assert prompt[1].content == "P F F F\nF H F H\nF F F H\nH F F G\nYou are at row 1, column 1."
    steps = play(
        env,
        "down",
        "<action>Down</action>",
        "I'll go RIGHT",
        "jump!",
        "<action>right</action>",
        "down",
        "right",
    )
    assert steps == [
        ("S F F F\nP H F H\nF F F H\nH F F G\nYou are at row 2, column 1.", 0.0, False, False),
        ("S F F F\nF H F H\nP F F H\nH F F G\nYou are at row 3, column 1.", 0.0, False, False),
        ("S F F F\nF H F H\nF P F H\nH F F G\nYou are at row 3, column 2.", 0.0, False, False),
        (
            "That is not an action. "
            "Reply with one of: left, down, right, up, e.g. <action>left</action>.",
            0.0,
            False,
            False,
        ),
        ("S F F F\nF H F H\nF F P H\nH F F G\nYou are at row 3, column 3.", 0.0, False, False),
        ("S F F F\nF H F H\nF F F H\nH F P G\nYou are at row 4, column 3.", 0.0, False, False),
        (
            "S F F F\nF H F H\nF F F H\nH F F P\nYou are at row 4, column 4. You reached the goal!",
            1.0,
            True,
            False,
        ),
    ]
    assert dict(env.state.metrics) == {"invalid_actions": 1, "env_steps": 6}
    assert env.state.reward_components == {"return": 1.0}


def test_falling_in_a_hole_ends_the_episode_with_nothing() -> None:
    env = FrozenLakeTextEnv()
    env.reset(seed=0, options={"task": CLASSIC_TASK})
    assert play(env, "left", "right", "down") == [
        (
            "P F F F\nF H F H\nF F F H\nH F F G\nYou are at row 1, column 1.",
            0.0,
            False,
            False,
        ),  # into the edge
        ("S P F F\nF H F H\nF F F H\nH F F G\nYou are at row 1, column 2.", 0.0, False, False),
        (
            "S F F F\nF P F H\nF F F H\nH F F G\n"
            "You are at row 2, column 2. You fell into a hole. Game over.",
            0.0,
            True,
            False,
        ),
    ]
    assert env.state.stop_reason == "terminated"


def test_only_invalid_replies_run_out_the_turns() -> None:
    env = FrozenLakeTextEnv()
    env.reset(seed=0, options={"task": CLASSIC_TASK})
    outcome = play(env, *["I don't know"] * 16)
    assert outcome[-1][1:] == (0.0, False, True)
    assert dict(env.state.metrics) == {"invalid_actions": 16}
    assert env.state.stop_reason == "max_turns"


def test_maps_vary_by_task_and_always_have_a_path() -> None:
    assert lake_tasks(4, 0.8, 10, 0)[0] == {
        "info": {"map": ["SFFH", "FFFF", "FFFF", "HFFG"], "seed": 865820368}
    }
    tasks = lake_tasks(4, 0.8, 200, 0)
    maps = [tuple(t["info"]["map"]) for t in tasks]
    assert len(set(maps)) == 141  # with 80% ice, light maps repeat (all ice: 0.8**14, about 4%)
    for lake in maps:
        assert lake[0][0] == "S" and lake[3][3] == "G" and all(len(row) == 4 for row in lake)
        path = shortest_path(["P" + lake[0][1:], *lake[1:]])
        assert 6 <= len(path) <= 15
    env = FrozenLakeTextEnv()
    env.reset(seed=1, options={"task_index": 0})
    first = env.state.prompt[-1].content
    env.reset(seed=2, options={"task_index": 0})
    assert (
        env.state.prompt[-1].content
        == first
        == "P F F H\nF F F F\nF F F F\nH F F G\nYou are at row 1, column 1."
    )


def test_shortest_path_goes_around_holes() -> None:
    assert shortest_path(["PFH", "FHF", "FFG"]) == ["down", "down", "right", "right"]
    assert shortest_path(["PH", "HG"]) == []
    messages = [
        user("F P\nH G\nYou are at row 1, column 2."),
        assistant("<action>left</action>"),
        user("That is not an action."),
    ]
    assert read_lake(messages) == ["FP", "HG"]
    assert shortest_path_policy(messages, None) == "<action>down</action>"


def test_reference_policy_only_where_it_is_sure_to_win() -> None:
    assert FrozenLakeTextEnv().reference_policy is shortest_path_policy
    assert FrozenLakeTextEnv(is_slippery=True).reference_policy is None
    assert FrozenLakeTextEnv(max_turns=10).reference_policy is None
    assert FrozenLakeTextEnv(size=5).max_turns == 25


def test_slippery_lake_is_reproducible_under_the_task_seed() -> None:
    def walk(seed: int) -> list[str]:
        env = FrozenLakeTextEnv(is_slippery=True)
        env.reset(seed=seed, options={"task_index": 3})
        return [text for text, *_ in play(env, *["right", "down"] * 3)]

    assert walk(0) == walk(1)


# -- the generic adapter ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("forward", 1),
        ("FORWARD!", 1),
        ("<action> Back </action>", 0),
        ("not back but forward", 1),
        ("<action>forward</action> ... or back", 1),
        ("forwards", None),
        ("<action>jump</action> forward", None),
        ("", None),
    ],
)
def test_parse_action(text: str, action: int | None) -> None:
    assert corridor_env(Corridor()).parse_action(text) == action


def test_a_factory_env_is_reset_with_the_task_seed_and_closed_with_the_env() -> None:
    made: list[Corridor] = []

    def factory() -> Corridor:
        made.append(Corridor())
        return made[-1]

    env = corridor_env(factory, num_tasks=5, task_seed=1)
    seed = env.dataset[2]["info"]["seed"]
    for episode_seed in (0, 1):
        prompt, _ = env.reset(seed=episode_seed, options={"task_index": 2})
        assert [m.content for m in prompt] == [
            "Walk to the end.\n\nActions: back, forward. Each turn, reply with one action "
            "inside <action></action>, e.g. <action>back</action>.",
            "You are in cell 0.",
        ]
    assert play(env, "forward", "back", "forward", "forward", "forward") == [
        ("You are in cell 1.", 0.0, False, False),
        ("You are in cell 0.", 0.0, False, False),
        ("You are in cell 1.", 0.0, False, False),
        ("You are in cell 2.", 0.0, False, False),
        ("You are in cell 3.", 1.0, True, False),
    ]
    assert len(made) == 1 and made[0].reset_seeds == [seed, seed]
    env.close()
    assert made[0].closed


def test_an_instance_is_used_but_not_closed() -> None:
    corridor = Corridor()
    env = corridor_env(corridor)
    env.reset(seed=0, options={"task_index": 0})
    env.close()
    assert corridor.reset_seeds == [env.dataset[0]["info"]["seed"]] and not corridor.closed


def test_the_wrapped_env_truncating_truncates_the_episode() -> None:
    env = corridor_env(lambda: TimeLimit(Corridor(length=10), max_episode_steps=2))
    env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step("forward")
    assert (terminated, truncated) == (False, False)
    observation, reward, terminated, truncated, info = env.step("forward")
    assert (observation[0].content, reward, terminated, truncated) == (
        "You are in cell 2.",
        0.0,
        False,
        True,
    )
    assert info["stop_reason"] == "env_truncated"


def test_a_gymnasium_id_with_make_kwargs() -> None:
    env = GymTextEnv(
        "FrozenLake-v1",
        ["left", "down", "right", "up"],
        gym_kwargs={"is_slippery": False},
        reward_range=(0.0, 1.0),
    )
    env.reset(seed=0)
    assert [c for c, *_ in play(env, "right")] == ["1"]  # the default rendering is str()


def test_action_names_must_fit_the_action_space() -> None:
    with pytest.raises(EnvhubError, match="Discrete\\(3\\)"):
        GymTextEnv(Corridor(), ["a", "b", "c"]).reset(seed=0)
    with pytest.raises(EnvhubError, match="Discrete\\(2\\)"):
        GymTextEnv("Pendulum-v1", ["a", "b"]).reset(seed=0)
    with pytest.raises(EnvhubError, match="distinct"):
        GymTextEnv(Corridor(), ["go", "GO"])


# -- replies that name no action, on gymnasium's own toy-text envs ---------------------------

CLIFF = ["up", "right", "down", "left"]
TAXI = ["south", "north", "east", "west", "pickup", "dropoff"]
LAKE = ["left", "down", "right", "up"]
BLACKJACK = ["stick", "hit"]


def cliff_env(**kwargs: Any) -> GymTextEnv:
    return GymTextEnv("CliffWalking-v1", CLIFF, **kwargs)


@pytest.mark.parametrize(
    ("make", "step_rewards", "penalty", "reward_range"),
    [
        (cliff_env, (-100.0, -1.0), -100.0, (-2000.0, 0.0)),
        (lambda: GymTextEnv("Taxi-v4", TAXI), (-10.0, 20.0), -10.0, (-200.0, 400.0)),
        (lambda: GymTextEnv("FrozenLake-v1", LAKE), (0.0, 1.0), 0.0, (0.0, 20.0)),
        (
            lambda: GymTextEnv("Blackjack-v1", BLACKJACK, step_reward_range=(-1.0, 1.0)),
            (-1.0, 1.0),
            -1.0,
            (-20.0, 20.0),
        ),
        (lambda: FrozenLakeTextEnv(invalid_penalty=-0.5), (0.0, 1.0), -0.5, (-8.0, 1.0)),
    ],
    ids=["CliffWalking-v1", "Taxi-v4", "FrozenLake-v1", "Blackjack-v1", "frozenlake-charged"],
)
def test_toy_text_envs_pass_check_env_with_never_acting_at_the_floor(
    make: Any,
    step_rewards: tuple[float, float],
    penalty: float,
    reward_range: tuple[float, float],
) -> None:
    env = make()
    assert (env.step_reward_range, env.invalid_penalty, env.reward_range) == (
        step_rewards,
        penalty,
        reward_range,
    )
    report = check_env(env)  # raises, listing the failures, unless every check passes
    floor = next(r for r in report.results if r.name == "null policy at floor")
    assert floor.detail == str(reward_range[0])


def test_never_acting_scores_below_the_optimal_cliff_walk_and_ties_the_worst() -> None:
    env = cliff_env()
    env.reset(seed=0)
    steps = play(env, *["I'd rather not say."] * 20)
    assert steps[0] == (
        "That is not an action (reward -100). "
        "Reply with one of: up, right, down, left, e.g. <action>up</action>.",
        0.0,
        False,
        False,
    )
    assert steps[-1][1:] == (-2000.0, False, True)
    assert dict(env.state.metrics) == {"invalid_actions": 20, "invalid_penalty": -2000.0}

    env.reset(seed=0)
    optimal = play(env, "up", *["right"] * 11, "down")
    assert [reward for _, reward, *_ in optimal] == [0.0] * 12 + [-13.0]
    assert optimal[-1][2:] == (True, False)

    env.reset(seed=0)  # stepping off the cliff every turn: the worst an acting policy can do
    assert play(env, *["right"] * 20)[-1][1:] == (-2000.0, False, True)


def test_an_invalid_reply_costs_the_worst_step_and_leaves_the_env_as_it_was() -> None:
    env = cliff_env()
    env.reset(seed=0)
    steps = play(env, "up", "hmm", *["right"] * 11, "down")
    assert (steps[1][1], steps[2][0], steps[-1][1:]) == (0.0, "25", (-113.0, True, False))
    assert env.state.data["invalid_penalty"] == -100.0
    assert dict(env.state.metrics) == {
        "invalid_actions": 1,
        "invalid_penalty": -100.0,
        "env_steps": 13,
    }
    assert env.state.reward_components == {"return": -113.0}


def test_taxi_never_acting_scores_below_wandering() -> None:
    env = GymTextEnv("Taxi-v4", TAXI)
    env.reset(seed=0)
    assert play(env, *[""] * 20)[-1][1] == -200.0
    env.reset(seed=0)
    assert play(env, *["north"] * 20)[-1][1] == -20.0


def test_the_step_rewards_are_read_from_the_transition_table() -> None:
    assert table_step_rewards(gym.make("CliffWalking-v1")) == (-100.0, -1.0)
    assert table_step_rewards(gym.make("Taxi-v4")) == (-10.0, 20.0)
    assert table_step_rewards(gym.make("FrozenLake-v1", map_name="8x8")) == (0.0, 1.0)
    assert table_step_rewards(gym.make("Blackjack-v1")) is None  # no table P
    doubled = TransformReward(gym.make("CliffWalking-v1"), lambda r: 2 * r)
    assert table_step_rewards(doubled) is None  # the table no longer tells the rewards


def test_unknown_step_rewards_fail_at_reset_and_name_the_fix() -> None:
    env = GymTextEnv("Blackjack-v1", BLACKJACK)
    with pytest.raises(EnvhubError) as error:
        env.reset(seed=0)
    assert str(error.value) == (
        "gym-text: cannot tell the lowest reward one step of Blackjack-v1 can give (it has no "
        "transition table P, or a wrapper may change its rewards), and a reply that names no "
        "action must cost at least that much; pass step_reward_range=(lowest, highest), "
        "e.g. (-1.0, 1.0)"
    )


def test_a_penalty_that_pays_better_than_acting_is_refused() -> None:
    message = (
        "invalid_penalty 0 would make a reply that names no action pay better than acting "
        "(a step can pay as little as -100); use at most -100"
    )
    with pytest.raises(EnvhubError) as error:
        cliff_env(invalid_penalty=0.0).reset(seed=0)
    assert str(error.value) == message
    with pytest.raises(EnvhubError, match="use at most -1$"):
        GymTextEnv(Corridor(), ["back", "forward"], step_reward_range=(-1, 1), invalid_penalty=-0.5)
    with pytest.raises(EnvhubError, match="use at most 0$"):
        GymTextEnv(Corridor(), ["back", "forward"], step_reward_range=(1, 2), invalid_penalty=0.5)


def test_a_harsher_penalty_lowers_the_floor() -> None:
    env = cliff_env(invalid_penalty=-150.0, max_turns=4)
    assert env.reward_range == (-600.0, 0.0)
    env.reset(seed=0)
    assert play(env, "", "", "", "")[-1][1] == -600.0


# -- FrozenLake's levels --------------------------------------------------------------------


def test_frozenlake_levels_set_the_side_of_the_map_and_the_turns() -> None:
    assert FrozenLakeTextEnv.levels == ("3x3", "4x4", "6x6", "8x8")
    envs = {level: FrozenLakeTextEnv(level=level, num_tasks=3) for level in LAKE_LEVELS}
    assert {lv: (e.size, e.max_turns, e.current_level()) for lv, e in envs.items()} == {
        "3x3": (3, 9, "3x3"), "4x4": (4, 16, "4x4"), "6x6": (6, 36, "6x6"), "8x8": (8, 64, "8x8"),
    }  # fmt: skip
    assert envs["3x3"].dataset[0]["info"] == {
        "map": ["SFH", "FFH", "FFG"], "seed": 382160277, "level": "3x3",
    }  # fmt: skip
    assert envs["6x6"].dataset[0]["info"]["map"] == [
        "SFFFFH", "HFFFFF", "FFHFFF", "FHFFFH", "FHFFHF", "FFFFFG",
    ]  # fmt: skip
    # The default is the level 4x4, map for map (the maps are as they were before levels).
    default = FrozenLakeTextEnv(num_tasks=3)
    assert default.current_level() == "4x4"
    assert [t["info"] for t in default.dataset] == [t["info"] for t in envs["4x4"].dataset]
    assert default.dataset[0]["info"] == {
        "map": ["SFFH", "FFFF", "FFFF", "HFFG"], "seed": 865820368, "level": "4x4",
    }  # fmt: skip
    # A side that is no level plays as before, with no level recorded.
    five = FrozenLakeTextEnv(size=5, num_tasks=1)
    assert five.current_level() is None and set(five.dataset[0]["info"]) == {"map", "seed"}


def test_frozenlake_levels_refuse_bad_arguments() -> None:
    with pytest.raises(EnvhubError, match="level must be one of 3x3, 4x4, 6x6, 8x8, got '5x5'"):
        FrozenLakeTextEnv(level="5x5")
    with pytest.raises(EnvhubError, match="either level or size"):
        FrozenLakeTextEnv(level="3x3", size=3)


@pytest.mark.parametrize("level", ["3x3", "8x8"])
def test_frozenlake_levels_pass_check_env_with_the_shortest_path_at_the_top(level: str) -> None:
    with FrozenLakeTextEnv(level=level, num_tasks=5) as env:
        report = check_env(env)
        assert report.passed, report.failures
        assert next(r.detail for r in report.results if r.name == "reference policy at top") == (
            "1.0"
        )
