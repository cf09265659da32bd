"""``envhub install`` changes nothing it should not: pip's resolver, in dry-run/report mode,
finds the installed distributions a package's dependencies would replace (refused unless
allowed), and a package that would shadow an installed distribution or module is refused.

The dependency tests install into a fresh venv (see ``venvs``) holding ``guardlib`` 2.0, a
wheel written here; ``guardlib`` 1.0 lies next to it, reached offline through ``PIP_FIND_LINKS``
(so the dry run and the install see the same index settings).
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from conftest import ALICE
from hub_server import HubServer
from typer.testing import CliRunner
from venvs import fresh_venv
from wheels import requiring, write_wheel

from envhub.cli.app import app
from envhub.errors import ConfigError
from envhub.hub import install, pull, push

REPO = "alice/capital-cities"
runner = CliRunner()


@pytest.fixture
def venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh venv with guardlib 2.0 installed; guardlib 1.0 and 2.0 on pip's find-links."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version in ("1.0", "2.0"):
        write_wheel(wheels, "guardlib", version)
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    python = fresh_venv(tmp_path / "venv")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--no-index"]
    subprocess.run([*pip, "guardlib==2.0"], check=True, capture_output=True)
    return python


def version_in(python: Path, name: str) -> str:
    code = f"from importlib.metadata import version; print(version({name!r}))"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_a_dependency_that_would_downgrade_an_installed_one_is_refused_unless_allowed(
    hub: HubServer, package: Path, venv: Path
) -> None:
    requiring(package, "guardlib<2")
    published = push(package, token=ALICE, check=False)
    expected = "guardlib: 2.0 -> 1.0 (downgrade)"
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"not installed: {REPO}'s dependencies would change installed distributions: "
            f"{expected}. Pass --allow-changes (envhub install) or allow_changes=True to accept"
        ),
    ):
        install(f"{REPO}@0.1.0", trust=True, python=str(venv), offline=True)
    assert version_in(venv, "guardlib") == "2.0" and not Path("envhub.lock").exists()

    args = ["install", f"{REPO}@0.1.0", "--trust", "--offline", "--python", str(venv)]
    allowed = runner.invoke(app, [*args, "--allow-changes"])
    assert allowed.exit_code == 0, allowed.output
    assert allowed.output.splitlines() == [
        f"changed {expected}",
        f"{REPO} 0.1.0 installed: commit {published.commit}, envs capital-cities",
        "pinned in envhub.lock",
    ]
    assert version_in(venv, "guardlib") == "1.0"
    assert version_in(venv, "capital-cities") == "0.1.0"


def test_dependencies_already_satisfied_install_silently(
    hub: HubServer, package: Path, venv: Path
) -> None:
    requiring(package, "guardlib>=1")
    published = push(package, token=ALICE, check=False)
    pull(f"{REPO}@0.1.0")  # cached first, so that no progress bar shows in the output
    args = ["install", f"{REPO}@0.1.0", "--trust", "--offline", "--python", str(venv)]
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    assert done.output.splitlines() == [
        f"{REPO} 0.1.0 installed: commit {published.commit}, envs capital-cities",
        "pinned in envhub.lock",
    ]
    assert version_in(venv, "guardlib") == "2.0"
    again = install(f"{REPO}@0.1.0", trust=True, python=str(venv), offline=True)
    assert again.skipped_pip and again.changes == []  # its own earlier install shadows nothing


@pytest.mark.parametrize(
    ("change", "repo", "problem"),
    [
        (
            "name",
            "alice/packaging",
            f"its distribution name 'packaging' is that of the installed packaging "
            f"{metadata.version('packaging')} (rename [project] name, e.g. to 'alice-packaging')",
        ),
        (
            "colorsys",
            REPO,
            "its module 'colorsys' would shadow the standard library's 'colorsys' "
            "(rename it, e.g. to 'alice_colorsys')",
        ),
        (
            "tabulate",
            REPO,
            "its module 'tabulate' would shadow the installed tabulate's 'tabulate' "
            "(rename it, e.g. to 'alice_tabulate')",
        ),
    ],
)
def test_a_package_that_would_shadow_a_distribution_or_module_is_refused(
    hub: HubServer, package: Path, unload: list[str], change: str, repo: str, problem: str
) -> None:
    pyproject = package / "pyproject.toml"
    text = pyproject.read_text()
    if change == "name":
        pyproject.write_text(text.replace('name = "capital-cities"', 'name = "packaging"'))
    else:
        unload.append(change)
        (package / change).mkdir()
        (package / change / "__init__.py").write_text("")
        packages = 'packages = ["capital_cities"]'
        pyproject.write_text(text.replace(packages, f'packages = ["capital_cities", "{change}"]'))
    push(package, token=ALICE, check=False)
    with pytest.raises(ConfigError) as refused:
        install(f"{repo}@0.1.0", trust=True, python=sys.executable, lock_file=None)
    assert str(refused.value) == (
        f"not installed: {repo} would shadow what is installed: {problem}. "
        "Ask its author to rename it"
    )
