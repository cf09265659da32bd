"""The harness endpoint's cost per call beyond generation: the same conversation run by the
rollout runner as a native multi-turn env (direct) and as a harness env whose agent program
calls the recording endpoint, at 1 and 64 concurrent episodes. The goal (issue 37): under 2 ms
per call at the median, and under 5% of a rollout's wall time.

Every episode is ``--calls`` calls: a system prompt (``--context-chars`` long) and the task, then
after each assistant turn a short user message, until the ``--calls``-th reply. The engine is a
:class:`~envhub.testing.ScriptedEngine` at token level (:class:`~envhub.testing.ByteChatTokenizer`)
whose every generate sleeps ``--gen-ms`` (20 ms by default; 0 for the pure overhead), standing in
for a model with a fixed, known cost. The sides:

- ``direct``: a :class:`~envhub.multiturn.MultiTurnEnv` whose ``env_response`` returns the next
  user message (what a native env does; no endpoint);
- ``harness/openai``: a :class:`~envhub.harness.HarnessEnv` whose program is an ``async`` loop
  over the ``AsyncOpenAI`` client it is given (``client.chat.completions.create``);
- ``harness/httpx``: the same loop posting JSON with a raw ``httpx.AsyncClient``: its
  difference from ``harness/openai`` is the ``openai`` SDK's own cost, the rest is the endpoint's;
- ``harness/openai-host``: ``harness/openai``'s loop run in the program host, a child process
  (``program_host="process"``): the clients' CPU runs beside the runner's, not under its
  interpreter lock. Its ``cpu us`` adds the child's CPU time.

Both sides must produce the same turns and the same token ids, episode by episode (checked: the
bench fails otherwise), so that only the transport differs.

The columns (times in ms; a ``+`` column is the side's figure minus ``direct``'s at the same
concurrency, a difference of percentiles, not a percentile of differences):

- ``call p50/p99``: the program's view of a call: from sending the request to holding the parsed
  reply, timed inside the program around ``create()`` / ``post()``. For ``direct`` the same
  span inside the env: from ``env_response`` returning the next message (the request) to the
  next ``env_response`` getting the turn (the reply). It holds the generation, the runner's
  own work per turn (rendering, the token record) and, for a harness, the endpoint's round trip.
- ``runner p50``: the runner's view of a call: a turn's ``generate_seconds + env_seconds`` (the
  env step is where a harness's reply goes out and its next call comes in), for every turn but
  the last (whose step also ends the program: counted in ``close``).
- ``open`` / ``close``: the fixed cost of an episode, p50: ``open`` is the env's reset (for a
  harness: a fresh key on the endpoint, the program's task and client started, its first call
  received), ``close`` the last step (the last reply sent, the program returning and its client
  closing, the episode's key discarded; the rubric on both sides). Each holds half of a call's
  round trip on the harness side.
- ``cpu us``: the process's CPU time (every thread) per call while the side ran: on a loaded
  machine the steadier measure, since it does not count waiting for a core.
- ``wall s`` and ``share``: the rollout's wall time (summed over the rounds), and the share of
  it a harness side spends beyond ``direct`` (``(wall - wall_direct) / wall``): the 5% goal, at
  the ``--gen-ms`` chosen (the share falls as generation gets slower: a real model's turns take
  far more than 20 ms). At high concurrency the harness side can be CPU-bound: the runner, the
  endpoint and in-process programs with their clients share one interpreter (one GIL), so a
  burst of calls is served one after another; ``cpu us`` then sets the pace.

``--stages`` times each harness call's path in pieces (by wrapping endpoint functions in this
process; the medians, in us): the client's send to the endpoint handler, the body read and parsed,
the hop to the runner's loop, the runner's turn (generation included), the hop back, and the
reply written and parsed by the client. ``--profile`` runs each side again at the highest
concurrency under cProfile, counting each thread's CPU time (the runner's loop; for a harness also
the endpoint's, which runs the programs and their clients too), and prints the CPU per call by
package (a builtin's or ``typing``'s time charged to its callers), then the harness sides' most
expensive call paths.

    .venv/bin/python bench/harness_endpoint.py [--concurrency 1 64] [--episodes 200]
        [--calls 3] [--gen-ms 20] [--rounds 2] [--stages] [--profile] [--json out.json]

JSON: ``{"settings": {...}, "rows": [{"concurrency": c, "side": s, "calls": n, "call_p50_ms",
"call_p99_ms", "runner_p50_ms", "runner_p99_ms", "open_p50_ms", "close_p50_ms",
"cpu_us_per_call", "wall_s", "overhead_p50_ms", "overhead_p99_ms", "runner_overhead_p50_ms",
"open_overhead_ms", "close_overhead_ms", "cpu_overhead_us", "share"}, ...],
"stages": {"SIDE c=N": {stage: us}}, "profile": {"SIDE THREAD": {package: us per call}}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import cProfile
import functools
import json
import os
import pstats
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import envhub.harness.endpoint as endpoint_module
from envhub.harness import HarnessEnv
from envhub.harness.endpoint import Call, Endpoint, Episode
from envhub.harness.host import ProgramHost
from envhub.inference.base import GenerateRequest, Generation
from envhub.multiturn import MultiTurnEnv
from envhub.rewards.rubric import Rubric
from envhub.rollout.runner import RolloutRunner
from envhub.state import State
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.types import AssistantTurn, Message, Trajectory, user

SIDES = ("direct", "harness/openai", "harness/httpx", "harness/openai-host")
GOAL_MS, GOAL_SHARE = 2.0, 0.05


@dataclass
class Spec:
    """The conversation every side runs."""

    calls: int
    system: str
    reply_chars: int

    def follow_up(self, k: int) -> str:
        """The user message after the ``k``-th reply (1-based)."""
        return f"Thanks. Now step {k + 1}, please."

    def policy(self, messages: list[Message], tools: Any) -> str:
        """The assistant's turn: its number and filler, ``reply_chars`` long in all."""
        turn = sum(m.role == "assistant" for m in messages)
        head = f"Step {turn + 1} done. "
        return head + "x" * max(0, self.reply_chars - len(head))


