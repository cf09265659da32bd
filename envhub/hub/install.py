"""``envhub pull`` / ``envhub install``: resolve a Hub reference to a commit, download, verify,
install, lock.

- **resolve**: ``owner/name`` alone means the highest published version (version tags only, never
  the moving ``main``); ``@1.2.0`` a version tag; ``@<40 hex>`` a commit; any other revision
  (a branch) is resolved to the commit it points at now and locked there.
- **download** into ``<cache>/hub/snapshots/<owner>--<name>/<commit>`` (staged, then renamed, so a
  failed download leaves nothing behind), then **verify**: every file must match the sha256 in the
  package's ``envhub.json``, no unlisted file may be present, and the content hash must equal the
  manifest's and, when installing from a lock file, the locked one.
- **guard** (``envhub.hub.guard``): refuse a package that would shadow an installed distribution
  or a module, or another project on the package indexes pip uses (not asked ``offline``), or
  whose dependencies pip would resolve by upgrading, downgrading or reinstalling an installed
  distribution (unless ``allow_changes``).
- **install** with pip from a copy of the snapshot (pip writes build files into the folder it
  builds), after the user trusted the package: code from the Hub runs at install and at load.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.errors import ConfigError, EnvLoadError, HubNotFoundError, PackageIntegrityError
from envhub.hub import client, guard
from envhub.hub.client import HubRef
from envhub.hub.files import MANIFEST, RESULTS, content_hash, read_manifest, sha256_file
from envhub.hub.lock import LOCK_FILE, LockEntry, read_lock, write_entry
from envhub.paths import cache_dir
from envhub.registry import refresh

_ALLOWED_EXTRA = {".gitattributes"}
"""Files a repo may hold beyond the manifest's: the Hub's own."""


@dataclass(frozen=True)
class Resolved:
    """A Hub reference pinned to one commit."""

    repo_id: str
    revision: str
    """What was asked for (the version chosen when nothing was)."""
    commit: str


@dataclass
class Pulled:
    """A downloaded, verified package snapshot."""

    resolved: Resolved
    folder: Path
    manifest: dict[str, Any]

    @property
    def version(self) -> str:
        """The package's version, as its manifest records it."""
        return str(self.manifest["version"])

    def plan(self) -> str:
        """What installing it means, for the user to read before trusting it."""
        project = _pyproject(self.folder).get("project", {})
        deps = ", ".join(project.get("dependencies", [])) or "none"
        envs = ", ".join(f"{n} ({t})" for n, t in self.manifest["envs"].items())
        check = self.manifest.get("check", {})
        verdict = (
            "skipped" if check.get("skipped") else ("passed" if check.get("passed") else "FAILED")
        )
        return (
            f"{self.resolved.repo_id} {self.version} at commit {self.resolved.commit}\n"
            f"  package: {self.manifest['name']}, {len(self.manifest['files'])} files, "
            f"content {self.manifest['content_hash']}\n"
            f"  envs: {envs}\n  dependencies: {deps}\n  envhub check at push: {verdict}\n"
            f"  installing runs this package's build and, later, its code, with your permissions"
        )


@dataclass
class InstallResult:
    """What an install did."""

    entry: LockEntry
    folder: Path
    skipped_pip: bool = False
    """True when that commit was already installed."""
    envs: list[str] = field(default_factory=list)
    changes: list[guard.Change] = field(default_factory=list)
    """Installed distributions the install replaced (accepted with ``allow_changes``)."""
    notes: list[str] = field(default_factory=list)
    """What the guard could not check (a package index it could not reach), one line each."""


def resolve(ref: HubRef, token: str | None = None) -> Resolved:
    """Pin ``ref`` to a commit (see the module docstring)."""
    api = client.api(token)
    if ref.revision is None:
        return Resolved(ref.repo_id, *_latest_version(api, ref.repo_id))
    with client.hub_errors("resolve", ref.repo_id, ref.revision):
        info = api.repo_info(ref.repo_id, revision=ref.revision, repo_type=client.REPO_TYPE)
    return Resolved(ref.repo_id, ref.revision, info.sha)


