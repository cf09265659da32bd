"""A package is refused at push and at install when its name shadows another distribution: an
installed one, or another project on pip's package index (the local index of ``conftest``,
speaking PyPI's simple and JSON APIs). A project on the index that is the package's own (one
URL in common) is not refused; an index that cannot be reached is named in one line and blocks
nothing.
"""

from __future__ import annotations

import re
import socket
import sys
from importlib import metadata
from pathlib import Path

import pytest
from conftest import ALICE
from hub_server import HubServer
from index_server import IndexServer
from typer.testing import CliRunner

from envhub.cli.app import app
from envhub.errors import ConfigError, EnvCheckError
from envhub.hub import install, push
from envhub.hub.index import _pip_settings, configured_indexes
from envhub.hub.publish import check_names

REPO = "alice/capital-cities"
runner = CliRunner()


def set_in_pyproject(package: Path, old: str, new: str) -> None:
    pyproject = package / "pyproject.toml"
    text = pyproject.read_text()
    assert old in text
    pyproject.write_text(text.replace(old, new))


def add_urls(package: Path, **urls: str) -> None:
    lines = "".join(f'{key} = "{url}"\n' for key, url in urls.items())
    with (package / "pyproject.toml").open("a") as pyproject:
        pyproject.write(f"\n[project.urls]\n{lines}")


def test_a_package_named_like_an_installed_distribution_is_refused_at_push_and_at_install(
    hub: HubServer, package: Path
) -> None:
    set_in_pyproject(package, 'name = "capital-cities"', 'name = "packaging"')
    problem = (
        f"its distribution name 'packaging' is that of the installed packaging "
        f"{metadata.version('packaging')} (rename [project] name, e.g. to 'alice-packaging')"
    )
    refused = runner.invoke(app, ["push", str(package), "--token", ALICE])
    assert refused.exit_code == 1
    assert str(refused.exception) == (
        f"not pushed: alice/packaging would shadow what is installed: {problem}"
    )
    assert hub.repos == {}
    push(package, token=ALICE, check=False)  # --skip-check skips the name check too
    with pytest.raises(ConfigError) as info:
        install("alice/packaging@0.1.0", trust=True, python=sys.executable, lock_file=None)
    assert str(info.value) == (
        f"not installed: alice/packaging would shadow what is installed: {problem}. "
        "Ask its author to rename it"
    )


def test_a_module_named_like_an_installed_one_is_refused_at_push(
    hub: HubServer, package: Path, unload: list[str]
) -> None:
    unload.append("tabulate")
    (package / "tabulate").mkdir()
    (package / "tabulate" / "__init__.py").write_text("")
    set_in_pyproject(
        package, 'packages = ["capital_cities"]', 'packages = ["capital_cities", "tabulate"]'
    )
    with pytest.raises(EnvCheckError) as info:
        push(package, token=ALICE)
    assert str(info.value) == (
        f"not pushed: {REPO} would shadow what is installed: its module 'tabulate' would "
        "shadow the installed tabulate's 'tabulate' (rename it, e.g. to 'alice_tabulate')"
    )


def test_the_package_itself_on_its_authors_path_shadows_nothing(
    hub: HubServer, package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(package.parent)
    monkeypatch.setenv("PYTHONPATH", str(package))  # importable from its own folder
    assert check_names(package, REPO) == []


def test_a_name_another_project_holds_on_the_index_is_refused_at_push_and_at_install(
    hub: HubServer, index: IndexServer, package: Path
) -> None:
    index.projects["capital-cities"] = {
        "name": "Capital-Cities",
        "summary": "Capitals of the world",
        "home_page": "",
        "project_urls": {"Source": "https://github.com/someone-else/capital-cities"},
    }
    add_urls(package, Source="https://github.com/alice/capital-cities")
    problem = (
        "its distribution name 'capital-cities' is another project's: Capital-Cities on "
        f"{index.url}/simple ('Capitals of the world') (rename [project] name, e.g. to "
        "'alice-capital-cities', or, if that project is yours, add one of its URLs to "
        "[project.urls])"
    )
    with pytest.raises(EnvCheckError) as info:
        push(package, token=ALICE)
    assert str(info.value) == (
        f"not pushed: {REPO} would shadow a distribution on the package index: {problem}"
    )
    assert hub.repos == {}
    push(package, token=ALICE, check=False)
    with pytest.raises(ConfigError) as refused:
        install(f"{REPO}@0.1.0", trust=True, python=sys.executable, lock_file=None)
    assert str(refused.value) == (
        f"not installed: {REPO} would shadow a distribution on the package index: {problem}. "
        "Ask its author to rename it"
    )


def test_a_module_named_like_a_project_on_an_index_without_json_api_is_refused(
    hub: HubServer, index: IndexServer, package: Path, unload: list[str]
) -> None:
    unload.append("gridworld")
    index.projects["gridworld"] = None  # in the simple API only: whose it is is unknown
    (package / "gridworld").mkdir()
    (package / "gridworld" / "__init__.py").write_text("")
    set_in_pyproject(
        package, 'packages = ["capital_cities"]', 'packages = ["capital_cities", "gridworld"]'
    )
    with pytest.raises(EnvCheckError) as info:
        check_names(package, REPO)
    assert str(info.value) == (
        f"not pushed: {REPO} would shadow a distribution on the package index: its module "
        f"'gridworld' would shadow the distribution gridworld on {index.url}/simple "
        "(rename it, e.g. to 'alice_gridworld')"
    )


@pytest.mark.parametrize(
    "own",
    ["https://github.com/Alice/capital-cities.git", "https://huggingface.co/alice/capital-cities/"],
)
def test_the_packages_own_project_on_the_index_is_not_refused(
    hub: HubServer, index: IndexServer, package: Path, own: str
) -> None:
    index.projects["capital-cities"] = {
        "name": "capital-cities",
        "summary": "",
        "home_page": own,
        "project_urls": None,
    }
    add_urls(package, Homepage="https://github.com/alice/capital-cities")
    assert check_names(package, REPO) == []
    assert "/pypi/capital-cities/json" in index.requests


def test_an_index_that_cannot_be_reached_is_named_and_blocks_nothing(
    hub: HubServer, package: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    notes = check_names(package, REPO)
    assert [re.sub(r"\(.*?\)", "(WHY)", note, count=1) for note in notes] == [
        f"the package index http://127.0.0.1:{port}/simple could not be asked (WHY); whether "
        "'capital-cities' is taken there was not checked"
    ]
    assert "Connection refused" in notes[0]


def test_pips_index_settings_apply_as_pip_applies_them(monkeypatch: pytest.MonkeyPatch) -> None:
    listing = (
        "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'\n"
        "global.index-url='https://mirror.example/simple'\n"
        "install.index-url='https://install.example/simple'\n"
        ":env:.find-links='/opt/wheels'\n"
    )
    assert _pip_settings(listing) == {
        "extra-index-url": "file:///opt/a/simple file:///opt/b/simple",
        "index-url": "https://install.example/simple",
        "find-links": "/opt/wheels",
    }
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///opt/a/simple")
    assert configured_indexes(sys.executable) == [
        "http://127.0.0.1:9/simple",
        "file:///opt/a/simple",
    ]
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    assert configured_indexes(sys.executable) == []
