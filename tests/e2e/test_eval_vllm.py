"""End to end: `envhub eval` against a real `vllm serve` of SmolLM2-135M-Instruct on 127.0.0.1.

Besides the CLI's own output, every saved trajectory is checked against the server: the prompt
tokens are the server's rendering of the prompt, and (where no drift was recorded) the whole
token record is an exact prefix of the server's rendering of the final conversation.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import pytest

from envhub.evaluation import summarize
from envhub.inference.openai_http import _wire_message
from envhub.rollout.io import read_trajectories
from envhub.tools.prompt import with_tools_in_system

pytestmark = [pytest.mark.vllm, pytest.mark.model]


def run_cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envhub.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def render(server, messages, tools, add_generation_prompt: bool, *, as_seen: bool = True):
    """The server's tokens for ``messages``. SmolLM2's template ignores ``tools``, so with
    ``as_seen`` they go where the model saw them: in the system prompt (envhub.tools.prompt)."""
    if tools and as_seen:
        messages, tools = with_tools_in_system(messages, tools), None
    body = {
        "model": "smollm2",
        "messages": [_wire_message(m, for_template=True) for m in messages],
        "add_generation_prompt": add_generation_prompt,
        "add_special_tokens": False,
    }
    if tools:
        body["tools"] = tools
    return httpx.post(f"{server.base_url}/tokenize", json=body, timeout=60).json()["tokens"]


def detokenize(server, ids: list[int]) -> str:
    return httpx.post(
        f"{server.base_url}/detokenize", json={"model": "smollm2", "tokens": ids}, timeout=60
    ).json()["prompt"]


def sampled_runs(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of policy tokens."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def check_token_contract(server, trajectory) -> None:
    """Context tokens are the server's own rendering of the conversation; each sampled segment
    decodes exactly to its turn's text. (A sampled segment need not be the canonical
    tokenisation of its text: models sample non-canonical splits, and those are what we train
    on. Only where a later prompt is rendered does that count as drift.)"""
    ids, mask, logprobs = trajectory.token_ids, trajectory.loss_mask, trajectory.sampler_logprobs
    assert ids is not None and len(ids) == len(mask) == len(logprobs)
    prompt = trajectory.messages[: trajectory.prompt_length]
    assert ids[: trajectory.prompt_token_count] == render(server, prompt, trajectory.tools, True)
    assert (
        sum(mask)
        == trajectory.num_completion_tokens
        == sum(t.completion_tokens for t in trajectory.turns)
    )
    assert all(lp <= 0.0 for lp, m in zip(logprobs, mask, strict=True) if m) and all(
        lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m
    )
    runs = sampled_runs(mask)
    replies = [m for m in trajectory.completion if m.role == "assistant"]
    assert len(runs) == len(replies) == len(trajectory.turns)
    for (start, end), reply, turn in zip(runs, replies, trajectory.turns, strict=True):
        assert detokenize(server, ids[start:end]) == reply.content + (
            "<|im_end|>" if turn.finish_reason == "stop" else ""
        )
    if not trajectory.token_drift:
        last_turn = runs[-1][0]
        assert (
            render(server, trajectory.messages, trajectory.tools, False)[:last_turn]
            == ids[:last_turn]
        )


def eval_and_load(server, tmp_path, env: str, *extra: str):
    out = tmp_path / env
    result = run_cli(
        "eval",
        env,
        "-u",
        f"{server.base_url}/v1",
        "-m",
        "smollm2",
        "-o",
        str(out),
        "--seed",
        "3",
        *extra,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    trajectories = read_trajectories(out / "trajectories.jsonl")
    saved = json.loads((out / "summary.json").read_text())
    recomputed = summarize(trajectories, saved["pass_threshold"]).model_dump(mode="json")
    for key in (
        "episodes",
        "reward_mean",
        "components",
        "pass_at",
        "tool_calls",
        "turns_mean",
        "stop_reasons",
        "token_drift_episodes",
    ):
        assert saved[key] == recomputed[key], key
    return result, trajectories, json.loads((out / "config.json").read_text())


def test_eval_tool_env_against_vllm(vllm_server, tmp_path):
    result, trajectories, config = eval_and_load(
        vllm_server, tmp_path, "calculator", "-n", "4", "-r", "2", "--max-tokens", "96"
    )
    assert "pass@2" in result.stdout and "valid tool calls" in result.stdout
    assert "tools: 1 tool(s) in the system prompt: the chat template ignores" in result.stdout
    assert len(trajectories) == 8 and config["mode"] == "tokens" and len(config["tasks"]) == 4
    # streamed as groups finish, so in completion order; every (group, sample) exactly once
    assert sorted((t.group_id, t.sample_index) for t in trajectories) == [
        (f"g{i}", s) for i in range(4) for s in range(2)
    ]
    assert len({t.task_index for t in trajectories}) == 4
    for t in trajectories:
        assert t.env.name == "calculator" and t.env.version == "0.1.0"
        assert not t.errors and t.tools[0]["function"]["name"] == "calculate"
        check_token_contract(vllm_server, t)
    # What a user saw: the server's template renders the prompt the same with or without tools;
    # the prompt the model got lists the calculate schema.
    prompt = trajectories[0].messages[: trajectories[0].prompt_length]
    ignored = render(vllm_server, prompt, trajectories[0].tools, True, as_seen=False)
    assert ignored == render(vllm_server, prompt, None, True)
    seen = detokenize(vllm_server, trajectories[0].token_ids[: trajectories[0].prompt_token_count])
    assert '<tools>\n{"type": "function", "function": {"name": "calculate"' in seen


def test_eval_multi_turn_env_against_vllm(vllm_server, tmp_path):
    _, trajectories, _ = eval_and_load(
        vllm_server, tmp_path, "guess-number", "-n", "3", "-r", "2", "--max-tokens", "24"
    )
    assert (
        max(len(t.turns) for t in trajectories) > 1
    )  # the game answers and the model guesses again
    for t in trajectories:
        assert len(t.turns) == sum(m.role == "assistant" for m in t.messages)
        check_token_contract(vllm_server, t)


def test_eval_serve_starts_and_stops_its_own_server(require_vllm, tiny_model_dir, tmp_path):
    # The tiny model starts in a minute; SmolLM2 (served by the session fixture) takes about three.
    out = tmp_path / "served"
    result = run_cli(
        "eval",
        "arithmetic",
        "--serve",
        "-m",
        str(tiny_model_dir),
        "-n",
        "2",
        "-r",
        "1",
        "--max-tokens",
        "32",
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(read_trajectories(out / "trajectories.jsonl")) == 2
    # Not a terminal (no spinner): the start is still never silent.
    started = r"^starting vLLM for \S+ at http://127\.0\.0\.1:\d+ \(log: "
    assert re.search(started, result.stderr, re.M)
    assert re.search(r"^vLLM ready after \d+ s$", result.stderr, re.M)
    leftover = subprocess.run(
        ["pgrep", "-f", f"served-model-name {tiny_model_dir}"], capture_output=True, text=True
    )
    assert leftover.stdout.strip() == "", "the vLLM server outlived `envhub eval --serve`"


def test_doctor_finds_smollm2_template_prefix_safe(vllm_server):
    result = run_cli("doctor", "-u", vllm_server.base_url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 turn boundaries checked" in result.stdout
    assert "tools: the chat template ignores `tools`; envhub lists them" in result.stdout


def test_serve_with_a_model_that_cannot_load_fails_clearly(require_vllm, tmp_path):
    missing = tmp_path / "no-such-model"
    missing.mkdir()  # a config of an architecture nobody has: vLLM exits while starting
    (missing / "config.json").write_text('{"model_type": "no-such-architecture"}')
    result = run_cli(
        "eval", "arithmetic", "--serve", "-m", str(missing), "-n", "1", "-r", "1", timeout=600
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-2].startswith("vLLM did not start; its full log: "), result.stderr[-2000:]
    assert lines[-1] == (
        f"error: model {str(missing)!r} is of type 'no-such-architecture', which neither this "
        "vLLM nor its Transformers knows — check the model folder's config.json, or upgrade "
        "transformers and vllm if the architecture is new"
    )
    assert "Traceback" not in result.stderr