def _latest_version(api: Any, repo_id: str) -> tuple[str, str]:
    from packaging.version import InvalidVersion, Version

    with client.hub_errors("list versions", repo_id):
        tags = api.list_repo_refs(repo_id, repo_type=client.REPO_TYPE).tags
    versions = []
    for tag in tags:
        try:
            versions.append((Version(tag.name), tag.name, tag.target_commit))
        except InvalidVersion:
            continue
    if not versions:
        raise HubNotFoundError(
            f"{repo_id} has no published version (no version tag); push one with `envhub push`"
        )
    _, name, commit = max(versions)
    return name, commit


def list_versions(repo_id: str, token: str | None = None) -> dict[str, str]:
    """``{version tag: commit}`` of ``repo_id``."""
    with client.hub_errors("list versions", repo_id):
        tags = client.api(token).list_repo_refs(repo_id, repo_type=client.REPO_TYPE).tags
    return {t.name: t.target_commit for t in tags}


def snapshot_folder(resolved: Resolved) -> Path:
    """Where the snapshot of ``resolved`` is cached: one folder per repo and commit."""
    return cache_dir() / "hub" / "snapshots" / resolved.repo_id.replace("/", "--") / resolved.commit


def pull(
    ref: HubRef | str, *, token: str | None = None, expected_hash: str | None = None
) -> Pulled:
    """Resolve, download and verify a package (nothing is installed).

    Raises:
        HubNotFoundError: No such repo or revision.
        PackageIntegrityError: The download does not match its hashes, or is no envhub package.
    """
    ref = client.parse_ref(ref) if isinstance(ref, str) else ref
    resolved = (
        resolve(ref, token)
        if not client.is_commit(ref.revision)
        else Resolved(ref.repo_id, str(ref.revision), str(ref.revision))
    )
    return fetch(resolved, token=token, expected_hash=expected_hash)


