"""``envhub eval``: roll out an env against a model and summarise the results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import typer

from envhub.cli.serve_model import DEFAULT_MODEL
from envhub.defaults import EPISODE_TIMEOUT_S, STEP_TIMEOUT_S


def register(app: typer.Typer) -> None:
    """Add the ``envhub eval`` command to ``app``."""
    app.command("eval")(eval_command)


def eval_command(
    env: str = typer.Argument(
        ...,
        help="An installed env's name (see `envhub list`), your env's code: "
        "path/to/file.py[:Class] or module:Class, or Harbor tasks: a task folder, a folder of "
        "them, or a registry file (registry.json[:NAME@VERSION]).",
    ),
    model: str = typer.Option(
        None,
        "--model",
        "-m",
        help=f"Model to query; with --serve, the model to serve: {DEFAULT_MODEL} by default.",
    ),
    base_url: str = typer.Option(
        None, "--base-url", "-u", help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1."
    ),
    serve: bool = typer.Option(
        False, "--serve", help="Start a local vLLM server for --model, and stop it afterwards."
    ),
    num_tasks: int = typer.Option(
        10, "-n", "--num-tasks", min=1, metavar="N", help="Tasks to evaluate (drawn with --seed)."
    ),
    rollouts: int = typer.Option(
        3, "-r", "--rollouts", min=1, metavar="N", help="Samples per task (pass@k uses them)."
    ),
    max_tokens: int = typer.Option(512, help="Tokens per assistant turn."),
    temperature: float = typer.Option(0.7, help="Sampling temperature."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling."),
    concurrency: int = typer.Option(32, help="Episodes in flight at once."),
    env_args: list[str] = typer.Option(
        [],
        "--env-arg",
        "-a",
        # Short type labels leave the help column room for the default model id, whole.
        metavar="KEY=VALUE",
        help="Env constructor argument KEY=VALUE (VALUE parsed as JSON when it can be); "
        "repeatable.",
    ),
    mode: str = typer.Option(
        "auto", help="auto | tokens (token-in/token-out, vLLM) | chat (any OpenAI server)."
    ),
    seed: int = typer.Option(0, help="Seed for task choice and env randomness."),
    output: Path = typer.Option(
        None, "--output", "-o", help="Folder for results (default outputs/eval/ENV-MODEL-TIME)."
    ),
    api_key: str = typer.Option(None, envvar="OPENAI_API_KEY", help="Bearer token for the server."),
    step_timeout: float = typer.Option(STEP_TIMEOUT_S, help="Seconds an env step may take."),
    episode_timeout: float = typer.Option(EPISODE_TIMEOUT_S, help="Seconds an episode may take."),
    push: bool = typer.Option(
        False, "--push", help="Record the result on the env's Hub repo (its leaderboard)."
    ),
    push_repo: str = typer.Option(
        None, metavar="OWNER/NAME", help="The env's Hub repo (default: where it came from)."
    ),
    push_trajectories: bool = typer.Option(
        False,
        "--push-trajectories",
        help="With --push: the episodes too, as a dataset in a repo of their own "
        "(OWNER/ENV-MODEL-trajectories), linked from the result.",
    ),
    by: str = typer.Option(None, help="Who ran the eval, on the result (default: the pusher)."),
    model_revision: str = typer.Option(None, help="The model's revision, on the result."),
    hub_token: str = typer.Option(None, envvar="HF_TOKEN", help="Hub token for --push."),
    harbor_results: Path = typer.Option(
        None, metavar="DIR", help="Harbor tasks: the episodes also as a Harbor job folder."
    ),
) -> None:
    """Evaluate a model on an env: a summary table, results as JSONL.

    Give --base-url for a running server, or --serve to start vLLM for the run.
    Named tasks (Harbor's) also get a row each: episodes, mean reward, pass@k.
    With --push, the result goes on the env's Hub repo (see `envhub leaderboard`).

    Examples:
        envhub eval calculator --serve -n 8 -r 2
        envhub eval arithmetic -u http://127.0.0.1:8000/v1 -n 50 -r 4
        envhub eval wordle -u https://api.openai.com/v1 -m gpt-4o-mini --mode chat
        envhub eval alice/capital-cities@0.1.0 -u http://127.0.0.1:8000/v1 --push
    """
    from envhub.cli.serve_model import start_local_vllm
    from envhub.errors import ConfigError

    if not base_url and not serve:
        raise ConfigError(
            "give --base-url URL of an OpenAI-compatible server (`envhub serve-model` starts "
            "one), or --serve to start vLLM for this run"
        )
    if base_url and serve:
        raise ConfigError("--base-url and --serve exclude each other")
    if mode not in ("auto", "tokens", "chat"):
        raise ConfigError(f"--mode must be auto, tokens or chat, got {mode!r}")
    if push_trajectories and not push:
        raise ConfigError("--push-trajectories goes with --push (the result links to them)")
    kwargs = parse_env_args(env_args)
    if harbor_results is not None:
        from envhub.harbor.results import check_harbor_target

        check_harbor_target(env)
    plan = plan_tasks(env, kwargs, num_tasks, seed)  # a bad env name or argument fails here
    pusher = _pusher(hub_token) if push else None  # no token: fail before the eval, not after
    model = model or (DEFAULT_MODEL if serve else None)
    server = start_local_vllm(model) if serve else None
    try:
        folder = run_eval(
            env, kwargs, base_url=server.base_url if server else base_url, model=model,
            api_key=api_key, mode=mode, plan=plan, rollouts=rollouts, seed=seed,
            concurrency=concurrency,
            sampling={"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p},
            timeouts=(step_timeout, episode_timeout), output=output,
        )  # fmt: skip
    finally:
        if server is not None:
            server.stop()
    if harbor_results is not None:
        from envhub.cli.console import console
        from envhub.harbor.results import export_eval

        job = export_eval(folder, harbor_results, env, kwargs)
        console.print(f"harbor job: {job}", soft_wrap=True)
    if pusher is not None:
        from envhub.cli.leaderboard import push_eval

        push_eval(folder, env, repo=push_repo, pushed_by=pusher, by=by,
                  model_revision=model_revision, token=hub_token,
                  trajectories=push_trajectories)  # fmt: skip


def _pusher(token: str | None) -> str:
    from envhub.hub.result_push import whoami

    return whoami(token)


def parse_env_args(items: list[str]) -> dict[str, Any]:
    """``["k=1", "name=easy"]`` -> ``{"k": 1, "name": "easy"}``."""
    from envhub.errors import ConfigError

    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--env-arg must look like KEY=VALUE, got {item!r}")
        try:
            kwargs[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key.strip()] = value
    return kwargs


class TaskPlan(NamedTuple):
    """What an eval runs, learned by making the env once before any server starts."""

    indices: list[int]
    pass_threshold: float
    num_tools: int
    tools_from_program: bool = False
    """A harness env's tools come with its program's calls."""


def plan_tasks(env_name: str, env_kwargs: dict[str, Any], num_tasks: int, seed: int) -> TaskPlan:
    """Make the env once (an unknown name or a bad argument fails here, in a second, rather
    than after a server start) and choose the tasks."""
    from envhub import make

    with make(env_name, **env_kwargs) as probe:
        return TaskPlan(
            choose_tasks(probe, num_tasks, seed),
            probe.pass_threshold,
            len(probe.tool_schemas or ()),
            bool(getattr(probe, "tools_come_from_program", False)),
        )


def run_eval(env_name: str, env_kwargs: dict[str, Any], *, base_url: str, model: str | None,
             api_key: str | None, mode: str, plan: TaskPlan, rollouts: int, seed: int,
             concurrency: int, sampling: dict[str, Any], timeouts: tuple[float, float],
             output: Path | None) -> Path:  # fmt: skip
    """Run the evaluation (:func:`envhub.evaluation.evaluate`) and save it; returns the output
    folder."""
    import asyncio
    import time

    from envhub.cli.console import console
    from envhub.evaluation import episode_key, evaluate
    from envhub.inference.base import SamplingParams
    from envhub.inference.openai_http import OpenAIEngine
    from envhub.rollout.io import TrajectoryWriter
    from envhub.rollout.manifest import manifest
    from envhub.rollout.tool_prompt import where_tools_go

    indices = plan.indices
    engine = OpenAIEngine(base_url, model, api_key=api_key, mode=mode, max_concurrency=concurrency)
    folder = output or default_output(env_name, model or "server")
    started = time.perf_counter()
    with (
        TrajectoryWriter(folder / "trajectories.jsonl") as writer,
        _progress(len(indices) * rollouts) as advance,
    ):
        seen: set[tuple[Any, ...]] = set()

        def record(trajectory: Any) -> None:
            writer.write(trajectory)
            # The bar counts episodes: a multi-role episode's trajectories (one per actor) once.
            episode = episode_key(trajectory)
            advance(trajectory.reward, episode not in seen)
            seen.add(episode)

        async def go() -> Any:
            try:
                await engine.start()
                if plan.num_tools or plan.tools_from_program:
                    where = await where_tools_go(
                        engine.tokenizer, plan.num_tools, plan.tools_from_program
                    )
                    console.print(f"tools: {where}")
                return await evaluate(
                    engine, env_name, indices, env_args=env_kwargs, samples_per_task=rollouts,
                    sampling=SamplingParams(**sampling), max_concurrency=concurrency,
                    step_timeout=timeouts[0], episode_timeout=timeouts[1], seed=seed,
                    pass_threshold=plan.pass_threshold, on_trajectory=record,
                )  # fmt: skip
            finally:
                await engine.aclose()

        result = asyncio.run(go())
    # The time from before the engine's start, as the table's episodes/s has always counted it.
    summary = result.summary.model_copy(update={"seconds": time.perf_counter() - started})
    trajectories = result.trajectories
    config = {"env": env_name, "env_args": env_kwargs, "model": engine.model, "base_url": base_url,
              "mode": engine.mode, "tasks": indices, "rollouts": rollouts, "seed": seed,
              "sampling": sampling, **manifest(trajectories)}  # fmt: skip
    (folder / "summary.json").write_text(summary.model_dump_json(indent=2))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    console.print(summary_table(summary, f"{env_name} x {engine.model}"))
    if summary.per_task:
        console.print(task_table(summary.per_task))
    console.print(f"results: {folder}", soft_wrap=True)
    return folder


def choose_tasks(env: Any, n: int, seed: int) -> list[int]:
    """``n`` distinct task indices drawn with ``seed``, sorted (all of them if n >= the dataset)."""
    import numpy as np

    size = len(env.dataset) if hasattr(env, "dataset") else n
    if n >= size:
        return list(range(size))
    return sorted(int(i) for i in np.random.default_rng(seed).choice(size, n, replace=False))


def default_output(env_name: str, model: str) -> Path:
    """``outputs/eval/ENV-MODEL-TIME``: the model's last path part, made safe for a folder name."""
    import re
    import time

    from envhub.references import display_name

    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model.rstrip("/").split("/")[-1])
    env = display_name(env_name)  # an env file is named by its env, not its path
    return Path("outputs") / "eval" / f"{env}-{slug}-{time.strftime('%Y%m%d-%H%M%S')}"


