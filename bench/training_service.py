"""The training service's overhead: ``forward_backward`` and ``sample`` through the ``tinker``
SDK and the service, against the same calls on the service's own objects in process.

The service runs in this process (uvicorn in a thread, as the tests run it), the SDK talks to
it over loopback HTTP; "direct" calls :class:`TrainingModel.forward` and
:meth:`Sampler.sample` on the very objects the service holds, so the difference is the SDK,
HTTP, protobuf/JSON, the futures' polling and the thread hops. SmolLM2-135M-Instruct with a
rank-8 LoRA on the CPU; a batch of ``--batch`` sequences of ``--tokens`` tokens; samples of
``--max-tokens`` tokens. Medians over ``--repeats`` calls after one warm-up each.

    .venv/bin/python bench/training_service.py [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from typing import Any

import numpy as np
import tinker
import uvicorn
from tinker import types

from envhub.defaults import LOOPBACK, SMOLLM2_ID, free_port
from envhub.trainer.service import ServiceSettings, build_app
from envhub.trainer.service.sampling import Sampler
from envhub.trainer.service.wire import Datum, ForwardRequest


def start(settings: ServiceSettings) -> tuple[Any, uvicorn.Server]:
    """The service under uvicorn in a thread; returns once it accepts connections."""
    app = build_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host=LOOPBACK, port=settings.port,
                                           log_level="warning"))  # fmt: skip
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return app, server


def timed(a: Any, b: Any, repeats: int) -> tuple[float, float]:
    """The median seconds of ``repeats`` calls of ``a`` and of ``b`` after a warm-up of each,
    alternated (the machine is shared: a drift in its load hits both alike)."""
    a(), b()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((a, times[0]), (b, times[1])):
            start_s = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start_s)
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    """Measure and print (and with ``--json``, write) the medians and the overheads."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--json")
    args = parser.parse_args()
    settings = ServiceSettings(port=free_port(), device="cpu", long_poll_s=10,
                               state_dir="/tmp/envhub-bench-training-service")  # fmt: skip
    app, server = start(settings)
    client = tinker.ServiceClient(base_url=f"http://{LOOPBACK}:{settings.port}",
                                  api_key=settings.api_key)  # fmt: skip
    training = client.create_lora_training_client(base_model=SMOLLM2_ID, rank=8).result()
    rng = np.random.default_rng(0)
    seqs = [rng.integers(100, 10000, args.tokens + 1).tolist() for _ in range(args.batch)]
    data = [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]),
                        loss_fn_inputs={"target_tokens": s[1:], "weights": [1.0] * args.tokens})
            for s in seqs]  # fmt: skip
    state = app.app.state.service  # inside the key check
    model = state.models[training.model_id]
    direct = ForwardRequest(training.model_id, 0, "cross_entropy", {}, False, [
        Datum(s[:-1], {"target_tokens": np.array(s[1:]),
                       "weights": np.ones(args.tokens, np.float32)}) for s in seqs])  # fmt: skip
    results: dict[str, float] = {}
    results["forward_backward_sdk_s"], results["forward_backward_direct_s"] = timed(
        lambda: training.forward_backward(data, "cross_entropy").result(),
        lambda: model.forward(direct), args.repeats)  # fmt: skip
    saved = training.save_weights_for_sampler("bench").result()
    sampler = client.create_sampling_client(model_path=saved.path).result()
    prompt = seqs[0][:32]
    params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, stop=[])
    # the same sampler code on the same saved folder, on an event loop of this thread
    local = Sampler(str(state.folder_of(saved.path)), "cpu")
    loop = asyncio.new_event_loop()
    direct_params = {"max_tokens": args.max_tokens, "temperature": 1.0, "stop": []}
    results["sample_sdk_s"], results["sample_direct_s"] = timed(
        lambda: sampler.sample(types.ModelInput.from_ints(prompt), 1, params).result(),
        lambda: loop.run_until_complete(local.sample(prompt, 1, direct_params)), args.repeats)
    loop.run_until_complete(local.engine.aclose())
    loop.close()
    for verb in ("forward_backward", "sample"):
        sdk, own = results[f"{verb}_sdk_s"], results[f"{verb}_direct_s"]
        results[f"{verb}_overhead"] = sdk / own - 1
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    server.should_exit = True

if __name__ == "__main__":
    main()
