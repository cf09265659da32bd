"""Run one rollout of a verifiers v1 environment against an OpenAI-compatible endpoint.

A harness program for envhub (``envhub.adapters.verifiers.v1.VerifiersV1Env``) that runs in
the separate verifiers 0.4 venv (``scripts/verifiers_v1_venv.sh`` builds ``.venv-verifiers``);
it imports nothing from envhub. It reads one JSON object on stdin::

    {"env": {"taskset": {"id": "vf-arith-v1", "num_tasks": 5}},   # verifiers' [env] block
     "index": 3,                                                 # or "row": {TaskData fields}
     "max_turns": 32}                                            # optional: model calls

loads the environment (``verifiers.v1.load_environment``), takes the task at ``index`` of its
taskset (or builds the taskset's task from ``row``), runs ONE episode with the model at
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` / ``OPENAI_MODEL`` and prints one JSON line::

    {"reward": 1.2, "rewards": {"correct": 1.0, "boxed": 1.0},
     "weights": {"correct": 1.0, "boxed": 0.2}, "metrics": {...}, "stop_condition": "...",
     "turns": 1, "task_index": 3}

``reward`` is verifiers' own (``Trace.reward``: the weighted sum of the task's rewards),
``rewards`` each reward unweighted. ``--count`` prints ``{"num_tasks": N}`` instead (no model
call). A rollout that verifiers marks failed (``Episode.ok`` false: a harness crash, a refused
model call, a reward that raised) exits 1 with its errors on stderr.

What this script decides for verifiers, so that the rollout is exactly one sampled episode:

- every agent runs in the ``subprocess`` runtime (verifiers' default is a remote Prime box),
  through one in-process interception server (``interception.type = server``);
- a role that pins no harness gets ``null`` (verifiers' tool-less chat loop; its fallback is
  ``bash``, which runs the model's shell commands on this host) unless the taskset bundles one;
- the harness program (a PEP 723 script that verifiers would ``uv sync`` from PyPI at run time)
  runs with this venv's Python instead, which has all its dependencies (openai, mcp, httpx,
  httpx2, tenacity, certifi), so nothing is downloaded;
- sampling is left empty (``SamplingConfig()``): verifiers then adds no sampling field to the
  program's calls (it sends no ``top_p``, ``n`` or ``logit_bias`` by default; the chat loop
  sets none either), and the endpoint's run decides temperature and length;
- no retries: whole-episode and per-agent retries are 0 (verifiers' default, pinned here), and
  an SDK retry of a call reaches the interception server only, which replays the call it
  already answered instead of sending it upstream again.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def read_spec() -> dict[str, Any]:
    """The task spec from stdin."""
    try:
        spec = json.loads(sys.stdin.read())
    except ValueError as e:
        raise SystemExit(f"verifiers_v1_agent: stdin is not JSON: {e}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("env"), dict):
        raise SystemExit('verifiers_v1_agent: stdin must be {"env": {...}, "index": N | "row": {}}')
    return spec


def env_config(raw: dict[str, Any], max_turns: int | None = None) -> Any:
    """verifiers' env config for ``raw``, with this script's runtime and harness defaults and
    ``max_turns`` for every seat that sets none."""
    import verifiers.v1 as vf
    from verifiers.v1.configs.agent import AgentConfig

    data = json.loads(json.dumps(raw))
    data.setdefault("interception", {"type": "server"})
    data.setdefault("retries", {"max_retries": 0})
    taskset_id = (data.get("taskset") or {}).get("id", "")
    bundled = vf.default_harness_id(taskset_id) if taskset_id else "bash"
    roles = vf.env_config_type(taskset_id, data.get("id") or "").model_fields
    for name, field in roles.items():
        if not isinstance(field.default, AgentConfig):
            continue
        role = data.setdefault(name, {})
        role.setdefault("runtime", {"type": "subprocess"})
        role.setdefault("retries", {"max_retries": 0})
        if max_turns is not None:
            role.setdefault("max_turns", max_turns)
        if role.get("harness") is None and field.default.harness is None:
            role["harness"] = {"id": bundled if bundled != "bash" else "null"}
    return vf.resolve_env_config(data)


def run_scripts_here() -> None:
    """Run harness programs (PEP 723 scripts) with this venv's Python instead of ``uv``."""
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime
    from verifiers.v1.utils.paths import CACHE_DIR

    async def prepare_uv_script(self: Any, script: Any, env: Any = None, **_: Any) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        path = CACHE_DIR / "envhub-scripts" / f"{hashlib.sha256(data).hexdigest()}.py"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        return [sys.executable, str(path)]

    SubprocessRuntime.prepare_uv_script = prepare_uv_script  # type: ignore[method-assign]


