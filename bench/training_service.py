"""The training service's overhead: ``forward_backward`` and ``sample`` through the ``tinker``
SDK and the service, against the same calls on the service's own classes in this process.

The service runs as ``envhub serve-trainer`` in a process of its own, as users run it; the
SDK talks to it over loopback HTTP. "Direct" calls :meth:`TrainingModel.forward` on a model
built the same way (the same seed: the same adapter) and :meth:`Sampler.sample` on the folder
the service saved, in this process, so the difference is the SDK, HTTP, protobuf/JSON, the
futures' polling and the service's thread hops. (With the service in the client's process,
the SDK's threads contend for the GIL with the trainer thread, which adds its own cost.)
Custom losses are timed against the built-in loss they equal, each alternated with it: a
callable (two requests: a forward, then a backward) and an uploaded ``create_custom_loss``
(one request).

SmolLM2-135M-Instruct with a rank-8 LoRA on the CPU; a batch of ``--batch`` sequences of
``--tokens`` tokens; samples of ``--max-tokens`` tokens. Medians over ``--repeats`` calls
after one warm-up each, the two sides alternated. The goal: overhead under 5%.

    .venv/bin/python bench/training_service.py [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tinker
from tinker import types

from envhub.defaults import LOOPBACK, SMOLLM2_ID, free_port
from envhub.trainer.service import ServiceSettings, new_api_key
from envhub.trainer.service.sampling import Sampler
from envhub.trainer.service.training import LoraSpec, TrainingModel
from envhub.trainer.service.versions import hf_version
from envhub.trainer.service.wire import Datum, ForwardRequest

RANK, SEED = 8, 0


def start(port: int, key: str, state_dir: str) -> subprocess.Popen:
    """``envhub serve-trainer`` in a process of its own; returns once it answers."""
    envhub = str(Path(sys.executable).parent / "envhub")
    process = subprocess.Popen(
        [envhub, "serve-trainer", "--port", str(port), "--api-key", key, "--device", "cpu",
         "--state-dir", state_dir],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://{LOOPBACK}:{port}/api/v1/healthz").raise_for_status()
            return process
        except httpx.HTTPError:
            assert process.poll() is None, "serve-trainer exited"
            time.sleep(0.2)
    raise TimeoutError("serve-trainer did not answer in 120 s")


def timed(results: dict[str, float], names: tuple[str, str], a: Any, b: Any,
          repeats: int) -> None:  # fmt: skip
    """``repeats`` calls of ``a`` and of ``b`` after a warm-up of each, alternated (the
    machine is shared: a drift in its load hits both alike); the median seconds of each go to
    ``results`` under ``names``, the fastest call's (the least disturbed one) under
    ``<name>_fastest``."""
    a(), b()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((a, times[0]), (b, times[1])):
            start_s = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start_s)
    for name, each in zip(names, times, strict=True):
        results[name], results[f"{name}_fastest"] = statistics.median(each), min(each)


def callable_nll(data: list[Any], logprobs: list[Any]) -> tuple[Any, dict[str, float]]:
    """A callable custom loss: the weighted NLL (``cross_entropy`` with the same weights)."""
    weights = [d.loss_fn_inputs["weights"].to_torch() for d in data]
    return -sum((lp * w).sum() for lp, w in zip(logprobs, weights, strict=True)), {}


def weighted_nll(logprobs: Any, weights: Any) -> tuple[Any, dict[str, Any]]:
    """The same loss per datum, for ``create_custom_loss`` (uploaded to the service)."""
    return -(logprobs * weights).sum(), {}


def measure(args: argparse.Namespace, client: Any, state_dir: Path) -> dict[str, float]:
    """The medians, SDK against direct, of each verb."""
    training = client.create_lora_training_client(base_model=SMOLLM2_ID, rank=RANK,
                                                  seed=SEED).result()  # fmt: skip
    rng = np.random.default_rng(0)
    seqs = [rng.integers(100, 10000, args.tokens + 1).tolist() for _ in range(args.batch)]
    data = [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]),
                        loss_fn_inputs={"target_tokens": s[1:], "weights": [1.0] * args.tokens})
            for s in seqs]  # fmt: skip
    model = TrainingModel(SMOLLM2_ID, LoraSpec(RANK), SEED, "cpu")
    direct = ForwardRequest("", 0, "cross_entropy", {}, False, [
        Datum(s[:-1], {"target_tokens": np.array(s[1:]),
                       "weights": np.ones(args.tokens, np.float32)}) for s in seqs])  # fmt: skip
    results: dict[str, float] = {}
    timed(results, ("forward_backward_sdk_s", "forward_backward_direct_s"),
          lambda: training.forward_backward(data, "cross_entropy").result(),
          lambda: model.forward(direct), args.repeats)  # fmt: skip
    uploaded = client.create_custom_loss(weighted_nll, {"logprobs": 1, "weights": 1}).result()
    builtin = lambda: training.forward_backward(data, "cross_entropy").result()  # noqa: E731
    for kind, loss in (("callable", callable_nll), ("uploaded", uploaded)):
        timed(results, (f"custom_{kind}_sdk_s", f"builtin_beside_{kind}_sdk_s"),
              lambda loss=loss: training.forward_backward_custom(data, loss).result(),
              builtin, args.repeats)  # fmt: skip
    saved = training.save_weights_for_sampler("bench").result()
    sampler = client.create_sampling_client(model_path=saved.path).result()
    prompt = seqs[0][:32]
    params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, stop=[])
    run, kind, name = saved.path.removeprefix("tinker://").split("/")
    version = hf_version(str(state_dir / run / kind / name), ServiceSettings(state_dir=state_dir))
    local = Sampler(version.base, "cpu", version.adapter)  # the base and the saved adapter
    loop = asyncio.new_event_loop()
    direct_params = {"max_tokens": args.max_tokens, "temperature": 1.0, "stop": []}
    timed(
        results,
        ("sample_sdk_s", "sample_direct_s"),
        lambda: sampler.sample(types.ModelInput.from_ints(prompt), 1, params).result(),
        lambda: loop.run_until_complete(local.sample(prompt, 1, direct_params)),
        args.repeats,
    )
    loop.run_until_complete(local.engine.aclose())
    loop.close()
    for verb in ("forward_backward", "sample"):
        for stat in ("", "_fastest"):
            sdk, own = results[f"{verb}_sdk_s{stat}"], results[f"{verb}_direct_s{stat}"]
            results[f"{verb}_overhead{stat}"] = sdk / own - 1
    for kind in ("callable", "uploaded"):  # against the built-in timed beside it
        own, beside = results[f"custom_{kind}_sdk_s"], results[f"builtin_beside_{kind}_sdk_s"]
        results[f"custom_{kind}_vs_builtin"] = own / beside
    return results


def main() -> None:
    """Measure and print (and with ``--json``, write) the medians and the overheads."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--json")
    args = parser.parse_args()
    port, key = free_port(), new_api_key()
    with tempfile.TemporaryDirectory(prefix="envhub-bench-service-") as state_dir:
        process = start(port, key, state_dir)
        client = tinker.ServiceClient(base_url=f"http://{LOOPBACK}:{port}", api_key=key)
        try:
            results = measure(args, client, Path(state_dir))
        finally:
            client.close("success").result(timeout=30)
            process.terminate()
            process.wait(timeout=60)
    print(json.dumps(results, indent=2))
    for verb in ("forward_backward", "sample"):
        print(f"{verb} overhead (goal < 5%): {results[f'{verb}_overhead']:+.1%} of the medians, "
              f"{results[f'{verb}_overhead_fastest']:+.1%} of the fastest calls")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
