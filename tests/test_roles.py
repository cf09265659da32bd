"""The multi-role SDK: a match's bookkeeping, fixed policies, and what check_env holds a
multi-role env to."""

from __future__ import annotations

from typing import Any

import pytest

from envhub.checks.checker import check_env
from envhub.errors import ConfigError, EnvhubError
from envhub.roles import Match, MultiRoleEnv, load_fixed_policy, role_totals_problem
from envhub.types import AssistantTurn, system, user


class Echo(MultiRoleEnv):
    """Two roles; ``a`` speaks, ``b`` answers, three turns each; each turn pays ``pay``."""

    name = "echo-roles"
    roles = ("a", "b")
    reward_range = (-3.0, 3.0)

    def __init__(self, pay: dict[str, float] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pay = pay or {"a": 1.0, "b": -1.0}

    def setup(self, match: Match) -> None:
        match.tell("a", system("You are a."), user("Speak."))
        match.tell("b", system("You are b."))
        match.to_move = "a"

    def play(self, match: Match, actor: str, turn: AssistantTurn) -> None:
        other = "b" if actor == "a" else "a"
        match.pay(actor, self.pay[actor])
        if match.turn >= 6:
            match.end({"a": "done", "b": "done"})
            return
        match.tell(other, user(f"{actor} said {turn.message.content}"))
        match.to_move = other


class ZeroSumEcho(Echo):
    reward_mode = "zero_sum"


def test_turns_views_labels_and_rewards() -> None:
    env = Echo()
    observation, info = env.reset(seed=0)
    assert info["to_move"] == "a" and [m.content for m in observation] == ["You are a.", "Speak."]
    assert all(m.actor is None for m in observation)  # told during setup: nobody's turn
    observation, reward, terminated, truncated, info = env.step("hi")
    assert info["to_move"] == "b" and reward == 1.0 and info["role_rewards"] == {"a": 1.0}
    assert [(m.content, m.actor) for m in observation] == [("You are b.", None), ("a said hi", "a")]
    assert not terminated and not truncated
    for text in ("yo", "x", "y", "z", "w"):
        observation, reward, terminated, truncated, info = env.step(text)
    assert terminated and observation == [] and info["to_move"] is None
    assert info["role_results"] == {"a": "done", "b": "done"}
    assert env.match.rewards == {"a": 3.0, "b": -3.0}
    assert [(m.role, m.actor) for m in env.match.views["b"]][-2:] == [
        ("user", "a"),
        ("assistant", "b"),
    ]
    assert "== a" in env.render() and "[assistant] w" in env.render()
    with pytest.raises(EnvhubError, match="has ended"):
        env.step("again")


def test_max_turns_truncates() -> None:
    env = Echo(max_turns=2)
    env.reset(seed=0)
    env.step("1")
    *_, terminated, truncated, info = env.step("2")
    assert (terminated, truncated, info["stop_reason"]) == (False, True, "max_turns")


def test_a_fixed_role_is_played_by_the_env() -> None:
    env = Echo(policies={"b": lambda messages, rng: f"heard {len(messages)}"})
    observation, info = env.reset(seed=0)
    assert info["to_move"] == "a" and env.trained_roles == ("a",)
    observation, reward, *_, info = env.step("hi")
    # b (fixed) answered inside the step: a sees b's reply, labelled as b's doing.
    assert info["to_move"] == "a" and [(m.content, m.actor) for m in observation] == [
        ("b said heard 2", "b")
    ]
    assert reward == 1.0 and info["role_rewards"] == {"a": 1.0, "b": -1.0}


def test_fixed_policy_names_and_errors() -> None:
    shipped = {"wall": lambda messages, rng: "no"}
    assert load_fixed_policy("wall", shipped) is shipped["wall"]
    assert load_fixed_policy("envhub.testing:null_policy", {}).__name__ == "null_policy"
    with pytest.raises(ConfigError, match="name one the env ships \\(wall\\)"):
        load_fixed_policy("door", shipped)
    with pytest.raises(ConfigError, match="cannot load fixed policy 'envhub.testing:nope'"):
        load_fixed_policy("envhub.testing:nope", shipped)


def test_a_match_that_ends_before_the_policy_moves_is_an_error() -> None:
    class Ends(Echo):
        def setup(self, match: Match) -> None:
            match.end({"a": "done"})

    with pytest.raises(EnvhubError, match="ended before the policy had a turn"):
        Ends().reset(seed=0)


def test_role_totals_problems() -> None:
    env = ZeroSumEcho()
    assert role_totals_problem(env, {"a": 1.0, "b": -1.0}, failed=False) is None
    assert "sum to 2.0" in role_totals_problem(env, {"a": 1.0, "b": 1.0}, failed=False)
    assert role_totals_problem(env, {"a": 1.0, "b": 1.0}, failed=True) is None
    assert "outside its role's range" in role_totals_problem(env, {"a": 4.0}, failed=False)


def test_check_env_passes_a_good_multi_role_env_and_names_a_broken_zero_sum() -> None:
    good = ZeroSumEcho(pay={"a": -1.0, "b": 1.0})  # the first mover's empty turns: its floor
    assert check_env(good).passed
    report = check_env(ZeroSumEcho(), raise_on_failure=False)
    [floor] = [r for r in report.results if r.name == "null policy at floor"]
    assert not floor.passed and "scored 3.0 as a, who moved first" in floor.detail
    report = check_env(ZeroSumEcho(pay={"a": 1.0, "b": 1.0}), raise_on_failure=False)
    [episodes] = [r for r in report.results if r.name == "episodes"]
    assert not episodes.passed and "reward_mode is zero_sum" in episodes.detail
