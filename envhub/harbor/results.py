"""Episodes of Harbor tasks written as a Harbor job folder, to compare with Harbor's reports.

:func:`write_harbor_job` lays trajectories out as Harbor's ``harbor run`` does (its
``JobResult`` and ``TrialResult`` documents, schema version 1)::

    DIR/config.json             job_name, n_attempts, the tasks' paths
    DIR/result.json             id, n_total_trials, stats (n_completed_trials, n_errored_trials,
                                evals["AGENT__MODEL__adhoc"]: n_trials, metrics [{"mean"}],
                                pass_at_k, reward_stats)
    DIR/TASK__XXXXXXX/config.json   the trial: task path, trial_name, agent name and model
    DIR/TASK__XXXXXXX/result.json   task_name, trial_name, task_id {path}, agent_info,
                                    verifier_result {rewards {"reward": R}}, exception_info,
                                    started_at, finished_at
    DIR/TASK__XXXXXXX/verifier/reward.txt

A task's name and a trial's reward are Harbor's (``[task] name`` else the folder's;
``rewards = {"reward": R}``, as Harbor reads a ``reward.txt``), so a per-task comparison with
a Harbor job of the same tasks lines up; pass@k follows Harbor's rule (only when every reward
is 0 or 1; k = 2, 4, 8... and 5, 10, 15... up to the fewest trials of a task). What envhub
does not know is left out or empty: ``task_checksum`` (Harbor's own directory hash), the
agent's token counts, the timing of each phase; an episode's infrastructure error becomes the
trial's ``exception_info``, and so does a test script that wrote no reward (``VerifierError``;
envhub scores it 0), with no rewards, as in Harbor.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envhub.errors import ConfigError

if TYPE_CHECKING:
    from envhub.harbor.task import HarborTask
    from envhub.types import Trajectory

_ALPHABET = "23456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"  # shortuuid's


def check_harbor_target(env_name: str) -> None:
    """Accept ``env_name`` when it names Harbor tasks (a task folder, a folder of them, a
    registry file), before an eval whose episodes go to a Harbor job.

    Raises:
        ConfigError: It names something else.
    """
    from envhub.harbor.registry import split_reference
    from envhub.harbor.task import is_task_folder

    folder = Path(env_name)
    if split_reference(env_name) is not None or is_task_folder(folder):
        return
    if folder.is_dir() and any(is_task_folder(p) for p in folder.iterdir()):
        return
    raise ConfigError(
        f"--harbor-results writes Harbor's job layout for Harbor tasks; {env_name!r} is no task "
        "folder, folder of them or registry file (registry.json[:NAME@VERSION])"
    )


def export_eval(
    eval_folder: str | Path, job: str | Path, env_name: str, env_args: Mapping[str, Any]
) -> Path:
    """Write an ``envhub eval`` output folder's episodes (``trajectories.jsonl``, the model
    from ``config.json``) as a Harbor job in ``job`` (:func:`write_harbor_job`), the tasks
    read from the env ``env_name`` makes with ``env_args``."""
    from envhub import make
    from envhub.rollout.io import read_trajectories

    folder = Path(eval_folder)
    model = json.loads((folder / "config.json").read_text()).get("model")
    trajectories = read_trajectories(folder / "trajectories.jsonl")
    with make(env_name, **env_args) as env:
        harbor = getattr(env, "harbor", env)  # a HarborAgentEnv's tasks are its HarborEnv's
        tasks = {i: harbor.task_of(row) for i, row in enumerate(harbor.dataset)}
    agent = env_args.get("agent")  # a named agent's name (mini-swe-agent), else envhub's loop
    agent = agent if isinstance(agent, str) else "envhub"
    return write_harbor_job(job, trajectories, tasks, agent=agent, model=model)


def write_harbor_job(
    folder: str | Path,
    trajectories: Sequence[Trajectory],
    tasks: Mapping[int, HarborTask],
    *,
    agent: str = "envhub",
    model: str | None = None,
) -> Path:
    """Write ``trajectories`` (episodes of Harbor tasks) as a Harbor job in ``folder``.

    Args:
        folder: The job folder (made; its name is the job's).
        trajectories: One per trial.
        tasks: The Harbor task of each trajectory's ``task_index``.
        agent: The agent's name in Harbor's results (``agent_info.name``).
        model: The model's name (``agent_info.model_info.name``).

    Raises:
        KeyError: A trajectory whose task is not in ``tasks``.
    """
    job = Path(folder)
    job.mkdir(parents=True, exist_ok=True)
    job_id = str(uuid.uuid4())
    trials = [
        _write_trial(job, trajectory, tasks[trajectory.task_index], job_id, agent, model)
        for trajectory in trajectories
    ]
    paths = sorted({str(task.path) for task in tasks.values()})
    config = {"job_name": job.name, "jobs_dir": str(job.parent), "n_attempts": 1,
              "tasks": [{"path": path} for path in paths]}  # fmt: skip
    _dump(job / "config.json", config)
    _dump(job / "result.json", _job_result(job_id, trials, agent, model))
    return job


def _write_trial(
    job: Path, trajectory: Trajectory, task: HarborTask, job_id: str, agent: str, model: str | None
) -> dict[str, Any]:
    """One trial's folder; its ``result.json`` document."""
    short = task.name.split("/")[-1][:32].rstrip("_-")
    name = f"{short}__{''.join(secrets.choice(_ALPHABET) for _ in range(7))}"
    folder = job / name
    (folder / "verifier").mkdir(parents=True)
    agent_config = {"name": agent, "model_name": model}
    config = {"task": {"path": str(task.path)}, "trial_name": name, "trials_dir": str(job),
              "agent": agent_config, "job_id": job_id}  # fmt: skip
    failure = next((e for e in trajectory.errors if e.infra or e.type == "VerifierError"), None)
    rewards = None if failure is not None else {"reward": trajectory.reward}
    if rewards is not None:
        (folder / "verifier" / "reward.txt").write_text(f"{trajectory.reward:g}\n")
    finished = datetime.now(UTC)
    started = finished - timedelta(seconds=trajectory.seconds)
    result = {
        "schema_version": 1, "id": str(uuid.uuid4()), "task_name": task.name, "trial_name": name,
        "trial_uri": folder.resolve().as_uri(), "task_id": {"path": str(task.path)},
        "source": None, "task_checksum": "", "config": config,
        "agent_info": {"name": agent, "version": "envhub",
                       "model_info": {"name": model, "provider": None} if model else None},
        "verifier_result": {"rewards": rewards},
        "verifier_environment_mode": "separate" if task.separate else "shared",
        "exception_info": None if failure is None else {
            "exception_type": failure.type, "exception_message": failure.message,
            "exception_traceback": "", "occurred_at": finished.isoformat()},
        "started_at": started.isoformat(), "finished_at": finished.isoformat(),
    }  # fmt: skip
    _dump(folder / "config.json", config)
    _dump(folder / "result.json", result)
    return result


def _job_result(
    job_id: str, trials: list[dict[str, Any]], agent: str, model: str | None
) -> dict[str, Any]:
    """Harbor's ``JobResult`` of ``trials`` (their ``result.json`` documents)."""
    scored = [t for t in trials if t["verifier_result"]["rewards"] is not None]
    reward_stats: dict[str, dict[str, list[str]]] = {"reward": defaultdict(list)}
    for trial in scored:
        value = trial["verifier_result"]["rewards"]["reward"]
        reward_stats["reward"][_key(value)].append(trial["trial_name"])
    errors: dict[str, list[str]] = defaultdict(list)
    for trial in trials:
        if trial["exception_info"] is not None:
            errors[trial["exception_info"]["exception_type"]].append(trial["trial_name"])
    rewards = [t["verifier_result"]["rewards"]["reward"] if t in scored else 0 for t in trials]
    evals = {
        "n_trials": len(scored), "n_errors": len(trials) - len(scored),
        "metrics": [{"mean": sum(rewards) / len(rewards)}] if trials else [],
        "pass_at_k": pass_at_k(scored), "reward_stats": reward_stats, "exception_stats": errors,
    }  # fmt: skip
    key = f"{agent}__{model}__adhoc" if model else f"{agent}__adhoc"
    now = datetime.now(UTC).isoformat()
    stats = {"n_completed_trials": len(trials), "n_errored_trials": len(trials) - len(scored),
             "n_running_trials": 0, "n_pending_trials": 0, "n_cancelled_trials": 0,
             "n_retries": 0, "evals": {key: evals}}  # fmt: skip
    return {"schema_version": 1, "id": job_id, "started_at": now, "updated_at": now,
            "finished_at": now, "n_total_trials": len(trials), "stats": stats}  # fmt: skip


def pass_at_k(trials: list[dict[str, Any]]) -> dict[str, float]:
    """Harbor's pass@k over scored trials: the mean over tasks of the unbiased estimate, for
    k = 2, 4, 8... and 5, 10, 15... up to the fewest trials of a task; nothing when a reward
    is not 0 or 1."""
    successes: dict[str, list[int]] = defaultdict(list)
    for trial in trials:
        value = trial["verifier_result"]["rewards"]["reward"]
        if value not in (0, 1):
            return {}
        successes[trial["task_name"]].append(int(value))
    if not successes:
        return {}
    fewest = min(len(s) for s in successes.values())
    ks = sorted({*_powers_of_two(fewest), *range(5, fewest + 1, 5)})
    return {
        str(k): sum(_estimate(len(s), sum(s), k) for s in successes.values()) / len(successes)
        for k in ks
    }


def _powers_of_two(limit: int) -> list[int]:
    found, k = [], 2
    while k <= limit:
        found.append(k)
        k *= 2
    return found


def _estimate(n: int, c: int, k: int) -> float:
    """1 - C(n - c, k) / C(n, k): the chance that k of n trials hold a pass."""
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(k):
        product *= (n - c - i) / (n - i)
    return 1.0 - product


def _key(value: float) -> str:
    """A reward as JSON writes a number key (``1.0``, ``0.5``)."""
    return json.dumps(float(value))


def _dump(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=4) + "\n")
