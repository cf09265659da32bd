"""Gates an env package passes before it is pushed: ``envhub check PACKAGE`` and ``envhub push``.

Each gate really runs; a failure in one does not hide the others.

- **metadata**: pyproject names the package, gives a valid version and a description; README exists.
- **entry points**: every ``envhub.envs`` entry point imports and constructs without arguments.
- **version**: every env's ``version`` equals the package version (``owner/name@VERSION`` means
  one thing).
- **contract**: :func:`envhub.check_env` on every env (every dataset row makes a prompt,
  determinism, schemas, finite rewards inside ``reward_range``, the empty reply at the floor, the
  reference policy at the top, close), on tasks spread over the whole dataset. A dataset row
  without a field the env needs already fails **entry points**: the env refuses it when made.
- **no answer leak**: the task's answer does not appear in the prompt. An answer can show up in a
  prompt by coincidence ("what is 5 times 1?"), a leak shows up everywhere, so the gate fails when
  the answer appears in at least half of the prompts checked (answers shorter than 2 characters
  are not checked, they would match everywhere).
- **reward audit**: :func:`envhub.audit.audit_env` on every env: adversarial policies, one or
  more per hack class (degenerate replies, junk in the answer format, hedges, stuffing,
  abstention, length, checker-fooling programs, the reference reply mutated, the env's own
  ``cheats``), must not score above its floor (``audit_floor``, else the floor of
  ``reward_range``), nor a hedge beat itself without the answer. The gate names the hack classes
  tried; every finding, with the conversation that scored and the fix, is kept in
  :attr:`PackageReport.audits`.
- **performance** (a measurement, not a gate): every env played by its scripted policy in a fresh
  interpreter (:func:`envhub.evaluation.perf.measure_target`): step latency, reset time,
  episodes/s, sandbox cold start, peak RSS and CPU time per episode, kept in
  :attr:`PackageReport.performance` with the :attr:`PackageReport.machine`. Slowness never fails
  it (a measurement that takes over ``envhub.evaluation.perf.TIMEOUT_S`` is left out); it fails
  when the env crashes under its own scripted policy (on more tasks than the contract plays), or
  its sandbox cannot run. An env that fails another gate is not measured.
- **package tests**: the package's own ``tests/`` run with pytest in a subprocess, with the
  current interpreter, from the package folder.

The publishing gates (metadata, version, performance, package tests) say whether the package is
ready for the Hub, not whether its envs work: a local check (``publish=False``, what
``envhub check DIR`` runs without ``--publish``) reports them as skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.checks.checker import CheckResult, check_env
from envhub.errors import EnvhubError
from envhub.package import env_kind, package_env_specs, read_pyproject, tool_names

LEAK_TASKS = 20
"""Tasks per env the answer-leak gate looks at."""
TEST_TIMEOUT = 600.0
PUBLISHING_GATES = ("metadata", "version", "performance", "package tests")
"""The gates only a publishing check runs (``envhub check --publish``, ``envhub push``)."""


@dataclass
class PackageReport:
    """What :func:`check_package` found."""

    name: str
    version: str
    results: list[CheckResult] = field(default_factory=list)
    envs: dict[str, str] = field(default_factory=dict)
    """Env name -> entry point target."""
    performance: dict[str, Any] = field(default_factory=dict)
    """Env name -> its :class:`envhub.evaluation.perf.Performance` (envs whose measurement ran)."""
    machine: dict[str, Any] = field(default_factory=dict)
    """The :class:`envhub.evaluation.perf.Machine` the performance was measured on (empty: none
    was)."""
    audits: dict[str, Any] = field(default_factory=dict)
    """Env name -> its reward audit (:meth:`envhub.audit.AuditReport.to_dict`): the floor, the
    policies tried and every finding with its conversation."""
    kinds: dict[str, Any] = field(default_factory=dict)
    """Env name -> ``{"kind": ..., "tools": [...]}`` of the env as constructed
    (:func:`envhub.package.env_kind`); the Hub catalog filters on them."""

    @property
    def passed(self) -> bool:
        """True when at least one gate ran and every gate passed."""
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def failures(self) -> list[CheckResult]:
        """The results of the gates that failed."""
        return [r for r in self.results if not r.passed]

    @property
    def skipped_publishing_gates(self) -> list[str]:
        """The publishing gates a local check skipped, as the table names them."""
        return [
            r.name
            for r in self.results
            if r.skipped and r.name.rpartition(": ")[2] in PUBLISHING_GATES
        ]

    def to_dict(self) -> dict[str, Any]:
        """The verdict and every gate's result (and the performance, when measured), as JSON-ready
        data."""
        data: dict[str, Any] = {
            "passed": self.passed,
            "results": [r.to_dict() for r in self.results],
        }
        if self.performance:
            data["performance"] = {"machine": self.machine, "envs": self.performance}
        if self.audits:
            data["audits"] = self.audits
        if self.kinds:
            data["kinds"] = self.kinds
        return data

    def to_markdown(self) -> str:
        """The report as the table that goes onto the Hub card."""
        rows = "\n".join(
            f"| {r.name} | {_CARD_OUTCOMES[r.outcome]} | {_cell(r.detail)} |"
            for r in self.results
        )
        verdict = "passed every gate" if self.passed else f"failed {len(self.failures)} gate(s)"
        return f"`envhub check` {verdict}:\n\n| gate | result | detail |\n|---|---|---|\n{rows}\n"


_CARD_OUTCOMES = {"ok": "pass", "fail": "FAIL", "skipped": "skipped"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:300]


def check_package(
    path: str | Path,
    *,
    seeds: int = 3,
    run_tests: bool = True,
    performance: bool = True,
    publish: bool = True,
) -> PackageReport:
    """Run every gate on the package at ``path``.

    Args:
        path: The package folder (with its pyproject.toml).
        seeds: Seeds for the env contract checks.
        run_tests: Run the package's own tests (a subprocess; the slowest gate).
        performance: Measure each env's performance (a subprocess per env, a few seconds each).
        publish: Run the publishing gates (:data:`PUBLISHING_GATES`); ``False`` reports them
            as skipped and checks only that the envs work.
    """
    root = Path(path).resolve()
    project = read_pyproject(root).get("project", {})
    report = PackageReport(str(project.get("name", "")), str(project.get("version", "")))
    gate = _gate if publish else _skipped_gate
    report.results.append(gate("metadata", lambda: _metadata(root, project)))
    envs: dict[str, Any] = {}
    report.results.append(_gate("entry points", lambda: _entry_points(root, envs, report)))
    for name, env in envs.items():
        report.results.append(
            gate(f"{name}: version", lambda env=env: _version(env, report.version))
        )
        for result in check_env(env, seeds=tuple(range(seeds)), raise_on_failure=False).results:
            report.results.append(
                CheckResult(f"{name}: {result.name}", result.passed, result.detail, result.skipped)
            )
        report.results.append(
            _gate(f"{name}: no answer leak", lambda name=name: _no_leak(envs, name))
        )
        report.results.append(
            _gate(f"{name}: reward audit", lambda name=name: _audit(envs, name, seeds, report))
        )
        if performance:
            report.results.append(
                gate(f"{name}: performance", lambda name=name: _performance(root, name, report))
            )
    if run_tests:
        report.results.append(gate("package tests", lambda: run_package_tests(root)))
    return report


def _skipped_gate(name: str, gate: Callable[[], str]) -> CheckResult:
    """A publishing gate a local check leaves out."""
    return CheckResult(name, True, "publishing gate: run with --publish", skipped=True)


def _gate(name: str, gate: Callable[[], str]) -> CheckResult:
    try:
        return CheckResult(name, True, gate())
    except Exception as e:  # each gate reports on its own
        return CheckResult(
            name, False, str(e) if isinstance(e, AssertionError) else f"{type(e).__name__}: {e}"
        )


def _metadata(root: Path, project: dict[str, Any]) -> str:
    from packaging.version import InvalidVersion, Version

    assert project.get("name"), "pyproject.toml has no [project] name"
    try:
        Version(str(project.get("version", "")))
    except InvalidVersion:
        raise AssertionError(
            f"pyproject.toml version {project.get('version')!r} is not a valid version (e.g. 0.1.0)"
        ) from None
    assert project.get("description"), "pyproject.toml has no description; the Hub card shows it"
    assert (root / "README.md").is_file(), "README.md is missing; it becomes the Hub card"
    return f"{project['name']} {project['version']}"


def _entry_points(root: Path, envs: dict[str, Any], report: PackageReport) -> str:
    specs = package_env_specs(root)
    _forget_modules({spec.target_path.partition(":")[0].split(".")[0] for spec in specs.values()})
    for name, spec in specs.items():
        report.envs[name] = spec.target_path
        factory = spec.load()
        try:
            envs[name] = factory()
        except EnvhubError as e:  # envhub named the cause (a dataset row, say): show it as is
            raise AssertionError(
                f"env {name!r} ({spec.target_path}) cannot be constructed: {e}"
            ) from e
        except Exception as e:
            raise AssertionError(
                f"env {name!r} ({spec.target_path}) cannot be constructed without arguments: "
                f"{type(e).__name__}: {e}"
            ) from e
        report.kinds[name] = {"kind": env_kind(envs[name]), "tools": tool_names(envs[name])}
    return ", ".join(f"{n} = {t}" for n, t in report.envs.items())


def _forget_modules(tops: set[str]) -> None:
    """Drop already imported modules of the package, so the check sees the files as they are now
    (a second check or push in the same process would otherwise check the first one's code)."""
    for module in [m for m in sys.modules if m.split(".")[0] in tops]:
        del sys.modules[module]


def _version(env: Any, version: str) -> str:
    assert str(env.version) == version, (
        f"{type(env).__name__}.version is {env.version!r} "
        f"but pyproject.toml says {version!r}; make them agree"
    )
    return version


def _no_leak(envs: dict[str, Any], name: str) -> str:
    from envhub.types import as_message

    env = envs[name]
    dataset = getattr(env, "dataset", None)
    if dataset is None:
        return "no dataset to check"
    checked = leaks = 0
    example = ""
    for index in range(min(len(dataset), LEAK_TASKS)):
        try:
            observation, _ = env.reset(seed=index, options={"task_index": index})
        except Exception as e:  # name the row: a bare KeyError says nothing about where
            raise AssertionError(f"task {index}: reset raised {type(e).__name__}: {e}") from e
        answer = str(getattr(getattr(env, "state", None), "answer", None) or "").strip()
        if len(answer) < 2:
            continue
        prompt = "\n".join(str(as_message(m).content or "") for m in observation)
        checked += 1
        if re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", prompt, re.IGNORECASE):
            leaks += 1
            example = example or f"task {index}: answer {answer!r}"
    assert checked == 0 or leaks * 2 < checked, (
        f"the answer appears in {leaks} of {checked} prompts ({example})"
    )
    return f"{checked} prompts checked, answer in {leaks}" if checked else "no answers to check"


def _audit(envs: dict[str, Any], name: str, seeds: int, report: PackageReport) -> str:
    """Play the degenerate policies on the env; keep every finding in ``report.audits``."""
    from envhub.audit import audit_env

    audit = audit_env(envs[name], seeds=tuple(range(seeds)), raise_on_failure=False)
    report.audits[name] = audit.to_dict()
    assert audit.passed, audit.summary()
    return audit.summary()


def _performance(root: Path, name: str, report: PackageReport) -> str:
    """Measure the env in a fresh interpreter (its peak RSS is then its own)."""
    from envhub.evaluation import perf

    failed = [r for r in report.results if r.name.startswith(f"{name}: ") and not r.passed]
    if failed:  # a broken env's speed means nothing, and its failure is already reported
        return f"not measured: {name} fails {len(failed)} gate(s)"
    try:
        measured = perf.measure_target(report.envs[name], root=root)
    except subprocess.TimeoutExpired:  # slowness is reported, never a failure
        return f"not measured: it took over {perf.TIMEOUT_S:.0f} s"
    except EnvhubError as e:  # the message already says what failed, and where
        raise AssertionError(str(e)) from e
    report.performance[name] = measured
    report.machine = report.machine or dict(perf.machine())
    return perf.summary(measured)


def run_package_tests(root: Path, timeout: float = TEST_TIMEOUT) -> str:
    """Run the package's ``tests/`` with pytest, in a subprocess of this interpreter."""
    tests = root / "tests"
    assert tests.is_dir(), "the package has no tests/ folder; add tests (envhub init writes some)"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        ),
    }
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
    try:
        done = subprocess.run(
            command, cwd=root, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the package tests did not finish within {timeout:.0f} s") from None
    lines = [line for line in done.stdout.strip().splitlines() if line.strip()]
    summary = lines[-1] if lines else done.stderr.strip()[-300:]
    assert done.returncode == 0, f"pytest exited {done.returncode}: {summary}"
    return re.sub(r" in [0-9.]+s\b", "", summary).strip(
        "= "
    )  # the card should not change with the timing