@dataclass
class Record:
    """What one side's run measured (filled from the programs, the envs and the engine)."""

    calls: list[float] = field(default_factory=list)
    """Per call, seconds: the program's view (the env's, for ``direct``)."""
    opens: list[float] = field(default_factory=list)
    closes: list[float] = field(default_factory=list)


REC = Record()


class SleepyEngine(ScriptedEngine):
    """A scripted engine whose every turn costs ``gen_ms`` of wall time (an ``asyncio`` sleep,
    so concurrent turns overlap as on a batching server)."""

    def __init__(self, spec: Spec, gen_ms: float) -> None:
        super().__init__(spec.policy, ByteChatTokenizer())
        self.gen_s = gen_ms / 1000

    async def generate(self, request: GenerateRequest) -> Generation:
        """The scripted turn, after ``gen_ms``."""
        if self.gen_s:
            await asyncio.sleep(self.gen_s)
        return await super().generate(request)


class _Timed:
    """Times an episode's reset (``open``) and last step (``close``) into :data:`REC`."""

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        started = time.perf_counter()
        result = await super().areset(seed=seed, options=options)  # type: ignore[misc]
        REC.opens.append(time.perf_counter() - started)
        return result

    async def astep(self, action: Any):
        started = time.perf_counter()
        result = await super().astep(action)  # type: ignore[misc]
        if result[2] or result[3]:
            REC.closes.append(time.perf_counter() - started)
        return result


class DirectEnv(_Timed, MultiTurnEnv):
    """The conversation as a native env: ``env_response`` returns the next user message."""

    name = "bench-direct"

    def __init__(self, spec: Spec, dataset: list[dict[str, Any]]) -> None:
        super().__init__(
            dataset, rubric=Rubric(), system_prompt=spec.system, max_turns=spec.calls + 1
        )
        self.spec = spec
        self._sent = 0.0

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """The prompt; the first call's clock starts."""
        result = await super().areset(seed=seed, options=options)
        self._sent = time.perf_counter()
        return result

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        """The next user message, or the end after ``calls`` turns."""
        REC.calls.append(time.perf_counter() - self._sent)
        if state.turn >= self.spec.calls:
            state.done = True
            return []
        message = user(self.spec.follow_up(state.turn))
        self._sent = time.perf_counter()
        return [message]


