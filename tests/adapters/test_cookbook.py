"""envhub envs as tinker cookbook envs (envhub.adapters.cookbook), driven by scripted tokens:
observations are the cookbook renderer's rendering of the env's messages, sampled tokens
reach the env as the renderer parses them (tool calls included), rewards are the env's own.
tests/adapters/test_cookbook_training.py runs the cookbook's RL loop on them."""

from __future__ import annotations

import asyncio
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tinker_cookbook")
chz = pytest.importorskip("chz")

import envhub  # noqa: E402
from envhub.adapters.cookbook import (  # noqa: E402
    EnvhubDatasetBuilder,
    EnvhubEnv,
    continue_tokens,
    make_env,
)
from envhub.adapters.cookbook.messages import opening, to_cookbook  # noqa: E402
from envhub.errors import EnvhubError, EnvNotFoundError  # noqa: E402
from envhub.types import user  # noqa: E402

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir: Path) -> Any:
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    return get_tokenizer(str(smollm2_dir))


def renderer(name: str, tokenizer: Any, smollm2_dir: Path) -> Any:
    from tinker_cookbook import renderers

    return renderers.get_renderer(name, tokenizer, model_name=str(smollm2_dir))


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def own_reward(name: str, args: dict[str, Any], task: int, turns: list[str]) -> float:
    """The env's own total for these turns, played straight into it."""
    with envhub.make(name, **args) as env:
        env.reset(options={"task_index": task})
        total = 0.0
        for text in turns:
            _, reward, terminated, truncated, _ = env.step(text)
            total += reward
        assert terminated or truncated
    return total


def test_single_turn_observation_and_reward_are_the_envs(tokenizer, smollm2_dir) -> None:
    role_colon = renderer("role_colon", tokenizer, smollm2_dir)
    args, task = {"difficulty": "tiny"}, 3
    with envhub.make("arithmetic", **args) as plain:
        messages, _ = plain.reset(options={"task_index": task})
        answer = plain.state.task["answer"]
    episode = EnvhubEnv(lambda: make_env("arithmetic", args), role_colon, 7, {"task_index": task})
    observation, stop = run(episode.initial_observation())
    expected = role_colon.build_generation_prompt([to_cookbook(m) for m in messages])
    assert observation.to_ints() == expected.to_ints()
    assert stop == ["\n\nUser:"]
    action = encode(tokenizer, f" \\boxed{{{answer}}}\n\nUser:")
    result = run(episode.step(action, extra={"stop_reason": "stop"}))
    assert result.episode_done and result.next_observation.length == 0
    assert result.reward == own_reward("arithmetic", args, task, [f"\\boxed{{{answer}}}"]) == 1.1
    assert result.metrics == {
        "parse_error": 0.0, "reward/correct": 1.0, "reward/format": 1.0, "errors": 0.0,
        "stop/completed": 1.0,
    }  # fmt: skip
    assert result.logs == {"assistant": f"\\boxed{{{answer}}}", "finish_reason": "stop",
                           "seed": 7, "task_index": task}  # fmt: skip
    assert episode.env is not None and episode.env._closed


def test_a_truncated_turn_is_scored_by_the_env(tokenizer, smollm2_dir) -> None:
    role_colon = renderer("role_colon", tokenizer, smollm2_dir)
    episode = EnvhubEnv(lambda: make_env("arithmetic", {}), role_colon, 0, {"task_index": 0})
    run(episode.initial_observation())
    result = run(episode.step(encode(tokenizer, " \\boxed{12"), extra={"stop_reason": "length"}))
    assert result.episode_done and result.reward == own_reward("arithmetic", {}, 0, ["\\boxed{12"])
    assert result.metrics["parse_error"] == 1.0 and result.metrics["length_stopped_turns"] == 1.0


