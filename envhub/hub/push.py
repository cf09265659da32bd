"""``envhub push``: publish an env package version on the Hub.

A version is published in two steps: one commit holding every file (the Hub applies a commit
whole or not at all), then a tag named after the version on that commit. Only a tag makes a
version installable, so a push that fails in between leaves no half-published version; pushing
again finds the commit on ``main`` with the same content and only adds the tag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envhub.errors import ConfigError, EnvCheckError
from envhub.hub import client, harbor_package
from envhub.hub.publish import PushResult, check_names, publish_package, remote_manifest
from envhub.package import read_pyproject

__all__ = ["PushResult", "check_names", "publish_package", "push", "remote_manifest"]


def push(
    path: str | Path = ".",
    repo_id: str | None = None,
    *,
    private: bool = False,
    version: str | None = None,
    token: str | None = None,
    check: bool = True,
    run_tests: bool = True,
) -> PushResult:
    """Check the package at ``path``, upload it and tag the version.

    A Harbor task folder (or a folder of them) with no ``pyproject.toml`` is wrapped into a
    package at push time, its gate being its tasks' solution check
    (:mod:`envhub.hub.harbor_package`).

    Args:
        path: The package folder, or a Harbor folder.
        repo_id: ``owner/name`` (default: the token's user / the package name).
        private: Create the repo private (an existing repo keeps its visibility).
        version: The version to publish; must equal pyproject's (default: pyproject's; for a
            Harbor folder, 0.1.0).
        token: A Hub write token (default: ``HF_TOKEN`` or the saved login).
        check: Run the package gates first and refuse to push when one fails (the name check
            of :func:`check_names` first).
        run_tests: Include the package's own tests in the gates.

    Raises:
        EnvCheckError: A gate failed, or the package's name shadows another distribution.
        VersionConflictError: The version exists with different content.
        HubAuthError, HubError: No or a rejected token; the Hub failed.
    """
    root = Path(path).resolve()
    if harbor_package.is_harbor_folder(root):
        return harbor_package.push_tasks(
            root, repo_id, private=private, version=version, token=token, check=check
        )
    project = read_pyproject(root).get("project", {})
    name, package_version = str(project.get("name", "")), str(project.get("version", ""))
    if version is not None and version != package_version:
        raise ConfigError(
            f"--version {version} differs from pyproject.toml's version {package_version}; "
            "bump the version there"
        )
    token = client.require_token(token, "envhub push")
    if repo_id is None:
        with client.hub_errors("who am I", "-"):
            repo_id = f"{client.api(token).whoami()['name']}/{name}"
    notes = check_names(root, repo_id) if check else []
    report = _gate(root, check, run_tests)
    result = publish_package(root, repo_id, private=private, token=token, report=report)
    result.notes = notes
    return result


def _gate(root: Path, check: bool, run_tests: bool) -> Any:
    if not check:
        return None
    from envhub.checks.package import check_package

    report = check_package(root, run_tests=run_tests)
    if not report.passed:
        lines = "\n".join(f"  - {r.name}: {r.detail}" for r in report.failures)
        raise EnvCheckError(
            f"not pushed: {report.name} fails {len(report.failures)} gate(s):\n{lines}"
        )
    return report
