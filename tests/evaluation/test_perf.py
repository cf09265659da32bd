"""``envhub.evaluation.perf``: the performance numbers of an env, measured on the built-in envs.

Timings are only checked for sanity and order (a timed test that asserts speed is flaky); the
counts, the policy, its rewards, the structure and the formatting are checked exactly.
"""

from __future__ import annotations

import platform

import pytest

import envhub
from envhub.errors import EnvhubError
from envhub.evaluation.perf import (
    Machine,
    Performance,
    SandboxStart,
    env_sandbox,
    format_ms,
    format_rate,
    machine,
    machine_line,
    measure,
    measure_target,
    percentile,
    spread_index,
    summary,
)
from envhub.sandbox import bwrap_problem

BUILTIN = sorted(name for name, spec in envhub.list_envs().items() if spec.distribution == "envhub")
SANDBOXED = ["code", "code-fix", "repo-repair"]
NO_BWRAP = bwrap_problem()
EPISODES = 6


def _sane(performance: Performance) -> None:
    assert set(performance) == set(Performance.__annotations__)
    assert performance["step_p99_ms"] >= performance["step_p50_ms"] > 0
    assert performance["reset_p50_ms"] > 0 and performance["episodes_per_s"] > 0
    assert performance["cpu_ms_per_episode"] > 0 and performance["peak_rss_mb"] > 0


@pytest.mark.parametrize("name", BUILTIN)
def test_measure_plays_the_scripted_policy_for_exactly_the_episodes_asked(name: str) -> None:
    if name in SANDBOXED and NO_BWRAP:
        pytest.skip(f"the code envs run code in bubblewrap: {NO_BWRAP}")
    with envhub.make(name) as env:
        performance = measure(env, min_episodes=EPISODES, max_episodes=EPISODES)
        low, high = env.reward_range
        scripted = env.reference_policy is not None
    _sane(performance)
    assert performance["episodes"] == EPISODES
    assert performance["policy"] == ("reference" if scripted else "null")
    # The reference policy solves every task; the empty reply scores the floor.
    assert performance["mean_reward"] == (high if scripted else low)
    # one step an episode: single turn, or a multi-role env whose first empty move ends it
    if name in ("arithmetic", "gsm8k", "code", "setter-solver", "tic-tac-toe"):
        assert performance["steps"] == EPISODES
    else:
        assert performance["steps"] > EPISODES
    if name in SANDBOXED:
        start = performance["sandbox"]
        assert start is not None and set(start) == set(SandboxStart.__annotations__)
        assert start["backend"] == "local" and start["cold_start_ms"] > 0
        assert start["warm_start_ms"] > 0
    else:
        assert performance["sandbox"] is None


def test_a_spent_budget_stops_after_the_fewest_episodes() -> None:
    with envhub.make("arithmetic") as env:
        performance = measure(env, min_episodes=2, max_episodes=1000, budget_s=0.0)
    assert (performance["episodes"], performance["steps"]) == (2, 2)


def test_an_episode_that_does_not_end_is_an_error() -> None:
    with envhub.make("guess-number") as env, pytest.raises(EnvhubError) as error:
        measure(env, max_steps=1)
    assert (
        str(error.value) == "guess-number: the episode (seed 0, task 0) did not end within 1 steps"
    )


def test_env_sandbox_is_the_env_s_own_or_none() -> None:
    from envhub.envs.code import CodeEnv
    from envhub.sandbox import LocalSandbox

    assert env_sandbox(envhub.make("arithmetic")) is None
    if NO_BWRAP:
        pytest.skip(f"no bubblewrap here: {NO_BWRAP}")
    from envhub.rewards.code import default_sandbox

    own = LocalSandbox()
    assert env_sandbox(CodeEnv(sandbox=own)) is own
    assert env_sandbox(CodeEnv()) is default_sandbox()


def test_measure_target_measures_in_a_fresh_interpreter() -> None:
    performance = measure_target("envhub.envs.arithmetic:ArithmeticEnv")
    _sane(performance)
    assert performance["policy"] == "reference" and performance["mean_reward"] == 1.1
    assert 3 <= performance["episodes"] <= 200 and performance["sandbox"] is None
    with pytest.raises(EnvhubError) as error:
        measure_target("envhub.envs.arithmetic:NoSuchEnv")
    assert str(error.value).startswith(
        "measuring envhub.envs.arithmetic:NoSuchEnv failed: envhub.errors.EnvLoadError: cannot load"
    )


def test_spread_index_covers_the_dataset_from_the_first_episode_on() -> None:
    assert [spread_index(k, 20) for k in range(10)] == [0, 10, 5, 15, 2, 12, 7, 17, 1, 11]
    assert [spread_index(k, 1) for k in range(3)] == [0, 0, 0]


def test_percentile_is_the_nearest_rank() -> None:
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert [percentile(values, q) for q in (0, 50, 99, 100)] == [1.0, 3.0, 5.0, 5.0]
    assert percentile([float(i) for i in range(1, 201)], 99) == 198.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_machine_describes_this_machine() -> None:
    here = machine()
    assert set(here) == set(Machine.__annotations__)
    assert here["python"] == platform.python_version() and here["envhub"] == envhub.__version__
    assert here["cores"] >= 1 and here["ram_gb"] > 0 and here["cpu"]


PERFORMANCE = Performance(
    policy="reference", episodes=200, steps=200, mean_reward=1.0, episodes_per_s=6780.0,
    reset_p50_ms=0.0767, step_p50_ms=0.0371, step_p99_ms=0.211, cpu_ms_per_episode=0.143,
    peak_rss_mb=57.6, sandbox=None,
)  # fmt: skip
MACHINE = Machine(
    cpu="AMD EPYC", cores=2, ram_gb=23.5, os="Linux 6.1.0", python="3.11.7", envhub="0.1.0"
)


def test_the_numbers_read_in_their_units() -> None:
    assert summary(PERFORMANCE) == (
        "6780 episodes/s, step p50 37.1 µs / p99 211 µs (200 episodes, reference policy)"
    )
    sandboxed = {**PERFORMANCE, "sandbox": SandboxStart(backend="local", cold_start_ms=29.1,
                                                        warm_start_ms=24.6)}  # fmt: skip
    assert summary(sandboxed) == (
        "6780 episodes/s, step p50 37.1 µs / p99 211 µs, sandbox cold start 29.1 ms "
        "(200 episodes, reference policy)"
    )
    assert machine_line(MACHINE) == (
        "AMD EPYC, 2 cores, 23.5 GiB RAM, Linux 6.1.0, Python 3.11.7, envhub 0.1.0"
    )
    assert [format_ms(ms) for ms in (0.0371, 1.0, 35.3, 999.0, 1500.0)] == [
        "37.1 µs", "1 ms", "35.3 ms", "999 ms", "1.5 s",
    ]  # fmt: skip
    assert [format_rate(r) for r in (6780.0, 100.0, 24.04, 0.42)] == ["6780", "100", "24", "0.42"]
