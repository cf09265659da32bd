"""A verifiers env evaluated two ways against one OpenAI-compatible server: through envhub's
runner (the adapter, ``envhub.adapters.verifiers``) and by verifiers' own ``evaluate``.

The server is a small stdlib HTTP server in its own process that answers
``/v1/chat/completions`` with scripted turns (the sum of the question's numbers; for the tool
env, first an ``add`` tool call, structured as vLLM's tool parser would return it, then the
tool's result). A real model on this 2-core machine would measure the model, not the two
harnesses; the scripted server makes both sides wait on the same, cheap, HTTP round trips.

    python bench/verifiers_eval.py [--episodes 256] [--concurrency 32]

Prints episodes/s for each side and env, and the mean reward (both must agree: 1.0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from envhub.defaults import free_port


def _reply(messages: list[dict[str, Any]], tools: Any) -> dict[str, Any]:
    question = next(m["content"] for m in messages if m["role"] == "user")
    a, b = (int(x) for x in re.findall(r"\d+", question))
    if tools and messages[-1]["role"] != "tool":
        arguments = json.dumps({"a": a, "b": b})
        text = f'<tool_call>{{"name": "add", "arguments": {arguments}}}</tool_call>'
        call = {"id": "call_1", "type": "function",
                "function": {"name": "add", "arguments": arguments}}  # fmt: skip
        return {"role": "assistant", "content": text, "tool_calls": [call]}
    return {"role": "assistant", "content": str(a + b)}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 -- http.server's naming
        self._send(404, {"error": "not found"})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if not self.path.endswith("/chat/completions"):
            return self._send(404, {"error": "not found"})
        message = _reply(body["messages"], body.get("tools"))
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        self._send(200, {
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
        })  # fmt: skip

    def _send(self, status: int, reply: Any) -> None:
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def serve(port: int) -> None:
    """Serve the scripted completions on 127.0.0.1:``port`` until killed."""
    ThreadingHTTPServer(("127.0.0.1", port), _Handler).serve_forever()


def _wait(port: int) -> None:
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the scripted server did not start")


# -- the envs -----------------------------------------------------------------------------------


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def exact(completion, answer) -> float:
    """1 when the last message is exactly the answer."""
    return float((completion[-1].content or "").strip() == answer)


def make_env(kind: str, episodes: int) -> Any:
    """A verifiers env of ``episodes`` sums: ``single`` (SingleTurnEnv) or ``tool`` (ToolEnv)."""
    import verifiers as vf
    from datasets import Dataset

    rows = [
        {"question": f"What is {i}+{i + 1}?", "answer": str(2 * i + 1)} for i in range(episodes)
    ]
    rubric = vf.Rubric(funcs=[exact])
    if kind == "single":
        return vf.SingleTurnEnv(eval_dataset=Dataset.from_list(rows), rubric=rubric)
    return vf.ToolEnv(tools=[add], eval_dataset=Dataset.from_list(rows), rubric=rubric, max_turns=3)


# -- the two sides ------------------------------------------------------------------------------


async def envhub_side(
    vf_env: Any, url: str, episodes: int, concurrency: int
) -> tuple[float, float]:
    """(episodes/s, mean reward) of envhub's runner on the adapted env, scripted server."""
    from envhub.adapters.verifiers import from_verifiers
    from envhub.inference.openai_http import OpenAIEngine
    from envhub.rollout.runner import RolloutRunner

    engine = OpenAIEngine(url, "scripted", mode="chat", max_concurrency=concurrency)
    runner = RolloutRunner(engine, lambda: from_verifiers(vf_env, split="eval"),
                           max_concurrency=concurrency)  # fmt: skip
    started = time.perf_counter()
    trajectories = await runner.run(list(range(episodes)))
    seconds = time.perf_counter() - started
    await engine.aclose()
    assert not any(t.errors for t in trajectories), trajectories[0].errors
    return episodes / seconds, sum(t.reward for t in trajectories) / episodes


async def verifiers_side(
    vf_env: Any, url: str, episodes: int, concurrency: int
) -> tuple[float, float]:
    """(episodes/s, mean reward) of verifiers' own ``evaluate``, same server."""
    import verifiers as vf
    from openai import AsyncOpenAI

    client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=f"{url}/v1", api_key="x"))
    started = time.perf_counter()
    quiet = lambda *a, **k: None  # noqa: E731 -- replaces verifiers' progress bar
    outputs = await vf_env.evaluate(
        client, "scripted", num_examples=episodes, max_concurrent=concurrency, on_progress=quiet
    )
    seconds = time.perf_counter() - started
    rewards = [o["reward"] for o in outputs["outputs"]]
    return episodes / seconds, sum(rewards) / len(rewards)


def main() -> None:
    """Run both sides on both envs once and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve)
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    try:
        _wait(port)
        url = f"http://127.0.0.1:{port}"
        print(f"{'env':8} {'side':10} {'episodes/s':>11} {'reward':>7}")
        for kind in ("single", "tool"):
            vf_env = make_env(kind, args.episodes)
            for side, run in (("envhub", envhub_side), ("verifiers", verifiers_side)):
                rate, reward = asyncio.run(run(vf_env, url, args.episodes, args.concurrency))
                print(f"{kind:8} {side:10} {rate:11.1f} {reward:7.3f}", flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