class BenchHarnessEnv(_Timed, HarnessEnv):
    """A harness env, timed (and with ``--stages``, its side of each call's path)."""

    name = "bench-harness"

    async def _next(self, reply: Any) -> Any:
        key = self._active_run().episode.key
        result = await super()._next(reply)
        if STAGES.on and isinstance(result[0], Call):
            STAGES.mark(key, "env_got")
        return result

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        """As :class:`HarnessEnv`'s, marked; a hosted program's call times join :data:`REC`."""
        if STAGES.on and self._run is not None:
            STAGES.mark(self._run.episode.key, "env_step")
        messages = await super().env_response(state, turn)
        result = state.data.get("result")
        if isinstance(result, dict) and "call_times" in result:
            REC.calls.extend(result["call_times"])
        return messages


async def converse(
    spec: Spec, prompt: str, api_key: str, send: Any, times: list[float] | None = None
) -> str:
    """The conversation's ``spec.calls`` calls, each through ``send(messages) -> reply text``,
    timed around ``send`` into ``times`` (``REC.calls`` by default; marked for ``--stages``);
    returns the last reply."""
    times = REC.calls if times is None else times
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": spec.system},
        {"role": "user", "content": prompt},
    ]
    content = ""
    for k in range(1, spec.calls + 1):
        if STAGES.on:
            STAGES.mark(api_key, "send")
        started = time.perf_counter()
        content = await send(messages)
        times.append(time.perf_counter() - started)
        if STAGES.on:
            STAGES.mark(api_key, "recv")
        messages.append({"role": "assistant", "content": content})
        if k < spec.calls:
            messages.append({"role": "user", "content": spec.follow_up(k)})
    return content


async def openai_conversation(
    spec: Spec, client: Any, prompt: str, api_key: str, times: list[float] | None = None
) -> str:
    """The conversation as an ``openai``-SDK loop (the client is the one the env gives)."""

    async def send(messages: list[dict[str, Any]]) -> str:
        response = await client.chat.completions.create(model="policy", messages=messages)
        return response.choices[0].message.content

    return await converse(spec, prompt, api_key, send, times)


def openai_program(spec: Spec) -> Any:
    """:func:`openai_conversation` as a program of this process."""

    async def program(client: Any, prompt: str, api_key: str) -> str:
        return await openai_conversation(spec, client, prompt, api_key)

    return program


async def hosted_openai_program(spec: Spec, client: Any, prompt: str, api_key: str) -> Any:
    """:func:`openai_conversation` run in the program host (a child process): it returns its
    calls' times with its reply, since :data:`REC` there is the child's."""
    times: list[float] = []
    content = await openai_conversation(spec, client, prompt, api_key, times)
    return {"content": content, "call_times": times}


def httpx_program(spec: Spec) -> Any:
    """The same loop over a raw ``httpx.AsyncClient`` (no SDK): JSON in, JSON out."""
    import httpx

    async def program(base_url: str, api_key: str, prompt: str) -> str:
        headers = {"Authorization": f"Bearer {api_key}"}
        # verify=False as the env's own openai client: plain http to 127.0.0.1 needs no CA
        # bundle, and parsing one per episode would be charged to this side alone.
        client = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=None, verify=False)
        async with client:

            async def send(messages: list[dict[str, Any]]) -> str:
                body = {"model": "policy", "messages": messages}
                response = await client.post("/chat/completions", json=body)
                response.raise_for_status()
                return response.json()["choices"][0]["message"]["content"]

            return await converse(spec, prompt, api_key, send)

    return program


def env_factory(side: str, spec: Spec, dataset: list[dict[str, Any]]) -> Any:
    """The env of ``side`` for the runner's pool."""
    if side == "direct":
        return lambda: DirectEnv(spec, dataset)
    if side == "harness/openai-host":
        program, host = functools.partial(hosted_openai_program, spec), "process"
    else:
        program = openai_program(spec) if side == "harness/openai" else httpx_program(spec)
        host = "thread"
    return lambda: BenchHarnessEnv(
        program,
        dataset,
        rubric=Rubric(),
        max_turns=spec.calls + 1,
        timeout=600,
        program_host=host,
    )


@dataclass
class Run:
    """One side's run at one concurrency."""

    trajectories: list[Trajectory]
    record: Record
    wall: float
    cpu: float


