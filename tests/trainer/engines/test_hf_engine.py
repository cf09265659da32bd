"""HFEngine and HFChatTokenizer: exact tokens, logprobs against a forward pass, batching, seeds,
and the real rollout runner on built-in envs, with a tiny random Llama and SmolLM2's tokenizer."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest

import envhub
from envhub.errors import EngineError
from envhub.inference.base import ChatTokenizer, GenerateRequest, Generation, SamplingParams
from envhub.rollout.runner import RolloutRunner
from envhub.types import Message, ToolCall, assistant, system, user

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from envhub.trainer.engines import HFChatTokenizer, HFEngine  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> Any:
    """The tiny Llama with weights drawn wider than its init: its next-token distributions are
    then peaked and differ by context (at init they are near uniform and greedy repeats one
    token), so greedy paths are informative and free of near-ties."""
    model = transformers.LlamaForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    return model.eval()


def prompt_ids(tokenizer: Any, text: str) -> list[int]:
    return HFChatTokenizer(tokenizer).render_sync([user(text)], None, True)


def generate_all(engine: HFEngine, requests: list[GenerateRequest]) -> list[Generation]:
    async def main() -> list[Generation]:
        try:
            return list(await asyncio.gather(*(engine.generate(r) for r in requests)))
        finally:
            await engine.aclose()

    return asyncio.run(main())


def request(ids: list[int], sampling: SamplingParams = GREEDY, **update: Any) -> GenerateRequest:
    return GenerateRequest(
        messages=[user("unused")], prompt_ids=ids, sampling=sampling.model_copy(update=update)
    )


def forward_logprobs(
    model: Any, prompt: list[int], completion: list[int], temperature: float = 1.0
) -> list[float]:
    """Logprobs of ``completion`` from ONE forward pass over prompt + completion."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    scaled = torch.log_softmax(logits / temperature, dim=-1)
    return [scaled[len(prompt) - 1 + k, t].item() for k, t in enumerate(completion)]