class _progress:
    """A rich progress bar over episodes showing the running mean reward (of every
    trajectory: each actor's of a multi-role episode)."""

    def __init__(self, total: int) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        from envhub.cli.console import err_console

        self.bar = Progress(TextColumn("[bold]episodes"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.description}"), TimeElapsedColumn(),
                            console=err_console, transient=False)  # fmt: skip
        self.task = self.bar.add_task("reward -", total=total)
        self.total, self.count = 0.0, 0

    def __enter__(self):
        self.bar.start()
        return self.advance

    def advance(self, reward: float, new_episode: bool = True) -> None:
        """One trajectory done, with its reward; ``new_episode``: the first of its episode."""
        self.total, self.count = self.total + reward, self.count + 1
        self.bar.update(
            self.task,
            advance=int(new_episode),
            description=f"mean reward {self.total / self.count:.3f}",
        )

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()


def outcomes_line(outcomes: dict[str, int]) -> str:
    """``"ok 4, policy_failure 1, infra_failure 1"``: the outcomes that occurred, in the
    taxonomy's order (``-`` for a summary saved before outcomes were counted)."""
    return ", ".join(f"{name} {n}" for name, n in outcomes.items() if n) or "-"


TOKEN_DRIFT_HINT = (
    "the chat template re-rendered an earlier turn unlike the tokens sampled (kept as sampled, "
    "never re-tokenised). Test the template: `envhub check ENV --model MODEL`; docs: Concepts > "
    "Token-exact multi-turn"
)
"""What token drift is and what to do, after its count in the eval and training summaries."""