def process_cpu(side: str) -> float:
    """CPU seconds of this process, plus its program host's for a ``-host`` side."""
    cpu = time.process_time()
    host = ProgramHost._shared
    if side.endswith("-host") and host is not None and host.alive():
        fields = Path(f"/proc/{host._process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return cpu


def run_side(
    side: str, spec: Spec, episodes: int, concurrency: int, gen_ms: float, profile: Any = None
) -> Run:
    """Roll out ``episodes`` episodes of ``side``; what the programs and envs timed, the
    rollout's wall time and the process's CPU time."""
    global REC
    REC = Record()
    dataset = [{"question": f"Task {i}: write {spec.calls} steps."} for i in range(episodes)]
    runner = RolloutRunner(
        SleepyEngine(spec, gen_ms),
        env_factory(side, spec, dataset),
        max_concurrency=concurrency,
        step_timeout=None,
        episode_timeout=None,
    )
    if side.endswith("-host"):  # start the host and import the client there, untimed
        asyncio.run(runner.run([0]))
        REC = Record()
    if profile is not None:
        profile.start()
    cpu, started = process_cpu(side), time.perf_counter()
    trajectories = asyncio.run(runner.run(list(range(episodes))))
    wall, cpu = time.perf_counter() - started, process_cpu(side) - cpu
    if profile is not None:
        profile.stop()
    for traj in trajectories:
        assert not traj.errors and traj.stop_reason == "terminated", (side, traj.errors)
        assert len(traj.turns) == spec.calls, (side, len(traj.turns))
    return Run(trajectories, REC, wall, cpu)


def check_same(direct: Run, other: Run, side: str) -> None:
    """Both sides produced the same turns and the same tokens, episode by episode."""
    for a, b in zip(direct.trajectories, other.trajectories, strict=True):
        assert len(a.turns) == len(b.turns), (
            f"{side}: turns differ ({len(a.turns)}, {len(b.turns)})"
        )
        assert a.token_ids is not None and a.token_ids == b.token_ids, f"{side}: tokens differ"
        assert a.loss_mask == b.loss_mask, f"{side}: loss masks differ"
    assert len(direct.record.calls) == len(other.record.calls), (side, "calls timed differ")


# -- stages -------------------------------------------------------------------------------------


class Stages:
    """Timestamps along each harness call's path, by episode key (``--stages`` only)."""

    ORDER = (
        ("send", "handler", "client send -> endpoint handler (SDK, HTTP, uvicorn, routing)"),
        ("handler", "body", "request body read + json.loads"),
        ("body", "parsed", "read_chat_request (wire -> Messages)"),
        ("parsed", "env_got", "queue + hop to the runner's loop (env has the call)"),
        ("env_got", "env_step", "runner's turn: render, generate, record (as direct)"),
        ("env_step", "answer", "env step -> hop to the endpoint's loop (reply set)"),
        ("answer", "complete", "handler wakes, builds the completion"),
        ("complete", "recv", "response written, read and parsed by the client"),
    )

    def __init__(self) -> None:
        self.on = False
        self.marks: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        self.key: contextvars.ContextVar[str] = contextvars.ContextVar("bench_key")

    def mark(self, key: str, name: str) -> None:
        """Stamp the time of ``name`` on the episode with ``key``."""
        self.marks[key][name].append(time.perf_counter())

    def install(self) -> None:
        """Wrap the endpoint's body reader, request reader, completion writer and answer (in
        this process only; the handler looks them up as module globals on each call)."""
        read_body, read_request = endpoint_module._json_body, endpoint_module.read_chat_request
        completion, answer = endpoint_module.completion_body, Episode.answer

        async def json_body(request: Any) -> Any:
            key = request.path_params["key"]
            self.key.set(key)
            self.mark(key, "handler")
            body = await read_body(request)
            self.mark(key, "body")
            return body

        def read_chat_request(body: Any) -> Any:
            chat = read_request(body)
            self.mark(self.key.get(), "parsed")
            return chat

        def completion_body(*args: Any, **kwargs: Any) -> Any:
            self.mark(self.key.get(), "complete")
            return completion(*args, **kwargs)

        def answer_(episode: Episode, reply: Any) -> None:
            call = episode.pending
            if call is not None and not isinstance(reply, BaseException):
                # Marked when the reply lands on the endpoint's loop (the callback is queued
                # there before the reply, so it is in place when the reply is set).
                def stamp(_: Any, key: str = episode.key) -> None:
                    self.mark(key, "answer")

                call.reply.get_loop().call_soon_threadsafe(call.reply.add_done_callback, stamp)
            answer(episode, reply)

        endpoint_module._json_body = json_body
        endpoint_module.read_chat_request = read_chat_request
        endpoint_module.completion_body = completion_body
        Episode.answer = answer_  # type: ignore[method-assign]

    def medians(self) -> dict[str, float]:
        """Median microseconds of each stage over every call recorded."""
        spans: dict[str, list[float]] = defaultdict(list)
        for marks in self.marks.values():
            for start, end, label in self.ORDER:
                for a, b in zip(marks[start], marks[end], strict=False):
                    spans[label].append((b - a) * 1e6)
        return {label: statistics.median(spans[label]) for _, _, label in self.ORDER}


STAGES = Stages()


# -- profile ------------------------------------------------------------------------------------


CATEGORIES = (
    ("uvicorn", "uvicorn + httptools (server HTTP)"),
    ("httptools", "uvicorn + httptools (server HTTP)"),
    ("/h11", "uvicorn + httptools (server HTTP)"),
    ("starlette", "starlette (routing, request, response)"),
    ("/openai/", "openai SDK (request transform, response models)"),
    ("httpx", "httpx + httpcore (client HTTP)"),
    ("httpcore", "httpx + httpcore (client HTTP)"),
    ("anyio", "httpx + httpcore (client HTTP)"),
    ("sniffio", "httpx + httpcore (client HTTP)"),
    ("pydantic", "pydantic (envhub's models)"),
    ("/json/", "json"),
    ("envhub/harness", "envhub.harness (wire, env, endpoint)"),
    ("envhub/rollout", "envhub.rollout (runner, token record)"),
    ("envhub/testing", "engine (scripted, byte tokenizer)"),
    ("envhub/", "envhub (env, types, ...)"),
    ("asyncio", "asyncio (loops, tasks, thread hops)"),
    ("selectors", "asyncio (loops, tasks, thread hops)"),
    ("concurrent", "asyncio (loops, tasks, thread hops)"),
    ("threading", "asyncio (loops, tasks, thread hops)"),
    ("bench/", "bench (programs, timers)"),
)
"""Where a function's own time goes, by its file; builtins and general helpers (``typing``,
``contextlib``, ...) are charged to whoever called them."""


def category(function: tuple[str, int, str]) -> str | None:
    """The package a profiled function belongs to (``None``: charge its callers)."""
    filename = function[0]
    if filename == "~":
        if "socket" in function[2] or "epoll" in function[2]:
            return "asyncio (loops, tasks, thread hops)"  # the syscalls of the loop
        return None
    for needle, name in CATEGORIES:
        if needle in filename:
            return name
    return None


def charged(stats: dict[Any, Any], function: Any, memo: dict[Any, Any], depth: int = 0) -> Any:
    """How ``function``'s own time splits over packages: all to its own, or (a builtin, a
    general helper) over its callers' in proportion to the time each spent in it."""
    own = category(function)
    if own is not None:
        return {own: 1.0}
    if function in memo:
        return memo[function]
    callers = stats.get(function, (0, 0, 0, 0, {}))[4]
    weights = {c: v[2] + 1e-12 for c, v in callers.items()}
    total = sum(weights.values())
    if depth > 8 or not total:
        return {"other": 1.0}
    mix: dict[str, float] = defaultdict(float)
    memo[function] = {"other": 1.0}  # a cycle ends here
    for caller, weight in weights.items():
        for name, part in charged(stats, caller, memo, depth + 1).items():
            mix[name] += part * weight / total
    memo[function] = dict(mix)
    return memo[function]


class Profile:
    """cProfile on the runner's thread and on the endpoint's, counting each thread's CPU time."""

    def __init__(self) -> None:
        self.main = cProfile.Profile(time.thread_time)
        self.endpoint = cProfile.Profile(time.thread_time)

    def start(self) -> None:
        """Profile this thread and the endpoint's from now on."""
        Endpoint.shared().run(_call(self.endpoint.enable)).result()
        self.main.enable()

    def stop(self) -> None:
        """Stop profiling both threads."""
        self.main.disable()
        Endpoint.shared().run(_call(self.endpoint.disable)).result()

    def by_category(self, calls: int) -> dict[str, dict[str, float]]:
        """CPU microseconds per call by package, per thread (a builtin's or a general helper's
        time is charged to its callers' packages, in proportion to the time each spent)."""
        result = {}
        for thread, profile in (("runner", self.main), ("endpoint", self.endpoint)):
            stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
            memo: dict[Any, dict[str, float]] = {}

            totals: dict[str, float] = defaultdict(float)
            for function, (_, _, tottime, _, _) in stats.items():
                for name, part in charged(stats, function, memo).items():
                    totals[name] += tottime * part
            result[thread] = {k: v / calls * 1e6 for k, v in totals.items()}
        return result

    def top(self, thread: str, n: int) -> list[tuple[str, float, int]]:
        """The ``n`` functions with the most cumulative CPU time on ``thread``, below the loop."""
        profile = self.main if thread == "runner" else self.endpoint
        stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
        rows = sorted(
            ((f, v) for f, v in stats.items() if "asyncio" not in f[0] and f[0] != "~"),
            key=lambda kv: -kv[1][3],
        )[:n]
        return [(f"{Path(f[0]).name}:{f[1]}({f[2]})", v[3], v[1]) for f, v in rows]


async def _call(fn: Any) -> None:
    fn()


# -- the table ----------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(runs: list[Run], spec: Spec) -> dict[str, float]:
    """The row of one side at one concurrency, pooled over the rounds (in ms, us and s)."""
    calls = [c for r in runs for c in r.record.calls]
    runner_calls = [
        t.generate_seconds + t.env_seconds
        for r in runs
        for traj in r.trajectories
        for t in traj.turns[:-1]
    ]
    count = len(calls)
    return {
        "calls": count,
        "call_p50_ms": pct(calls, 0.5) * 1e3,
        "call_p99_ms": pct(calls, 0.99) * 1e3,
        "runner_p50_ms": pct(runner_calls, 0.5) * 1e3 if runner_calls else 0.0,
        "runner_p99_ms": pct(runner_calls, 0.99) * 1e3 if runner_calls else 0.0,
        "open_p50_ms": pct([o for r in runs for o in r.record.opens], 0.5) * 1e3,
        "close_p50_ms": pct([c for r in runs for c in r.record.closes], 0.5) * 1e3,
        "cpu_us_per_call": sum(r.cpu for r in runs) / count * 1e6,
        "wall_s": sum(r.wall for r in runs),
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    """The main table: one line per side and concurrency."""
    head = (
        f"{'conc':>4} {'side':<15} {'calls':>6} {'call p50':>8} {'p99':>7} {'+p50':>6} "
        f"{'+p99':>6} {'runner p50':>10} {'+p50':>6} {'open':>6} {'+':>6} {'close':>6} "
        f"{'+':>6} {'cpu us':>7} {'+':>6} {'wall s':>7} {'share':>6}"
    )
    print(head)
    for row in rows:
        direct = row["side"] == "direct"

        def plus(key: str, row: dict[str, Any] = row, direct: bool = direct) -> str:
            return f"{'':>6}" if direct else f"{row[key]:>6.2f}"

        cpu_plus = f"{'':>6}" if direct else f"{row['cpu_overhead_us']:>6.0f}"
        share = f"{'':>6}" if direct else f"{row['share']:>6.1%}"
        print(
            f"{row['concurrency']:>4} {row['side']:<15} {row['calls']:>6} "
            f"{row['call_p50_ms']:>8.2f} {row['call_p99_ms']:>7.2f} {plus('overhead_p50_ms')} "
            f"{plus('overhead_p99_ms')} {row['runner_p50_ms']:>10.2f} "
            f"{plus('runner_overhead_p50_ms')} {row['open_p50_ms']:>6.2f} "
            f"{plus('open_overhead_ms')} {row['close_p50_ms']:>6.2f} "
            f"{plus('close_overhead_ms')} {row['cpu_us_per_call']:>7.0f} {cpu_plus} "
            f"{row['wall_s']:>7.2f} {share}"
        )


def main() -> None:
    """Run every side at every concurrency, print the table (and stages/profile if asked)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--episodes", type=int, default=200, help="per side, concurrency and round")
    parser.add_argument("--calls", type=int, default=3, help="calls per episode")
    parser.add_argument("--gen-ms", type=float, default=20.0, help="each turn's generation time")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of all sides, interleaved")
    parser.add_argument("--context-chars", type=int, default=2000, help="system prompt length")
    parser.add_argument("--reply-chars", type=int, default=200, help="each reply's length")
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    parser.add_argument("--stages", action="store_true", help="time each call's path in pieces")
    parser.add_argument("--profile", action="store_true", help="cProfile harness/openai")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    sides = ["direct", *[s for s in args.sides if s != "direct"]]
    system = "You are a careful agent. " * (args.context_chars // 25 + 1)
    spec = Spec(args.calls, system[: args.context_chars], args.reply_chars)
    load = os.getloadavg()
    print(
        f"{os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; "
        f"{args.calls} calls/episode, {args.episodes} episodes x {args.rounds} rounds per side, "
        f"generation {args.gen_ms:g} ms/turn, system prompt {args.context_chars} chars, "
        f"replies {args.reply_chars} chars"
    )
    for side in sides:  # warm up: imports, the endpoint's thread, first-call paths
        run_side(side, spec, 8, 4, 0.0)

    rows: list[dict[str, Any]] = []
    for concurrency in args.concurrency:
        runs: dict[str, list[Run]] = defaultdict(list)
        for _ in range(args.rounds):
            for side in sides:
                runs[side].append(run_side(side, spec, args.episodes, concurrency, args.gen_ms))
                check_same(runs["direct"][-1], runs[side][-1], side)
        base = summary(runs["direct"], spec)
        for side in sides:
            row = {"concurrency": concurrency, "side": side, **summary(runs[side], spec)}
            row.update(
                overhead_p50_ms=row["call_p50_ms"] - base["call_p50_ms"],
                overhead_p99_ms=row["call_p99_ms"] - base["call_p99_ms"],
                runner_overhead_p50_ms=row["runner_p50_ms"] - base["runner_p50_ms"],
                open_overhead_ms=row["open_p50_ms"] - base["open_p50_ms"],
                close_overhead_ms=row["close_p50_ms"] - base["close_p50_ms"],
                cpu_overhead_us=row["cpu_us_per_call"] - base["cpu_us_per_call"],
                share=(row["wall_s"] - base["wall_s"]) / row["wall_s"],
            )
            rows.append(row)
    print()
    print_table(rows)
    print(
        f"(goal: +p50 under {GOAL_MS:g} ms per call, share under {GOAL_SHARE:.0%} of the "
        f"rollout's wall time; load average now {os.getloadavg()[0]:.1f})"
    )
    result: dict[str, Any] = {"settings": vars(args) | {"json": None}, "rows": rows}

    if args.stages:
        STAGES.install()
        stages: dict[str, Any] = {}
        for side in sides[1:]:
            for concurrency in args.concurrency:
                STAGES.marks.clear()
                STAGES.on = True
                run_side(side, spec, args.episodes, concurrency, args.gen_ms)
                STAGES.on = False
                stages[f"{side} c={concurrency}"] = STAGES.medians()
        print("\nper-call path of a harness call, median us (--stages)")
        labels = [label for _, _, label in Stages.ORDER]
        names = list(stages)
        print(f"{'stage':<62}" + "".join(f"{n:>22}" for n in names))
        for label in labels:
            print(f"{label:<62}" + "".join(f"{stages[n][label]:>22.0f}" for n in names))
        result["stages"] = stages

    if args.profile:
        concurrency = max(args.concurrency)
        columns: dict[str, dict[str, float]] = {}
        profiles: dict[str, Profile] = {}
        for side in sides:
            profiles[side] = Profile()
            run = run_side(side, spec, args.episodes, concurrency, args.gen_ms, profiles[side])
            for thread, totals in profiles[side].by_category(len(run.record.calls)).items():
                if side != "direct" or thread == "runner":
                    columns[f"{side} {thread}"] = totals
        names = sorted(
            {k for totals in columns.values() for k in totals},
            key=lambda k: -sum(c.get(k, 0.0) for c in columns.values()),
        )
        print(
            f"\nCPU us per call by package at concurrency {concurrency} (cProfile, each thread's "
            "CPU time; profiling inflates every figure; the endpoint's thread also runs the "
            "programs and their clients)"
        )
        print(f"{'package':<50}" + "".join(f"{c:>24}" for c in columns))
        for name in names:
            print(f"{name:<50}" + "".join(f"{c.get(name, 0.0):>24.0f}" for c in columns.values()))
        print(f"{'total':<50}" + "".join(f"{sum(c.values()):>24.0f}" for c in columns.values()))
        for side in sides[1:]:
            print(f"  most cumulative CPU, {side}, endpoint thread (s, calls):")
            for name, seconds, ncalls in profiles[side].top("endpoint", 10):
                print(f"    {name:<80} {seconds:>7.3f} {ncalls:>7}")
        result["profile"] = columns

    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
