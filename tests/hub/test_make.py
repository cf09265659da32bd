"""``envhub.make("owner/name@...")``: resolution through the Hub and the lock, trust, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ALICE
from hub_server import HubServer
from wheels import requiring, write_wheel

import envhub
from envhub.errors import ConfigError, EnvNotFoundError, HubNotFoundError
from envhub.hub import push
from envhub.hub.lock import LockEntry, write_entry
from envhub.hub.provenance import install_source


def test_unknown_repo_or_version_is_an_env_not_found_error(hub: HubServer, package: Path) -> None:
    with pytest.raises(HubNotFoundError, match="no repo someone/mystery-env") as info:
        envhub.make("someone/mystery-env@v1")
    assert isinstance(info.value, EnvNotFoundError)
    push(package, token=ALICE, check=False)
    with pytest.raises(HubNotFoundError, match="has no version or revision '2.0.0'"):
        envhub.make("alice/capital-cities@2.0.0")


def test_an_uninstalled_version_needs_trust(hub: HubServer, package: Path) -> None:
    result = push(package, token=ALICE, check=False)
    with pytest.raises(ConfigError) as info:
        envhub.make("alice/capital-cities@0.1.0")
    assert str(info.value).startswith(
        f"alice/capital-cities@0.1.0 (commit {result.commit[:12]}) is not installed, "
        "and installing runs its code: "
        f"run `envhub install alice/capital-cities@{result.commit}` to review and install it"
    )


def test_the_lock_pins_without_asking_the_hub(hub: HubServer) -> None:
    commit = "c" * 40
    write_entry(
        LockEntry("alice/offline", "1.0.0", "1.0.0", commit, "sha256:x", ["offline"], "offline")
    )
    hub.stop()  # nothing answers now: the lock alone resolves the reference
    with pytest.raises(
        ConfigError, match=f"alice/offline@1.0.0 \\(commit {commit[:12]}\\) is not installed"
    ):
        envhub.make("alice/offline@1.0.0")


def test_install_source_of_packages_not_installed_from_the_hub() -> None:
    assert install_source("envhub") is None  # an editable install from a checkout
    assert install_source("no-such-distribution") is None


def test_an_install_by_make_goes_through_the_guard(
    hub: HubServer, package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused before pip installs anything; ``allow_changes=True`` would install (the same
    path as ``envhub install --allow-changes``, tested in a fresh venv in test_install_guard)."""
    from importlib import metadata

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    write_wheel(wheels, "tabulate", "0.0.1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    requiring(package, "tabulate<0.0.2")
    push(package, token=ALICE, check=False)
    with pytest.raises(ConfigError) as info:
        envhub.make("alice/capital-cities@0.1.0", trust_remote_code=True)
    assert str(info.value) == (
        "not installed: alice/capital-cities's dependencies would change installed "
        f"distributions: tabulate: {metadata.version('tabulate')} -> 0.0.1 (downgrade). "
        "Pass --allow-changes (envhub install) or allow_changes=True to accept"
    )
    assert install_source("capital-cities") is None