def drift_line(episodes: int) -> str:
    """``"0 episodes"``, or the count with what it means (:data:`TOKEN_DRIFT_HINT`)."""
    count = f"{episodes} episode{'' if episodes == 1 else 's'}"
    return f"{count}: {TOKEN_DRIFT_HINT}" if episodes else count


COMPONENT_NOTES = {"tool_validity": "mean per episode; an episode without calls scores 1"}
"""What a built-in reward component's mean is, where another row could seem to contradict it
(:func:`envhub.rewards.format.tool_call_validity` beside "valid tool calls")."""


def component_rows(components: dict[str, float]) -> list[tuple[str, str]]:
    """One indented row per reward component's mean, with its note if it has one."""
    return [
        (
            f"  {name}",
            f"{value:.3f}" + (f" ({COMPONENT_NOTES[name]})" if name in COMPONENT_NOTES else ""),
        )
        for name, value in components.items()
    ]


def tool_rows(summary: Any) -> list[tuple[str, str]]:
    """Calls per episode (how many, in how many episodes), then how many of all the calls were
    valid, then the invalid ones by kind. The count is pooled over calls: a per-episode
    ``tool_validity`` reward component, which scores an episode without calls 1.0, is another
    number."""
    total = summary.tool_calls_total or round(summary.tool_calls * summary.episodes)
    calls = f"{summary.tool_calls:.2f}"
    if summary.episodes_with_tool_calls:  # unknown (0) in a summary saved before it was counted
        calls += f" ({total} in {summary.episodes_with_tool_calls} of {summary.episodes} episodes)"
    valid = "-"
    if summary.tool_validity is not None:
        ok = round(summary.tool_validity * total)
        valid = f"{ok} of {total} ({summary.tool_validity:.1%})"
    return [
        ("tool calls / episode", calls),
        ("valid tool calls", valid),
        *((f"  {kind}", str(n)) for kind, n in summary.tool_errors.items()),
    ]


