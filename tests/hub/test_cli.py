"""``envhub push / pull / install / search / list --hub / check PACKAGE`` through the CLI."""

from __future__ import annotations

from pathlib import Path

from conftest import ALICE
from hub_server import HubServer
from typer.testing import CliRunner

from envhub.cli.app import app
from envhub.errors import ConfigError

runner = CliRunner()


def test_push_pull_search_and_list_hub(hub: HubServer, package: Path) -> None:
    (package / "credentials.json").write_text("{}")
    pushed = runner.invoke(app, ["push", str(package), "--token", ALICE, "--skip-tests"])
    assert pushed.exit_code == 0, pushed.output
    commit = hub.repos[("model", "alice/capital-cities")].tags["0.1.0"]
    assert "skipped credentials.json: looks like a secret" in pushed.output
    assert (
        f"alice/capital-cities@0.1.0 published: commit {commit}, 7 files, sha256:" in pushed.output
    )
    again = runner.invoke(app, ["push", str(package), "--token", ALICE, "--skip-check"])
    assert "alice/capital-cities@0.1.0 already published, same content" in again.output

    versions = runner.invoke(app, ["pull", "alice/capital-cities", "--list"])
    assert versions.exit_code == 0 and versions.output == f"0.1.0  {commit}\n"
    pulled = runner.invoke(app, ["pull", "alice/capital-cities@0.1.0"])
    assert (
        pulled.exit_code == 0 and f"alice/capital-cities 0.1.0 at commit {commit}" in pulled.output
    )

    for command in (["search", "capital"], ["list", "--hub"]):
        found = runner.invoke(app, command)
        assert found.exit_code == 0 and "alice/capital-cities" in found.output, found.output
    assert "alice/capital-cities" not in runner.invoke(app, ["search", "nothing"]).output


def test_install_without_trust_shows_the_plan_and_installs_nothing(
    hub: HubServer, package: Path
) -> None:
    runner.invoke(app, ["push", str(package), "--token", ALICE, "--skip-check"])
    result = runner.invoke(app, ["install", "alice/capital-cities@0.1.0"])
    assert isinstance(result.exception, ConfigError) and "needs your trust" in str(result.exception)
    assert "alice/capital-cities 0.1.0 at commit" in str(result.exception)  # the plan
    assert not Path("envhub.lock").exists()
    empty = runner.invoke(app, ["install"])
    assert isinstance(empty.exception, ConfigError) and "envhub.lock is missing or empty" in str(
        empty.exception
    )


def test_check_package_runs_the_push_gates_with_publish(package: Path) -> None:
    ok = runner.invoke(app, ["check", str(package), "--no-tests", "--publish"])
    assert ok.exit_code == 0, ok.output
    assert "capital-cities: passed (version 0.1.0)" in ok.output and "no answer leak" in ok.output
    pyproject = package / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('version = "0.1.0"', 'version = "0.2.0"'))
    failed = runner.invoke(app, ["check", str(package), "--no-tests", "--publish"])
    assert failed.exit_code == 1 and "capital-cities: FAILED (version 0.2.0)" in failed.output
    local = runner.invoke(app, ["check", str(package), "--no-tests"])  # the envs still work
    assert local.exit_code == 0 and "capital-cities: passed (version 0.2.0)" in local.output
