"""``envhub check``: run the env contract checks on a package folder or an installed env."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the ``envhub check`` command to ``app``."""
    app.command("check")(check_command)


def check_command(
    target: str = typer.Argument(
        ...,
        help="An env package folder, an installed env's name, or an env file or class: "
        "path/to/file.py[:Class] or module:Class.",
    ),
    seeds: int = typer.Option(3, help="Seeds to check each env with."),
    tests: bool = typer.Option(
        True, "--tests/--no-tests", help="With --publish, also run a package folder's own tests."
    ),
    publish: bool = typer.Option(
        False,
        "--publish",
        help="Also run the publishing gates on a package folder (what `envhub push` runs): "
        "metadata and README, version, performance, its own tests.",
    ),
    model: str = typer.Option(
        None,
        "--model",
        "-m",
        help="Also pre-flight this model's chat template on each env's real episodes "
        "(a folder, a cached Hub id or smollm2-135m; offline).",
    ),
    sandbox: str = typer.Option(
        "local",
        "--sandbox",
        help="Harbor tasks: where they run: local (bubblewrap, on this machine's system), or "
        "container / podman / docker (each task in its own image, built from its Dockerfile).",
    ),
    image_map: list[str] = typer.Option(
        [],
        "--image-map",
        help="Harbor tasks in containers: IMAGE=STAND_IN, a base image to replace (one that "
        "cannot be pulled here); repeatable. Each replacement is named in the results.",
    ),
) -> None:
    """Check that envs honour the env contract.

    The contract: determinism, schemas, rewards, budgets and close.

    Every env also passes the reward audit: replies that solve nothing (empty,
    echoed, junk in the answer format, junk tool calls, many candidates at
    once, keywords and markers of the reward's own code, refusals, the longest
    and shortest replies, programs that fool a checker, the reference reply
    with its answer dropped, and the env's own cheats) must not score above
    its floor; the answer hedged among decoys must not beat the decoys alone.
    A failure prints the hack, the episode that scored and how to fix it.

    A Harbor task folder (or a folder of them, or a Harbor registry file:
    registry.json[:NAME@VERSION]) runs each task's tests twice, in fresh
    sandboxes: after its solution/solve.sh, which must score 1, and after
    nothing, which must score below 1. So does a package `envhub push`
    made of Harbor tasks (its folder, or its installed env).

    An env you wrote in a file needs no package: `envhub check my_env.py` (its
    only Env subclass) or `envhub check my_env.py:MyEnv`, or `module:MyEnv`
    for an importable module.

    A package folder also passes its entry points and the no-answer-leak gate.
    The publishing gates (metadata and README, version, performance, its own
    tests: what `envhub push` runs and puts on the Hub card) are shown as
    skipped unless --publish is given.

    With --model, the env's scripted episodes are rendered with that model's
    chat template, and every turn boundary where a prompt is not an exact token
    prefix of the next is shown, with the tokens on both sides.

    Examples:
        envhub check ./my-env
        envhub check ./my-env --publish
        envhub check lookup_sum.py:LookupSum
        envhub check calculator
        envhub check ./my-env --model smollm2-135m
        envhub check ./tasks/hello-file
        envhub check ./tasks --sandbox podman
        envhub check registry.json:my-tasks@1.0
    """
    tokenizer = _model_tokenizer(model) if model else None  # cheap checks before long ones
    tasks = _harbor_tasks(target)
    if tasks is not None:
        passed = _check_tasks(tasks, sandbox, _image_map(image_map))
    elif Path(target).is_dir():
        passed = _check_package(Path(target), seeds, tests, publish)
    else:
        _refuse_publish(target, publish)
        passed = _check_installed(target, seeds)
    if tokenizer is not None:
        passed = _preflight(target, model, tokenizer) and passed
    if not passed:
        raise typer.Exit(code=1)


def _harbor_tasks(target: str) -> str | None:
    """The Harbor tasks ``target`` stands for: a task folder (or folder of them), a package
    ``envhub push`` made of them, or such a package's installed env; else ``None``."""
    from envhub.hub.harbor_package import harbor_tasks_of
    from envhub.loader import get_spec, is_task_path

    if is_task_path(target):
        return target
    if Path(target).is_dir():
        tasks = harbor_tasks_of(Path(target))
        return None if tasks is None else str(tasks)
    factory = get_spec(target).load()
    from envhub.harbor.env import HarborEnv

    if isinstance(factory, type) and issubclass(factory, HarborEnv):
        with _construct(target, get_spec(target)) as env:
            return str(env.path)
    return None


def _refuse_publish(target: str, publish: bool) -> None:
    """--publish checks a package: an installed name or an env file has none to check."""
    from envhub.errors import ConfigError

    if publish:
        raise ConfigError(
            f"--publish runs the publishing gates on a package folder; {target} is not one. "
            "Make a package with `envhub init NAME`, move the env into it, then run "
            "`envhub check NAME --publish`"
        )


