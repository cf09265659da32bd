"""The tinker cookbook's RL recipe trains on envhub envs against envhub's training service.

``rl_basic``'s own entry (``main`` on the config its blueprint makes from command-line flags,
which runs the cookbook's loop ``tinker_cookbook.rl.train.main``), with its dataset swapped by
flag for envhub.adapters.cookbook's builder, against the service in this process, SmolLM2 on
the CPU: every episode the recipe logged is the env's own (its task, its group), its rewards
are what the env pays for the same turns, its first observation is the renderer's rendering
of the env's prompt. bench/cookbook_envhub.py runs the recipe as its own process, longer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tinker")
pytest.importorskip("tinker_cookbook")
pytest.importorskip("chz")

import envhub  # noqa: E402
from envhub.types import AssistantTurn, FunctionCall, ToolCall, assistant  # noqa: E402
from tests.trainer.service.serving import Running  # noqa: E402

pytestmark = pytest.mark.model

SERVED_AS = "meta-llama/Llama-3.2-1B"
"""A name the cookbook knows (bench/cookbook_recipes.py says why SmolLM2 is served as it)."""
GROUPS, GROUP_SIZE = 2, 2


@pytest.fixture(scope="module")
def service(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    from tinker_cookbook import tokenizer_utils
    from transformers import AutoTokenizer

    # the cookbook loads its models' tokenizers by name from the Hub; here, SmolLM2's
    tokenizer_utils.register_tokenizer(
        SERVED_AS, lambda: AutoTokenizer.from_pretrained(smollm2_dir)
    )
    running = Running(tmp_path_factory.mktemp("state"), models=(f"{SERVED_AS}={smollm2_dir}",))
    yield running
    running.stop()
    tokenizer_utils.unregister_tokenizer(SERVED_AS)


def rl_basic(service: Running, log: Path, env: str, args: dict[str, Any], renderer: str,
             steps: int, max_tokens: int) -> list[dict]:  # fmt: skip
    """Run rl_basic's entry on these flags; its metrics per step."""
    from tinker_cookbook.recipes import rl_basic as recipe

    builder = "dataset_builder"
    flags = [
        f"base_url={service.url}", f"log_path={log}",
        f"{builder}=envhub.adapters.cookbook:EnvhubDatasetBuilder", f"{builder}.env={env}",
        f"{builder}.env_args={json.dumps(args)}", f"{builder}.renderer_name={renderer}",
        f"{builder}.model_name_for_tokenizer={SERVED_AS}", f"{builder}.batch_size={GROUPS}",
        f"{builder}.group_size={GROUP_SIZE}", f"{builder}.n_batches={steps}",
        f"max_tokens={max_tokens}", "lora_rank=8", "learning_rate=1e-4", "eval_every=0",
        "save_every=0",
    ]  # fmt: skip
    recipe.main(recipe.build_config_blueprint(SERVED_AS).make_from_argv(flags))
    return [json.loads(line) for line in (log / "metrics.jsonl").read_text().splitlines()]


def replay(env_name: str, args: dict[str, Any], steps: list[dict]) -> list[tuple[float, bool]]:
    """Play the logged turns into a fresh env, reset as the episode was: each step's reward
    and whether the episode ended."""
    first = steps[0]["logs"]
    out = []
    with envhub.make(env_name, **args) as env:
        env.reset(seed=first["seed"], options={"task_index": first["task_index"]})
        for step in steps:
            logs = step["logs"]
            calls = [ToolCall(id=c["id"], function=FunctionCall(**c["function"]))
                     for c in json.loads(logs.get("tool_calls", "[]"))]  # fmt: skip
            message = assistant(logs["assistant"], calls)
            turn = AssistantTurn(message=message, num_tokens=step["ac_len"],
                                 finish_reason=logs["finish_reason"])  # fmt: skip
            _, reward, terminated, truncated, _ = env.step(turn)
            out.append((reward, terminated or truncated))
    return out


def prompt_length(env_name: str, args: dict[str, Any], renderer_name: str, task: int,
                  seed: int, tokenizer_dir: Path) -> int:  # fmt: skip
    """The renderer's rendering of the env's prompt, in tokens."""
    from tinker_cookbook import renderers
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    from envhub.adapters.cookbook.messages import opening

    renderer = renderers.get_renderer(renderer_name, get_tokenizer(str(tokenizer_dir)))
    with envhub.make(env_name, **args) as env:
        messages, info = env.reset(seed=seed, options={"task_index": task})
        history = opening(renderer, messages, info.get("tools") or env.tool_schemas)
    return renderer.build_generation_prompt(history).length


ENV, ARGS, RENDERER = "guess-number", {"level": "1-10", "max_turns": 2}, "qwen3_instruct"
"""A multi-turn env whose every episode is two turns, whatever the model writes (a wrong
guess gets a hint, the second turn ends it), each a few tokens; qwen3_instruct is ChatML,
SmolLM2's own format. bench/cookbook_envhub.py runs arithmetic and the calculator's tools."""
STEPS, MAX_TOKENS = 1, 4


def test_rl_basic_trains_on_a_multi_turn_envhub_env(
    service: Running, smollm2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TINKER_API_KEY", service.settings.api_key)
    metrics = rl_basic(service, tmp_path / "log", ENV, ARGS, RENDERER, STEPS, MAX_TOKENS)
    trained = [m["progress/batch"] for m in metrics if "env/all/reward/total" in m]
    assert trained == list(range(STEPS))
    for step in range(STEPS):
        path = tmp_path / "log" / f"iteration_{step:06d}" / "train_rollout_summaries.jsonl"
        episodes = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(episodes) == GROUPS * GROUP_SIZE
        for episode in episodes:
            turns = episode["steps"]
            assert episode["tags"] == [ENV] and len(turns) == 2 and turns[1]["episode_done"]
            played = replay(ENV, ARGS, turns)
            assert [(s["reward"], s["episode_done"]) for s in turns] == played
            assert episode["total_reward"] == sum(r for r, _ in played)
            first = turns[0]["logs"]
            assert turns[0]["ob_len"] == prompt_length(
                ENV, ARGS, RENDERER, first["task_index"], first["seed"], smollm2_dir
            )
            if turns[0]["logs"]["finish_reason"] == "stop":  # ended by <|im_end|>: one sequence
                assert turns[0]["metrics"]["token_exact"] == 1.0
                assert turns[1]["ob_len"] > turns[0]["ob_len"] + turns[0]["ac_len"]
        by_group: dict[int, set[int]] = {}
        for episode in episodes:
            first = episode["steps"][0]["logs"]
            by_group.setdefault(episode["group_idx"], set()).add(first["task_index"])
        assert len(by_group) == GROUPS and all(len(t) == 1 for t in by_group.values())
        mean = sum(e["total_reward"] for e in episodes) / len(episodes)
        logged = next(m for m in metrics if m.get("progress/batch") == step)
        assert logged["env/all/reward/total"] == pytest.approx(mean)