def test_tool_calls_as_the_renderer_parses_them(tokenizer, smollm2_dir) -> None:
    """qwen3_instruct (ChatML, which SmolLM2's tokenizer has) shows the tools its own way and
    parses the call; the env runs it; the episode stays one token sequence."""
    qwen = renderer("qwen3_instruct", tokenizer, smollm2_dir)
    with envhub.make("calculator") as plain:
        plain.reset(options={"task_index": 5})
        expression, answer = plain.state.task["info"]["expression"], plain.state.task["answer"]
    episode = EnvhubEnv(lambda: make_env("calculator", {}), qwen, 1, {"task_index": 5})
    observation, stop = run(episode.initial_observation())
    text = tokenizer.decode(observation.to_ints())
    assert "You are provided with function signatures" in text and '"name": "calculate"' in text
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert stop == [end]
    call = {"name": "calculate", "arguments": {"expression": expression}}
    action = encode(tokenizer, f"<tool_call>\n{json.dumps(call)}\n</tool_call>") + [end]
    first = run(episode.step(action, extra={"stop_reason": "stop"}))
    assert not first.episode_done and first.reward == 0.0
    assert json.loads(first.logs["tool_calls"])[0]["function"]["name"] == "calculate"
    following = first.next_observation.to_ints()
    assert following[: observation.length + len(action)] == observation.to_ints() + action
    assert first.metrics["token_exact"] == 1.0
    rest = tokenizer.decode(following[observation.length + len(action) :])
    reply = f"<tool_response>\n{answer}\n</tool_response>"
    assert rest == f"\n<|im_start|>user\n{reply}<|im_end|>\n<|im_start|>assistant\n"
    final = run(episode.step(encode(tokenizer, f"\\boxed{{{answer}}}") + [end]))
    assert final.episode_done and final.reward == 1.0
    assert final.metrics["tool_calls"] == 1.0 and final.metrics["reward/correct"] == 1.0


def test_role_colon_tools_go_in_envhubs_format_and_the_turn_is_re_rendered(
    tokenizer, smollm2_dir
) -> None:
    """role_colon has no tool format: the tools are listed in envhub's, which the env's own
    parser reads from the turn's text; its stop string ``\\n\\nUser:`` is sampled before a
    tool's reply, so the next observation is the renderer's, not an extension."""
    role_colon = renderer("role_colon", tokenizer, smollm2_dir)
    episode = EnvhubEnv(lambda: make_env("calculator", {}), role_colon, 1, {"task_index": 5})
    observation, _ = run(episode.initial_observation())
    assert "<tool_call>" in tokenizer.decode(observation.to_ints())
    call = {"name": "calculate", "arguments": {"expression": "2 + 3"}}
    action = encode(tokenizer, f" <tool_call>\n{json.dumps(call)}\n</tool_call>\n\nUser:")
    result = run(episode.step(action, extra={"stop_reason": "stop"}))
    assert not result.episode_done and result.metrics["token_exact"] == 0.0
    assert (
        result.next_observation.to_ints()
        == role_colon.build_generation_prompt(episode.history).to_ints()
    )
    reply = episode.history[-1]
    assert (reply["role"], reply["content"], reply["name"]) == ("tool", "5", "calculate")
    assert reply["tool_call_id"] == episode.env.state.messages[-1].tool_call_id


def test_sampled_tokens_stay_when_only_their_tokenization_differs(tokenizer, smollm2_dir) -> None:
    qwen = renderer("qwen3_instruct", tokenizer, smollm2_dir)
    episode = EnvhubEnv(lambda: make_env("guess-number", {}), qwen, 2, {"task_index": 0})
    observation, _ = run(episode.initial_observation())
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    action = [t for ch in "I guess 50." for t in encode(tokenizer, ch)] + [end]
    assert action[:-1] != encode(tokenizer, "I guess 50.")  # one token per character
    result = run(episode.step(action))
    rendered = qwen.build_generation_prompt(episode.history).to_ints()
    following = result.next_observation.to_ints()
    assert following != rendered and tokenizer.decode(following) == tokenizer.decode(rendered)
    assert following[: observation.length + len(action)] == observation.to_ints() + action
    assert result.metrics["token_exact"] == 1.0


def test_continue_tokens_gives_up_on_a_renderer_without_the_extension_property(
    tokenizer, smollm2_dir
) -> None:
    qwen3 = renderer("qwen3", tokenizer, smollm2_dir)  # strips earlier turns' thinking
    assert not qwen3.has_extension_property
    previous, action, rendered = [1, 2], [3, 4], [1, 2, 9, 9, 5]
    assert continue_tokens(qwen3, previous, action, rendered) == (rendered, False)
    assert continue_tokens(qwen3, previous, action, [1, 2, 3, 4, 5]) == ([1, 2, 3, 4, 5], True)


def build(*flags: str) -> Any:
    blueprint = chz.Blueprint(EnvhubDatasetBuilder)
    return blueprint.make_from_argv(list(flags))