def greedy_loop(model: Any, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


# -- HFChatTokenizer --------------------------------------------------------------------------


CALL_TEXT = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def conversation() -> list[Message]:
    call = ToolCall.make("call_0", "add", json.dumps({"a": 2, "b": 3}))
    return [
        system("Use tools."),
        user("What is 2+3?"),
        assistant(CALL_TEXT, [call]),
        Message(role="tool", content="5", tool_call_id="call_0", name="add"),
    ]


def test_render_is_the_chat_template_of_the_raw_turns(tokenizer: Any) -> None:
    chat = HFChatTokenizer(tokenizer, max_length=77)
    assert isinstance(chat, ChatTokenizer)
    ids = asyncio.run(chat.render(conversation(), TOOLS, True))
    wire = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": CALL_TEXT},
        {"role": "tool", "content": "5"},
    ]
    expected = tokenizer.apply_chat_template(
        wire, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert ids == list(expected)
    assert chat.decode(ids) == (
        "<|im_start|>system\nUse tools.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        f"<|im_start|>assistant\n{CALL_TEXT}<|im_end|>\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (chat.max_length, chat.eos_token_ids, chat.pad_token_id) == (77, (2,), 2)


def test_a_rendered_prompt_is_a_prefix_of_the_conversation_that_answers_it(tokenizer: Any) -> None:
    chat = HFChatTokenizer(tokenizer)
    messages = conversation()
    opened = chat.render_sync(messages, TOOLS, True)
    closed = chat.render_sync([*messages, assistant("It is 5.")], TOOLS, False)
    assert closed[: len(opened)] == opened
    assert chat.decode(closed[len(opened) :]) == "It is 5.<|im_end|>\n"


def test_eos_ids_come_from_the_generation_config_then_the_tokenizer(tokenizer: Any) -> None:
    config = transformers.GenerationConfig(eos_token_id=[7, 2, 9])
    assert HFChatTokenizer(tokenizer, generation_config=config).eos_token_ids == (7, 2, 9)
    assert HFChatTokenizer(
        tokenizer, generation_config=transformers.GenerationConfig(eos_token_id=5)
    ).eos_token_ids == (5, 2)


# -- greedy, logprobs, limits -----------------------------------------------------------------


def test_greedy_batch_equals_single_prompts_a_manual_loop_and_a_forward_pass(
    model: Any, tokenizer: Any
) -> None:
    prompts = [
        prompt_ids(tokenizer, t)
        for t in ("Hi", "What is the capital of France, please?", "Count: 1 2 3")
    ]
    assert len({len(p) for p in prompts}) == 3
    engine = HFEngine(model, tokenizer)
    batched = generate_all(engine, [request(p) for p in prompts])
    assert engine.last_batch_sizes == [3]
    alone = [generate_all(HFEngine(model, tokenizer), [request(p)])[0] for p in prompts]
    assert [g.token_ids for g in batched] == [g.token_ids for g in alone]
    for prompt, gen in zip(prompts, batched, strict=True):
        assert gen.finish_reason == "length"
        assert gen.token_ids == greedy_loop(model, prompt, 8)
        assert gen.text == tokenizer.decode(gen.token_ids)
        assert gen.logprobs == pytest.approx(
            forward_logprobs(model, prompt, gen.token_ids), abs=1e-4
        )
    assert (
        len({tuple(g.token_ids or ()) for g in batched}) == 3
    )  # the prompts lead to different paths


def test_sampled_logprobs_are_under_the_temperature_scaled_raw_distribution(
    model: Any, tokenizer: Any
) -> None:
    prompts = [prompt_ids(tokenizer, t) for t in ("Hi", "Tell me a story")]
    sampling = SamplingParams(temperature=0.7, top_p=0.9, top_k=50, max_tokens=12)
    generations = generate_all(
        HFEngine(model, tokenizer, seed=3), [request(p, sampling) for p in prompts]
    )
    for prompt, gen in zip(prompts, generations, strict=True):
        assert gen.token_ids is not None and len(gen.token_ids) == 12
        expected = forward_logprobs(model, prompt, gen.token_ids, temperature=0.7)
        assert gen.logprobs == pytest.approx(expected, abs=1e-4)
        # the temperature matters: these are not the T=1 logprobs
        assert gen.logprobs != pytest.approx(
            forward_logprobs(model, prompt, gen.token_ids), abs=1e-3
        )


def test_each_request_keeps_its_own_max_tokens_inside_one_batch(model: Any, tokenizer: Any) -> None:
    ids = prompt_ids(tokenizer, "Hello there")
    engine = HFEngine(model, tokenizer)
    generations = generate_all(engine, [request(ids, max_tokens=n) for n in (2, 9, 5)])
    assert engine.last_batch_sizes == [3]
    assert [len(g.token_ids or ()) for g in generations] == [2, 9, 5]
    assert [g.finish_reason for g in generations] == ["length"] * 3
    longest = generations[1].token_ids or []
    assert [g.token_ids for g in generations] == [longest[:2], longest, longest[:5]]
    assert engine.stats()["generated_tokens"] == 16


def test_any_eos_id_ends_the_turn_and_stays_out_of_the_text(
    model: Any, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = prompt_ids(tokenizer, "Hello there")
    path = greedy_loop(model, ids, 8)
    stop_id = path[3]
    cut = path.index(stop_id)  # its first occurrence ends the turn
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = [tokenizer.eos_token_id, stop_id]
    monkeypatch.setattr(model, "generation_config", config)
    [gen] = generate_all(HFEngine(model, tokenizer), [request(ids)])
    assert gen.token_ids == path[: cut + 1]
    assert gen.finish_reason == "stop"
    assert gen.text == tokenizer.decode(path[:cut])
    assert gen.logprobs is not None and len(gen.logprobs) == cut + 1


def test_stop_strings_cut_at_the_token_that_completes_them(model: Any, tokenizer: Any) -> None:
    ids = prompt_ids(tokenizer, "Hello there")
    path = greedy_loop(model, ids, 8)
    pieces = [tokenizer.decode([t]) for t in path]
    stop = (
        pieces[4][-1] + pieces[5][:1]
    )  # spans the boundary of tokens 4 and 5: token 5 completes it
    assert stop not in tokenizer.decode(path[:5])
    [gen, without] = generate_all(
        HFEngine(model, tokenizer), [request(ids, stop=(stop, "never seen")), request(ids)]
    )
    assert (gen.token_ids, gen.finish_reason, gen.text) == (
        path[:6],
        "stop",
        tokenizer.decode(path[:6]),
    )
    assert gen.logprobs == pytest.approx((without.logprobs or [])[:6], abs=1e-6)
    assert (without.token_ids, without.finish_reason) == (path, "length")


# -- engine behaviour -------------------------------------------------------------------------


def test_concurrent_requests_share_one_generate_call_per_sampling_group(
    model: Any, tokenizer: Any
) -> None:
    ids = [prompt_ids(tokenizer, f"Question {i}") for i in range(8)]
    engine = HFEngine(model, tokenizer, batch_wait_s=0.05)
    generate_all(engine, [request(p, max_tokens=2 + i) for i, p in enumerate(ids)])
    assert engine.last_batch_sizes == [8]
    assert engine.stats()["generate_calls"] == 1
    assert engine.stats()["generated_tokens"] == sum(2 + i for i in range(8))
    engine.reset_stats()
    hot = SamplingParams(temperature=1.0, max_tokens=2)
    generate_all(engine, [request(p, hot if i % 2 else GREEDY) for i, p in enumerate(ids)])
    assert engine.last_batch_sizes == [4, 4]
    small = HFEngine(model, tokenizer, max_batch_size=3, batch_wait_s=0.05)
    generate_all(small, [request(p, max_tokens=1) for p in ids])
    assert small.last_batch_sizes == [3, 3, 2]


def test_rows_that_together_overrun_the_context_go_in_separate_batches(
    model: Any, tokenizer: Any
) -> None:
    short, long = prompt_ids(tokenizer, "Hi"), [tokenizer.bos_token_id] + [198] * 999
    engine = HFEngine(model, tokenizer, batch_wait_s=0.05)  # max_position_embeddings: 1024
    generations = generate_all(
        engine,
        [request(short, max_tokens=30), request(long, max_tokens=2), request(short, max_tokens=3)],
    )
    # Rows go in prompt order, the long prompt first: 1000 + 3 fits, 1000 + 30 > 1024 does not.
    assert engine.last_batch_sizes == [2, 1]
    assert [len(g.token_ids or ()) for g in generations] == [30, 2, 3]


def test_a_prompt_samples_the_same_tokens_whatever_order_the_batch_arrived_in(
    model: Any, tokenizer: Any
) -> None:
    ids = [prompt_ids(tokenizer, t) for t in ("Hi", "Hello", "Hey there")]
    sampling = SamplingParams(temperature=1.0, max_tokens=8)

    def by_prompt(order: list[int]) -> dict[int, list[int] | None]:
        engine = HFEngine(model, tokenizer, seed=3, batch_wait_s=0.05)
        generations = generate_all(engine, [request(ids[i], sampling) for i in order])
        assert engine.last_batch_sizes == [3]
        return {i: g.token_ids for i, g in zip(order, generations, strict=True)}

    forward = by_prompt([0, 1, 2])
    assert forward == by_prompt([2, 0, 1]) == by_prompt([1, 2, 0])
    assert len({tuple(t or ()) for t in forward.values()}) == 3  # three different draws


def test_same_seed_same_samples_and_the_counter_resumes(model: Any, tokenizer: Any) -> None:
    ids = [prompt_ids(tokenizer, t) for t in ("Hi", "Hello")]
    sampling = SamplingParams(temperature=1.0, max_tokens=10)

    def two_batches(engine: HFEngine) -> list[list[int] | None]:
        first = generate_all(engine, [request(p, sampling) for p in ids])
        second = generate_all(engine, [request(p, sampling) for p in ids])
        return [g.token_ids for g in first + second]

    run = two_batches(HFEngine(model, tokenizer, seed=1))
    assert run == two_batches(HFEngine(model, tokenizer, seed=1))
    assert run != two_batches(HFEngine(model, tokenizer, seed=2))
    assert run[:2] != run[2:]  # the counter moves on between calls
    resumed = HFEngine(model, tokenizer, seed=1)
    resumed.load_state_dict({"calls": 1})
    assert [g.token_ids for g in generate_all(resumed, [request(p, sampling) for p in ids])] == run[
        2:
    ]
    assert resumed.state_dict() == {"calls": 2}


def test_generation_runs_in_eval_mode_without_grad_and_restores_train_mode(
    model: Any, tokenizer: Any
) -> None:
    seen: list[tuple[bool, bool]] = []
    handle = model.register_forward_pre_hook(
        lambda module, args: seen.append((module.training, torch.is_grad_enabled()))
    )
    model.train()
    try:
        generate_all(
            HFEngine(model, tokenizer), [request(prompt_ids(tokenizer, "Hi"), max_tokens=3)]
        )
        assert model.training
    finally:
        handle.remove()
        model.eval()
    assert seen == [(False, False)] * 3


def test_messages_without_prompt_ids_are_rendered_and_reported(model: Any, tokenizer: Any) -> None:
    engine = HFEngine(model, tokenizer)
    [gen] = generate_all(engine, [GenerateRequest(messages=[user("Hi")], sampling=GREEDY)])
    assert gen.prompt_token_ids == prompt_ids(tokenizer, "Hi")
    assert gen.token_ids == greedy_loop(model, prompt_ids(tokenizer, "Hi"), 8)
    with pytest.raises(EngineError, match="at most 1024"):
        generate_all(engine, [request([1] * 1024)])
    assert asyncio.run(engine.update_weights()) is None and engine.weights_version == 1


def test_aclose_serves_queued_requests_then_stops_the_batcher(model: Any, tokenizer: Any) -> None:
    engine = HFEngine(model, tokenizer, batch_wait_s=0.05)

    async def main() -> tuple[list[bool], list[str]]:
        tasks = [
            asyncio.create_task(engine.generate(request(prompt_ids(tokenizer, "Hi"), max_tokens=2)))
            for _ in range(3)
        ]
        await asyncio.sleep(0)  # the requests are queued, the batch window is still open
        await engine.aclose()
        await asyncio.sleep(0)
        return [t.done() and len(t.result().token_ids or ()) == 2 for t in tasks], [
            t.get_name() for t in asyncio.all_tasks()
        ]

    served, running = asyncio.run(main())
    assert served == [True, True, True]
    assert "hf-engine-batcher" not in running
    assert engine.last_batch_sizes == [3]


def test_a_failing_batch_fails_its_requests_and_the_engine_goes_on(
    model: Any, tokenizer: Any
) -> None:
    engine = HFEngine(model, tokenizer)

    async def main() -> tuple[BaseException | Generation, Generation]:
        bad = await asyncio.gather(
            engine.generate(request([len(tokenizer) + 5])), return_exceptions=True
        )
        good = await engine.generate(request(prompt_ids(tokenizer, "Hi"), max_tokens=2))
        await engine.aclose()
        return bad[0], good

    bad, good = asyncio.run(main())
    assert isinstance(bad, EngineError) and "HF generate failed on a batch of 1: IndexError" in str(
        bad
    )
    assert isinstance(good, Generation) and len(good.token_ids or ()) == 2


# -- the real rollout runner ------------------------------------------------------------------


def rollouts(engine: HFEngine, env: str, sampling: SamplingParams, **env_kwargs: Any) -> list[Any]:
    runner = RolloutRunner(
        engine, lambda: envhub.make(env, **env_kwargs), sampling=sampling, max_concurrency=4, seed=0
    )

    async def main() -> list[Any]:
        try:
            return await runner.run([0, 1], samples_per_task=2)
        finally:
            await engine.aclose()

    return asyncio.run(main())


def test_single_turn_rollouts_satisfy_the_token_contract(model: Any, tokenizer: Any) -> None:
    engine = HFEngine(model, tokenizer)
    trajectories = rollouts(engine, "arithmetic", SamplingParams(temperature=1.0, max_tokens=6))
    assert len(trajectories) == 4 and engine.last_batch_sizes == [4]
    for traj in trajectories:
        assert traj.errors == [] and traj.token_drift == []
        prompt = engine.tokenizer.render_sync(traj.messages[: traj.prompt_length], traj.tools, True)
        n = traj.prompt_token_count
        assert traj.token_ids[:n] == prompt and n == len(prompt)
        sampled = traj.token_ids[n:]
        assert traj.loss_mask == [0] * n + [1] * len(sampled)
        assert traj.turns[0].completion_tokens == len(sampled)
        expected = forward_logprobs(model, prompt, sampled)
        assert traj.sampler_logprobs[n:] == pytest.approx(expected, abs=1e-4)
        assert traj.sampler_logprobs[:n] == [0.0] * n


def test_multi_turn_rollouts_append_env_turns_without_drift(model: Any, tokenizer: Any) -> None:
    engine = HFEngine(model, tokenizer)
    trajectories = rollouts(
        engine, "guess-number", SamplingParams(temperature=0.0, max_tokens=3), max_turns=3
    )
    for traj in trajectories:
        assert traj.errors == [] and traj.token_drift == []
        assert len(traj.turns) == 3
        full = engine.tokenizer.render_sync(traj.messages, traj.tools, False)
        assert (
            traj.token_ids == full[: len(traj.token_ids)]
        )  # the record is the rendered conversation
        assert sum(traj.loss_mask) == 9  # three sampled tokens per turn, masked in
        sampled = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
        replies = [m.content or "" for m in traj.messages if m.role == "assistant"]
        assert sampled == [t for reply in replies for t in tokenizer.encode(reply)]
    assert engine.last_batch_sizes == [4, 4, 4]