def pick_task(env: Any, spec: dict[str, Any]) -> Any:
    """The task the spec names: ``row`` (the taskset's task type) or ``index``."""
    taskset = env.taskset
    if "row" in spec:
        task_cls = taskset.task_type()
        data = task_cls.data_type().model_validate(spec["row"])
        return task_cls(data, taskset.config.task)
    index = int(spec.get("index", 0))
    for task in taskset:
        if task.data.idx == index:
            return task
        if task.data.idx is not None and task.data.idx > index:
            break
    raise SystemExit(f"verifiers_v1_agent: the taskset has no task {index}")


async def rollout(spec: dict[str, Any]) -> dict[str, Any]:
    """One episode of the spec's task; its reward and what it is made of."""
    import verifiers.v1 as vf

    env = vf.load_environment(env_config(spec["env"], spec.get("max_turns")))
    task = pick_task(env, spec)
    try:
        base_url = os.environ["OPENAI_BASE_URL"]
    except KeyError:
        raise SystemExit("verifiers_v1_agent: OPENAI_BASE_URL is not set") from None
    client = vf.EvalClientConfig(base_url=base_url, api_key_var="OPENAI_API_KEY")
    ctx = vf.ModelContext(
        model=os.environ.get("OPENAI_MODEL", "policy"), client=client, sampling=vf.SamplingConfig()
    )
    async with env.serving():
        episode = await env.run_episode(task, ctx)
    errors = [*episode.errors, *(e for trace in episode.traces for e in trace.errors)]
    if not episode.ok or errors:
        for error in errors:
            print(f"{error.type}: {error.message}", file=sys.stderr)
        raise SystemExit(f"verifiers_v1_agent: the rollout failed ({len(errors)} errors)")
    if len(episode.traces) != 1:
        raise SystemExit(
            f"verifiers_v1_agent: the episode has {len(episode.traces)} traces; "
            "only single-agent episodes (one trace) are supported"
        )
    (trace,) = episode.traces
    return {
        "reward": trace.reward,
        "rewards": {name: r.score for name, r in trace.rewards.items() if r is not None},
        "weights": {name: r.weight for name, r in trace.rewards.items() if r is not None},
        "metrics": dict(trace.metrics),
        "stop_condition": trace.stop_condition,
        "turns": len(trace.assistant_messages),
        "task_index": task.data.idx,
    }


def main() -> None:
    """Read the spec, run the rollout (or count the tasks), print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", action="store_true", help="print the taskset's size and exit")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sys.path.insert(0, str(HERE))  # tasksets shipped next to this script (vf_arith_v1.py)
    spec = read_spec()
    if args.count:
        import verifiers.v1 as vf

        taskset = vf.load_environment(env_config(spec["env"])).taskset
        if not taskset.bounded:
            raise SystemExit(
                'verifiers_v1_agent: the taskset is infinite; name its tasks ({"index": i} rows)'
            )
        print(json.dumps({"num_tasks": sum(1 for _ in taskset)}))
        return
    run_scripts_here()
    print(json.dumps(asyncio.run(rollout(spec))), flush=True)


if __name__ == "__main__":
    main()
