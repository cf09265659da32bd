"""The GEM adapter against GEM's own offline game envs (gem-llm): the same episodes as GEM's,
the env contract, the runner, and random state kept apart from the process's."""

from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

pytest.importorskip("gem")

import envhub  # noqa: E402
from envhub.adapters.gem import _import_gem, list_envs  # noqa: E402
from envhub.errors import EnvNotFoundError  # noqa: E402
from envhub.rollout.runner import RolloutRunner  # noqa: E402
from envhub.testing import ByteChatTokenizer, ScriptedEngine  # noqa: E402
from envhub.types import Message  # noqa: E402

GAMES = ["game:GuessTheNumber-v0-easy", "game:Mastermind-v0-easy", "game:Minesweeper-v0-easy"]
ACTIONS = ["\\boxed{3}", "\\boxed{7}", "\\boxed{1 2}", "[2 3]", "\\boxed{5}", "\\boxed{9}"]


def gem_episode(env_id: str, seed: int) -> list[tuple[Any, ...]]:
    """GEM itself, driven directly (it seeds the process's generators)."""
    env = _import_gem().make(env_id)
    text, _ = env.reset(seed=seed)
    seen: list[tuple[Any, ...]] = [(text,)]
    for action in ACTIONS:
        text, reward, terminated, truncated, _ = env.step(action)
        seen.append((text, reward, terminated, truncated))
        if terminated or truncated:
            break
    return seen


def adapted_episode(env: envhub.Env, seed: int) -> list[tuple[Any, ...]]:
    [prompt], _ = env.reset(seed=seed)
    seen: list[tuple[Any, ...]] = [(prompt.content,)]
    for action in ACTIONS:
        [reply], reward, terminated, truncated, _ = env.step(action)
        assert reply.role == "user"
        seen.append((reply.content, reward, terminated, truncated))
        if terminated or truncated:
            break
    return seen


@pytest.mark.parametrize("env_id", GAMES)
@pytest.mark.parametrize("seed", [0, 5])
def test_the_adapter_plays_the_same_episodes_as_gem(env_id: str, seed: int) -> None:
    env = envhub.make(f"gem:{env_id}")
    assert (env.name, env.version) == (f"gem:{env_id}", "0.1.0")
    ours = adapted_episode(env, seed)
    assert ours == gem_episode(env_id, seed)
    assert len(ours) > 1


def test_adapted_envs_keep_their_random_state_apart() -> None:
    """Minesweeper lays its mines on the first step, from the process's generators: two
    adapted games stepped in turn each play as GEM alone would, and leave the process's
    streams as they were."""
    env_id, clicks = "game:Minesweeper-v0-easy", ["\\boxed{reveal 2 2}", "\\boxed{reveal 0 0}"]
    alone = []
    for seed in (1, 2):
        game = _import_gem().make(env_id)
        game.reset(seed=seed)
        alone.append([game.step(click)[0] for click in clicks])
    random.seed(123)
    np.random.seed(123)
    expected = (random.random(), np.random.random())
    random.seed(123)
    np.random.seed(123)
    first, second = envhub.make(f"gem:{env_id}"), envhub.make(f"gem:{env_id}")
    first.reset(seed=1), second.reset(seed=2)
    ours: list[list[str]] = [[], []]
    for click in clicks:
        for episode, env in zip(ours, (first, second), strict=True):
            episode.append(env.step(click)[0][0].content)
    assert ours == alone and alone[0] != alone[1]
    assert (random.random(), np.random.random()) == expected


def test_unseeded_adapted_envs_draw_different_games() -> None:
    texts = set()
    for _ in range(6):
        env = envhub.make("gem:game:GuessTheNumber-v0-random")
        texts.add(env.reset()[0][0].content)
    assert len(texts) > 1


@pytest.mark.parametrize("env_id", ["game:GuessTheNumber-v0-easy", "game:Mastermind-v0-easy"])
def test_check_env_passes_on_gem_games(env_id: str) -> None:
    report = envhub.check_env(envhub.make(f"gem:{env_id}"))
    assert report.passed, report.failures


def bisect(messages: list[Message], tools: Any) -> str:
    """Guess the number by halving the range the hints leave."""
    prompt = next(m.content for m in messages if m.role == "user")
    low, high = map(int, re.search(r"between (\d+) and (\d+)", prompt).groups())
    for message in messages:
        hint = re.search(r"guessed (\d+), and the target number is (higher|lower)", message.content)
        if hint and hint[2] == "higher":
            low = int(hint[1]) + 1
        elif hint:
            high = int(hint[1]) - 1
    return f"My guess: \\boxed{{{(low + high) // 2}}}"


def test_the_runner_plays_gem_games_with_a_scripted_policy() -> None:
    engine = ScriptedEngine(bisect, ByteChatTokenizer())
    make = lambda: envhub.make("gem:game:GuessTheNumber-v0-easy", system_prompt="Play.")  # noqa: E731
    runner = RolloutRunner(engine, make, max_concurrency=2, seed=11)
    trajectories = asyncio.run(runner.run([0, 1, 2], samples_per_task=2))
    assert [(t.outcome, t.reward, t.terminated) for t in trajectories] == [("ok", 1.0, True)] * 6
    assert all(1 <= len(t.turns) <= 4 for t in trajectories)
    assert trajectories[0].messages[0].role == "system"
    assert "Congratulations!" in trajectories[0].messages[-1].content


def test_gem_names_list_and_fail_clearly() -> None:
    listed = list_envs()
    assert listed["game:GuessTheNumber-v0-easy"] == (
        "GEM GuessTheNumberEnv(min_number=1, max_number=10, max_turns=4)"
    )
    assert listed["game:Wordle-v0-easy"].endswith("(downloads nltk's word list)")
    assert listed["math:GSM8K"].endswith("(downloads its data set)")
    assert "gem:game:Mastermind-v0-easy" in envhub.adapters.list_adapted()
    with pytest.raises(EnvNotFoundError, match="did you mean game:GuessTheNumber-v0-easy"):
        envhub.make("gem:game:GuessTheNumber-v0-esay")
    env = envhub.make("gem:game:GuessTheNumber-v0-easy", max_turns=2)
    assert env.gem_env.max_turns == 2
    with pytest.raises(envhub.errors.EnvhubError, match="call reset"):
        env.step("\\boxed{1}")


def test_import_envhub_imports_no_framework() -> None:
    probe = (
        "import json, sys, envhub, envhub.adapters; envhub.adapters.split_adapted('gem:x');"
        "print(json.dumps(sorted(m for m in ('gem', 'openenv', 'reasoning_gym') "
        "if m in sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert json.loads(result.stdout) == [], result.stderr