def test_the_builder_from_a_command_line_groups_one_task(smollm2_dir) -> None:
    builder = build(
        "env=arithmetic", 'env_args={"difficulty": "tiny", "num_tasks": 5}',
        f"model_name_for_tokenizer={smollm2_dir}", "renderer_name=role_colon",
        "batch_size=3", "group_size=2", "n_batches=4", "seed=1",
    )  # fmt: skip
    dataset, test = run(builder())
    assert test is None and len(dataset) == 4 and sorted(dataset.order) == [0, 1, 2, 3, 4]
    batches = [dataset.get_batch(i) for i in range(2)]
    tasks = [group.task_index for batch in batches for group in batch]
    assert tasks == [dataset.order[i % 5] for i in range(6)]
    group = pickle.loads(pickle.dumps(batches[0][0]))  # the cookbook may ship it to a worker
    envs = run(group.make_envs())
    assert len(envs) == 2 and {e.options["task_index"] for e in envs} == {tasks[0]}
    assert envs[0].seed != envs[1].seed
    observations = [run(e.initial_observation())[0].to_ints() for e in envs]
    assert observations[0] == observations[1]
    run(group.cleanup())
    assert all(e.env._closed for e in envs) and group.logging_tags() == ["arithmetic"]


def test_bad_builder_settings_say_what_to_fix(smollm2_dir) -> None:
    common = [f"model_name_for_tokenizer={smollm2_dir}", "renderer_name=role_colon",
              "group_size=2", "n_batches=1"]  # fmt: skip
    with pytest.raises(EnvhubError, match="env_args must be a JSON object"):
        run(build("env=arithmetic", "env_args=difficulty=tiny", "batch_size=1", *common)())
    with pytest.raises(EnvNotFoundError, match="arithmetic"):
        run(build("env=arithmetc", "batch_size=1", *common)())
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        build("env=arithmetic", "batch_size=0", *common)


def test_opening_without_tools_is_the_messages(tokenizer, smollm2_dir) -> None:
    role_colon = renderer("role_colon", tokenizer, smollm2_dir)
    assert opening(role_colon, [user("Hi")], None) == [{"role": "user", "content": "Hi"}]


def test_a_harness_env_through_the_renderer(tokenizer, smollm2_dir) -> None:
    """calculator-agent is an OpenAI Agents SDK program: the renderer shows the tools the
    program sends, the call it parses reaches the program, which runs it and asks again."""
    pytest.importorskip("agents")
    qwen = renderer("qwen3_instruct", tokenizer, smollm2_dir)
    with envhub.make("calculator-agent") as plain:
        task = plain.dataset[5]
    episode = EnvhubEnv(lambda: make_env("calculator-agent", {}), qwen, 1, {"task_index": 5})
    observation, _ = run(episode.initial_observation())
    assert '"name": "calculate"' in tokenizer.decode(observation.to_ints())
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    call = {"name": "calculate", "arguments": {"expression": task["info"]["expression"]}}
    action = encode(tokenizer, f"<tool_call>\n{json.dumps(call)}\n</tool_call>") + [end]
    first = run(episode.step(action))
    assert not first.episode_done and first.metrics["token_exact"] == 1.0
    assert tokenizer.decode(first.next_observation.to_ints()).endswith(
        f"<tool_response>\n{task['answer']}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    final = run(episode.step(encode(tokenizer, f"\\boxed{{{task['answer']}}}") + [end]))
    assert final.episode_done and final.reward == 1.0
    assert (final.metrics["tool_calls"], final.metrics["prefix_breaks"]) == (1.0, 0.0)


def test_a_harbor_task_through_the_renderer(tokenizer, smollm2_dir) -> None:
    """A Harbor task folder (examples/harbor/hello-file) in a bubblewrap session: the
    renderer's parsed call runs the env's file tool, and the task's tests pay the reward."""
    import os

    from envhub.harbor.env import HarborEnv
    from envhub.sandbox import LocalSandbox, bwrap_problem

    if bwrap_problem() is not None or os.geteuid() != 0:
        pytest.skip("local sessions need bubblewrap and root")
    examples = Path(__file__).resolve().parents[2] / "examples" / "harbor"
    qwen = renderer("qwen3_instruct", tokenizer, smollm2_dir)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    arguments = {"path": "/sandbox/hello.txt", "file_text": "Hello, world!\n"}
    call = f"<tool_call>\n{json.dumps({'name': 'create', 'arguments': arguments})}\n</tool_call>"
    with LocalSandbox(base_uid=61590, max_concurrency=1, warm=0) as sandbox:
        episode = EnvhubEnv(lambda: HarborEnv(examples, sandbox=sandbox), qwen, 0,
                            {"task_index": 1})  # fmt: skip
        observation, _ = run(episode.initial_observation())
        assert "hello.txt" in tokenizer.decode(observation.to_ints())
        first = run(episode.step(encode(tokenizer, call) + [end]))
        assert not first.episode_done and first.metrics["token_exact"] == 1.0
        final = run(episode.step(encode(tokenizer, "done") + [end]))
    assert final.episode_done and final.reward == 1.0 and final.metrics["tool_calls"] == 1.0