def fetch(
    resolved: Resolved, *, token: str | None = None, expected_hash: str | None = None
) -> Pulled:
    """Download ``resolved`` (unless the verified snapshot is already cached) and verify it."""
    folder = snapshot_folder(resolved)
    if not folder.is_dir():
        staging = folder.with_name(f".{resolved.commit}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            _download(resolved, staging, token)
            verify(staging, resolved, expected_hash)
            staging.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return Pulled(resolved, folder, verify(folder, resolved, expected_hash))


def _download(resolved: Resolved, target: Path, token: str | None) -> None:
    from huggingface_hub import snapshot_download

    with client.hub_errors("download", resolved.repo_id, resolved.revision):
        snapshot_download(resolved.repo_id, repo_type=client.REPO_TYPE, revision=resolved.commit,
                          local_dir=target, endpoint=client.endpoint(), token=token,
                          ignore_patterns=[f"{RESULTS}/*"])  # fmt: skip
    shutil.rmtree(
        target / ".cache", ignore_errors=True
    )  # the client's bookkeeping, not package content


def verify(folder: Path, resolved: Resolved, expected_hash: str | None = None) -> dict[str, Any]:
    """The manifest of the snapshot in ``folder``, once every file matches it.

    Raises:
        PackageIntegrityError: No manifest, a file differs or is missing or unlisted, or the
            content hash differs from the manifest's or ``expected_hash``.
    """
    where = f"{resolved.repo_id}@{resolved.commit[:12]}"
    if not (folder / MANIFEST).is_file():
        raise PackageIntegrityError(
            f"{where} is not an envhub package: it has no {MANIFEST} "
            "(packages are published with `envhub push`)"
        )
    manifest = read_manifest(folder / MANIFEST)
    listed: dict[str, str] = manifest.get("files", {})
    files = (p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    # Eval results are the repo's, not the package's: they are added after a version is out.
    present = {p for p in files if not p.startswith(f"{RESULTS}/")} - {MANIFEST} - _ALLOWED_EXTRA
    problems = [f"{name}: missing" for name in sorted(set(listed) - present)]
    problems += [f"{name}: not in the manifest" for name in sorted(present - set(listed))]
    problems += [
        f"{name}: sha256 differs"
        for name in sorted(set(listed) & present)
        if sha256_file(folder / name) != listed[name]
    ]
    digest = content_hash(listed)
    if digest != manifest.get("content_hash"):
        problems.append(f"content hash {digest} != manifest's {manifest.get('content_hash')}")
    if expected_hash is not None and digest != expected_hash:
        problems.append(f"content hash {digest} != locked {expected_hash}")
    if problems:
        raise PackageIntegrityError(
            f"{where} failed verification, nothing installed: " + "; ".join(problems)
        )
    return manifest


def install(
    ref: HubRef | str,
    *,
    trust: bool = False,
    confirm: Callable[[str], bool] | None = None,
    python: str | None = None,
    lock_file: str | Path | None = LOCK_FILE,
    offline: bool = False,
    token: str | None = None,
    expected_hash: str | None = None,
    allow_changes: bool = False,
) -> InstallResult:
    """Pull, verify and pip-install a package from the Hub, and record it in the lock file.

    Args:
        ref: ``owner/name[@version|@revision]``.
        trust: Install without asking. Otherwise ``confirm`` is asked with the plan.
        confirm: Shown the plan, returns whether to go on; without it (and without ``trust``)
            nothing is installed.
        python: The interpreter whose environment gets the package (default: this one).
        lock_file: Where to record the pin (``None``: do not record).
        offline: Let pip use only what is installed (``--no-index --no-build-isolation``).
        token: Hub token for private repos.
        expected_hash: Refuse content whose hash differs (used when installing from a lock).
        allow_changes: Install even when pip would upgrade, downgrade or reinstall installed
            distributions to satisfy the package's dependencies (``InstallResult.changes``).

    Raises:
        ConfigError: Not trusted; an env name clashes with an installed env; the package would
            shadow an installed distribution or module; its dependencies would change installed
            distributions and ``allow_changes`` is not set.
        HubError and subclasses: Resolution, download or verification failed.
    """
    pulled = pull(ref, token=token, expected_hash=expected_hash)
    if not trust and not (confirm is not None and confirm(pulled.plan())):
        raise ConfigError(
            f"not installed: code from the Hub needs your trust. Review it:\n{pulled.plan()}\n"
            "then pass --trust (envhub install) or trust_remote_code=True (envhub.make)"
        )
    python = python or sys.executable
    distribution = str(pulled.manifest["name"])
    skipped = _already_installed(python, distribution, pulled.resolved)
    changes, notes = _guard(pulled, python, distribution, offline, allow_changes, first=not skipped)
    if not skipped:
        pip_install(python, pulled, offline)
    entry = LockEntry(pulled.resolved.repo_id, pulled.resolved.revision, pulled.version,
                      pulled.resolved.commit, pulled.manifest["content_hash"],
                      sorted(pulled.manifest["envs"]), distribution)  # fmt: skip
    if lock_file is not None:
        write_entry(entry, lock_file)
    if python == sys.executable:
        refresh()
    envs = sorted(pulled.manifest["envs"])
    return InstallResult(entry, pulled.folder, skipped, envs, changes, notes)


def install_locked(lock_file: str | Path = LOCK_FILE, **kwargs: Any) -> list[InstallResult]:
    """Install every package of a lock file at its locked commit, refusing changed content."""
    entries = read_lock(lock_file)
    if not entries:
        raise ConfigError(
            f"{lock_file} is missing or empty; "
            "install a package first: envhub install owner/name@VERSION"
        )
    results = []
    for entry in entries.values():
        result = install(
            HubRef(entry.repo_id, entry.commit),
            expected_hash=entry.content_hash,
            lock_file=None,
            **kwargs,
        )
        results.append(result)
    return results


def _check_clashes(pulled: Pulled, installed: dict[str, str], distribution: str) -> None:
    clashes = [
        f"{env} (from {installed[env]})"
        for env in pulled.manifest["envs"]
        if env in installed and guard.normal(installed[env]) != guard.normal(distribution)
    ]
    if clashes:
        raise ConfigError(
            f"not installed: {pulled.resolved.repo_id} provides env(s) already installed "
            f"from another package: {', '.join(clashes)}; "
            "uninstall that package first (pip uninstall), or use another env"
        )


def _guard(
    pulled: Pulled,
    python: str,
    distribution: str,
    offline: bool,
    allow_changes: bool,
    first: bool,
) -> tuple[list[guard.Change], list[str]]:
    """Refuse what the install must not do (see ``envhub.hub.guard``); the changes allowed and
    what could not be checked. The indexes and dependencies are looked at on a ``first``
    install of that commit only. The three questions (to this environment, to the indexes, to
    pip's resolver) are asked at once; the answers are read in that order."""
    from concurrent.futures import ThreadPoolExecutor

    project = _pyproject(pulled.folder)
    modules = guard.top_level_modules(pulled.manifest, project)
    requirements = list(project.get("project", {}).get("dependencies", []))
    dry_run = guard.DryRun(python, requirements if first else [], offline)
    pool = ThreadPoolExecutor(1)
    names = (
        pool.submit(_check_index, pulled, python, distribution, modules, project)
        if first and not offline
        else None
    )
    try:
        environment = guard.inspect(python, distribution, modules)
        _check_clashes(pulled, environment.envs, distribution)
        _check_shadowing(pulled, distribution, environment)
        if not first:
            return [], []
        notes = names.result() if names is not None else []
        changes = dry_run.changes(environment)
    finally:
        dry_run.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
    if changes and not allow_changes:
        raise ConfigError(
            f"not installed: {pulled.resolved.repo_id}'s dependencies would change installed "
            f"distributions: {'; '.join(map(str, changes))}. Pass --allow-changes "
            "(envhub install) or allow_changes=True to accept"
        )
    return changes, notes


def _check_index(
    pulled: Pulled, python: str, distribution: str, modules: list[str], project: dict[str, Any]
) -> list[str]:
    """Refuse a package named like another project on pip's indexes; what could not be asked."""
    repo_id = pulled.resolved.repo_id
    problems, notes = guard.index_shadowing(
        repo_id, distribution, modules, guard.own_urls(repo_id, project),
        guard.index.configured_indexes(python),
    )  # fmt: skip
    if problems:
        raise ConfigError(
            f"not installed: {repo_id} would shadow a distribution on the package index: "
            f"{'; '.join(problems)}. Ask its author to rename it"
        )
    return notes


def _check_shadowing(pulled: Pulled, distribution: str, environment: guard.Environment) -> None:
    problems = guard.shadowing(pulled.resolved.repo_id, distribution, environment)
    if problems:
        raise ConfigError(
            f"not installed: {pulled.resolved.repo_id} would shadow what is installed: "
            f"{'; '.join(problems)}. Ask its author to rename it"
        )


def _already_installed(python: str, distribution: str, resolved: Resolved) -> bool:
    code = (
        f"from envhub.hub.provenance import install_source; print(install_source({distribution!r}))"
    )
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    return done.returncode == 0 and done.stdout.strip() == str((resolved.repo_id, resolved.commit))


def pip_install(python: str, pulled: Pulled, offline: bool) -> None:
    """pip-install a copy of the snapshot from a folder named after its commit (see provenance)."""
    build = (
        cache_dir()
        / "hub"
        / "build"
        / pulled.resolved.repo_id.replace("/", "--")
        / pulled.resolved.commit
    )
    shutil.rmtree(build, ignore_errors=True)
    shutil.copytree(pulled.folder, build)
    command = [python, "-m", "pip", "install", *guard.pip_options(offline)]
    try:
        done = subprocess.run([*command, str(build)], capture_output=True, text=True, timeout=900)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    if done.returncode != 0:
        raise EnvLoadError(
            f"pip could not install {pulled.resolved.repo_id}@{pulled.resolved.commit[:12]}: "
            f"{done.stderr.strip()[-800:]}"
        )


def _pyproject(folder: Path) -> dict[str, Any]:
    from envhub.package import read_pyproject

    try:
        return read_pyproject(folder)
    except EnvLoadError:
        return {}