def _check_installed(name: str, seeds: int) -> bool:
    """The env contract and the reward audit on an installed env or an env reference; True
    when both pass."""
    from envhub.audit import audit_env
    from envhub.checks.checker import CheckResult, check_env
    from envhub.cli.console import console
    from envhub.loader import get_spec
    from envhub.references import display_name, parse_reference
    from envhub.registry import list_envs

    spec = get_spec(name)
    report = check_env(_construct(name, spec), seeds=tuple(range(seeds)), raise_on_failure=False)
    with _construct(name, spec) as env:  # check_env closed the first one
        audit = audit_env(env, seeds=tuple(range(seeds)), raise_on_failure=False)
    report.results.append(CheckResult("reward audit", audit.passed, audit.summary()))
    is_reference = parse_reference(name) is not None and name not in list_envs()
    report.env_name = f"{display_name(name)} ({name})" if is_reference else name
    console.print(report)
    _show_audit_finding(name, audit.to_dict())
    if is_reference:
        console.print(
            "Local check: the publishing gates (metadata and README, version, performance, "
            "tests) need a package; `envhub init NAME` makes one, and `envhub check NAME "
            "--publish` runs them.",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    return report.passed


def _show_audit_finding(name: str, audit: dict) -> None:
    """Print the first audited episode that beat the floor, whole, for a reader to judge."""
    from envhub.audit import AuditFinding
    from envhub.cli.console import console

    if not audit["findings"]:
        return
    finding = AuditFinding.from_dict(audit["findings"][0])
    head = f"{name}: reward audit: {finding.describe(audit['floor'])}. The episode:"
    fix = f"How to fix it: {finding.fix}." if finding.fix else ""
    console.print(f"\n{head}\n{finding.transcript()}\n{fix}", markup=False, highlight=False)


def _construct(name: str, spec):
    from envhub.errors import EnvhubError, EnvLoadError

    factory = spec.load()
    try:
        return factory()
    except EnvhubError as e:  # envhub named the cause (a dataset row, say): show it as is
        raise EnvLoadError(f"env {name!r} cannot be constructed: {e}") from e
    except Exception as e:
        raise EnvLoadError(
            f"env {name!r} cannot be constructed without arguments: {type(e).__name__}: {e}"
        ) from e


def _model_tokenizer(model: str):
    from envhub.errors import MissingDependencyError

    try:
        from envhub.trainer.engines.hf_tokenizer import load_chat_tokenizer
    except ImportError as e:
        raise MissingDependencyError.for_extra("transformers", "train") from e
    return load_chat_tokenizer(model)


def _preflight(target: str, model: str, tokenizer) -> bool:
    """Render every env's scripted episodes with ``model``'s template; True when no turn
    boundary breaks the token prefix."""
    import asyncio

    from envhub.checks.doctor import check_prefix_property, env_conversations
    from envhub.cli.doctor import report_prefix_findings
    from envhub.loader import get_spec
    from envhub.package import package_env_specs
    from envhub.rollout.tool_prompt import template_renders_tools

    specs = package_env_specs(target) if Path(target).is_dir() else {target: get_spec(target)}
    renders = asyncio.run(template_renders_tools(tokenizer))
    passed = True
    for name, spec in specs.items():
        with _construct(name, spec) as env:
            conversations = env_conversations(env)
        checked, findings = asyncio.run(check_prefix_property(tokenizer, conversations))
        subject = f"{name} x {model} on {len(conversations)} scripted episodes"
        passed &= report_prefix_findings(subject, renders, checked, findings)
    return passed


def _image_map(pairs: list[str]) -> dict[str, str]:
    """``IMAGE=STAND_IN`` options as a map."""
    from envhub.errors import ConfigError

    bad = [pair for pair in pairs if "=" not in pair or pair.startswith("=") or pair.endswith("=")]
    if bad:
        raise ConfigError(f"--image-map takes IMAGE=STAND_IN, got {bad[0]!r}")
    return dict(pair.split("=", 1) for pair in pairs)


def _check_tasks(target: str, sandbox: str = "local", image_map: dict | None = None) -> bool:
    """Each Harbor task's solution scores 1 and doing nothing scores below 1."""
    from rich.table import Table

    from envhub.cli.console import console
    from envhub.harbor.check import check_tasks

    checks = check_tasks(target, sandbox=sandbox, image_map=image_map)
    passed = all(c.passed for c in checks)
    where = "" if sandbox == "local" else f" (in containers: {sandbox})"
    table = Table(
        title=f"{target}{where}: {'[green]passed' if passed else '[red]FAILED'}[/]",
        title_justify="left",
    )
    images = any(c.image for c in checks)
    for column in ("task", "with solution", "without", "result", *(["image"] if images else [])):
        table.add_column(column, overflow="fold")
    for c in checks:
        solved = "-" if c.solved is None else f"{c.solved:g}"
        verdict = "[green]ok[/]" if c.passed else "[red]fail[/]"
        unsolved = "-" if c.unsolved is None else f"{c.unsolved:g}"
        table.add_row(c.name, solved, unsolved, verdict, *([c.image] if images else []))
    console.print(table)
    for c in checks:
        if c.error:
            console.print(f"{c.name}: {c.error}", markup=False, highlight=False, soft_wrap=True)
    return passed


def _check_package(path: Path, seeds: int, tests: bool, publish: bool) -> bool:
    from envhub.checks.package import check_package
    from envhub.checks.table import results_table
    from envhub.cli.console import console

    report = check_package(path, seeds=seeds, run_tests=tests, publish=publish)
    console.print(
        results_table(
            report.name,
            report.results,
            passed=report.passed,
            note=f" (version {report.version})",
            first_column="gate",
        )
    )
    for name, audit in report.audits.items():
        _show_audit_finding(name, audit)
    skipped = report.skipped_publishing_gates
    if skipped:
        console.print(
            f"Local check: skipped the publishing gates ({', '.join(skipped)}); "
            f"`envhub check {path} --publish` runs them, as `envhub push` does.",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    return report.passed