def role_line(role: dict[str, Any]) -> str:
    """``reward 0.250, 8 trajectories (win 2, loss 6), pass@1 0.250, pass@2 0.500``: one role
    of a multi-role eval (pass@k per task over that role's trajectories, where saved)."""
    results = ", ".join(f"{k} {v}" for k, v in sorted(role["results"].items()))
    passes = "".join(f", pass@{k} {v:.3f}" for k, v in role.get("pass_at", {}).items())
    line = f"reward {role['reward_mean']:.3f}, {role['trajectories']} trajectories ({results})"
    return line + passes


def episodes_line(summary: Any) -> str:
    """``4 (2 tasks x 2)``, and with a multi-role env how many trajectories they recorded."""
    line = f"{summary.episodes} ({summary.tasks} tasks x {summary.samples_per_task})"
    records = getattr(summary, "trajectories", 0)
    if records and records != summary.episodes:
        line += f", {records} trajectories"
    return line


def task_table(rows: list[dict[str, Any]]):
    """The per-task rows of a summary (:attr:`~envhub.evaluation.EvalSummary.per_task`) as a
    rich table: task, episodes, mean reward, pass@k for each k any task has (``-`` where a
    task has fewer samples)."""
    from rich.table import Table

    ks = sorted({int(k) for row in rows for k in row["pass_at"]})
    table = Table(title="per task", title_justify="left")
    for column in ("task", "episodes", "reward", *(f"pass@{k}" for k in ks)):
        table.add_column(column, overflow="fold")
    for row in rows:
        passes = {int(k): v for k, v in row["pass_at"].items()}
        table.add_row(
            row["task"], str(row["episodes"]), f"{row['reward_mean']:.3f}",
            *(f"{passes[k]:.3f}" if k in passes else "-" for k in ks),
        )  # fmt: skip
    return table


def summary_table(summary: Any, title: str):
    """The eval summary as a two-column rich table."""
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value")
    rows = [
        ("episodes", episodes_line(summary)),
        ("reward", f"{summary.reward_mean:.3f} ± {summary.reward_std:.3f}"),
        *component_rows(summary.components),
        *((f"pass@{k}", f"{value:.3f}") for k, value in summary.pass_at.items()),
        *((f"role {role}", role_line(r)) for role, r in getattr(summary, "roles", {}).items()),
        *tool_rows(summary),
        ("turns / episode", f"{summary.turns_mean:.2f}"),
        ("completion tokens / episode", f"{summary.completion_tokens_mean:.1f}"),
        ("stop reasons", ", ".join(f"{k} {v}" for k, v in sorted(summary.stop_reasons.items()))),
        ("outcomes", outcomes_line(summary.outcomes)),
        (
            "episodes with errors",
            str(summary.episodes_with_errors)
            + (
                f" ({', '.join(f'{k} {v}' for k, v in summary.error_stages.items())})"
                if summary.error_stages
                else ""
            ),
        ),
        ("token drift", drift_line(summary.token_drift_episodes)),
    ]
    if (
        summary.seconds > 0
    ):  # unknown (0) for trajectories saved without a summary, e.g. by `envhub train`
        rows.append(
            (
                "time",
                f"{summary.seconds:.1f} s ({summary.episodes / summary.seconds:.2f} episodes/s)",
            )
        )
    for name, value in rows:
        table.add_row(name, value)
    return table
