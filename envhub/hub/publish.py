"""Publishing an env package version on the Hub, once its gates have passed: the name check
that refuses a package shadowing another distribution, one commit holding every file (the Hub
applies a commit whole or not at all), then a tag named after the version on that commit.
:func:`envhub.hub.push.push` runs the gates and calls these; so does a Harbor folder's push
(:mod:`envhub.hub.harbor_package`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.errors import EnvCheckError, VersionConflictError
from envhub.hub import client
from envhub.hub.card import render_card
from envhub.hub.files import CARD, MANIFEST, Selection, build_manifest, file_hashes, select_files
from envhub.package import package_env_specs, read_pyproject
from envhub.registry import ENTRY_POINT_GROUP


@dataclass
class PushResult:
    """What a push did."""

    repo_id: str
    version: str
    commit: str
    """The commit the version tag points at."""
    content_hash: str
    uploaded: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(path, reason) of what was left out."""
    status: str = "published"
    """``published``, ``tagged`` (the commit was already there) or ``unchanged`` (already
    published)."""
    check_passed: bool | None = None
    notes: list[str] = field(default_factory=list)
    """What the name check could not check (a package index it could not reach), one line
    each."""

    @property
    def url(self) -> str:
        """The published version's file tree on the Hub (the tag's page)."""
        return f"{client.endpoint()}/{self.repo_id}/tree/{self.version}"


def check_names(root: Path, repo_id: str) -> list[str]:
    """Refuse, as ``envhub install`` would, a package at ``root`` whose distribution name or a
    top-level module shadows an installed distribution, an importable module or another
    project on pip's package indexes (:mod:`envhub.hub.guard`); returns what could not be
    checked (an index it could not reach), one line each.

    Raises:
        EnvCheckError: It would shadow something, with what to rename.
    """
    import sys

    from envhub.hub import guard

    pyproject = read_pyproject(root)
    distribution = str(pyproject.get("project", {}).get("name", ""))
    envs = pyproject.get("project", {}).get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
    files = dict.fromkeys(select_files(root).files, "")
    modules = guard.top_level_modules({"envs": envs, "files": files}, pyproject)
    environment = guard.inspect(sys.executable, distribution, modules)
    problems = guard.shadowing(repo_id, distribution, environment, folder=str(root))
    if problems:
        raise EnvCheckError(
            f"not pushed: {repo_id} would shadow what is installed: {'; '.join(problems)}"
        )
    indexes = guard.index.configured_indexes(sys.executable)
    own = guard.own_urls(repo_id, pyproject)
    problems, notes = guard.index_shadowing(repo_id, distribution, modules, own, indexes)
    if problems:
        raise EnvCheckError(
            f"not pushed: {repo_id} would shadow a distribution on the package index: "
            f"{'; '.join(problems)}"
        )
    return notes


def publish_package(
    root: Path,
    repo_id: str,
    *,
    private: bool,
    token: str | None,
    report: Any,
    envs: dict[str, str] | None = None,
    bump_hint: str = "bump the version in pyproject.toml",
) -> PushResult:
    """Upload the (checked) package at ``root`` and tag its version; ``report`` is its check
    report (``None``: skipped), ``envs`` its envs' entry points (default: read from its
    pyproject), ``bump_hint`` what a version conflict tells the user to do."""
    client.parse_ref(repo_id)
    api = client.api(token)
    project = read_pyproject(root).get("project", {})
    if envs is None:
        envs = {n: s.target_path for n, s in package_env_specs(root).items()}
    selection = select_files(root)
    version = str(project.get("version", ""))
    board = _leaderboard(api, repo_id, version)
    with tempfile.TemporaryDirectory(prefix="envhub-push-") as tmp:
        staging = Path(tmp)
        manifest = _stage(root, staging, selection, repo_id, version, envs, report, project, board)
        return _publish(api, staging, manifest, repo_id, private, selection, report, bump_hint)


def _leaderboard(api: Any, repo_id: str, version: str) -> str:
    """The card's leaderboard section of ``version``, from the results on the repo's ``main``
    (none yet for a new repo)."""
    from envhub.errors import HubNotFoundError
    from envhub.hub.leaderboard import card_section
    from envhub.hub.results import read_results

    try:
        results = read_results(repo_id, api=api)
    except HubNotFoundError:
        results = []
    return card_section(results, version)


def _stage(
    root: Path,
    staging: Path,
    selection: Selection,
    repo_id: str,
    version: str,
    envs: dict[str, str],
    report: Any,
    project: dict[str, Any],
    leaderboard: str | None = None,
) -> dict[str, Any]:
    """Copy the selected files to ``staging``, add the card and the manifest; return the latter."""
    for name in selection.files:
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / name, staging / name)
    readme = (root / CARD).read_text(encoding="utf-8") if (root / CARD).is_file() else ""
    card = render_card(readme, repo_id=repo_id, version=version, envs=envs,
                       description=str(project.get("description", "")),
                       report_markdown=report.to_markdown() if report else None,
                       performance=report.performance if report else None,
                       machine=report.machine if report else None,
                       leaderboard=leaderboard)  # fmt: skip
    (staging / CARD).write_text(card, encoding="utf-8")
    files = sorted({*selection.files, CARD})
    manifest = build_manifest(
        str(project["name"]),
        version,
        envs,
        file_hashes(staging, files),
        report.to_dict() if report else {"skipped": True},
        str(project.get("description", "")),
    )
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def _publish(
    api: Any,
    staging: Path,
    manifest: dict[str, Any],
    repo_id: str,
    private: bool,
    selection: Selection,
    report: Any,
    bump_hint: str,
) -> PushResult:
    version, digest = manifest["version"], manifest["content_hash"]
    result = PushResult(repo_id, version, "", digest, sorted([*manifest["files"], MANIFEST]),
                        selection.skipped,
                        check_passed=report.passed if report else None)  # fmt: skip
    refs = _refs_creating_repo(api, repo_id, private)
    tags = {t.name: t.target_commit for t in refs.tags}
    head = next(b.target_commit for b in refs.branches if b.name == "main")
    if version in tags:
        published = remote_manifest(api, repo_id, tags[version])
        if (published or {}).get("content_hash") != digest:
            raise VersionConflictError(
                f"{repo_id}@{version} is already published with other content "
                f"({(published or {}).get('content_hash', 'no envhub manifest')} != {digest}); "
                f"{bump_hint}"
            )
        result.commit, result.status = tags[version], "unchanged"
        return result
    on_main = remote_manifest(api, repo_id, head)
    if on_main and (on_main.get("version"), on_main.get("content_hash")) == (version, digest):
        result.commit, result.status = (
            head,
            "tagged",
        )  # an earlier push committed, then failed to tag
    else:
        with client.hub_errors("upload", repo_id):
            message = f"envhub push {manifest['name']} {version}"
            result.commit = _upload(api, staging, repo_id, head, message)
    with client.hub_errors("tag", repo_id):
        api.create_tag(
            repo_id,
            tag=version,
            revision=result.commit,
            repo_type=client.REPO_TYPE,
            tag_message=f"{manifest['name']} {version} {digest}",
        )
    return result


def _upload(api: Any, staging: Path, repo_id: str, head: str, message: str) -> str:
    """Commit the staged files on ``head`` as the repo's whole content, but for the Hub's
    ``.gitattributes`` and the eval results (``results/``, which outlive versions); returns the
    commit."""
    import glob

    from envhub.hub.files import RESULTS

    staged = {p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file()}
    remote = api.list_repo_files(repo_id, revision=head, repo_type=client.REPO_TYPE)
    gone = [p for p in remote if p not in staged and not p.startswith(f"{RESULTS}/")]
    info = api.upload_folder(repo_id=repo_id, folder_path=staging, repo_type=client.REPO_TYPE,
                             parent_commit=head, commit_message=message,
                             delete_patterns=[glob.escape(p) for p in gone] or None)  # fmt: skip
    return str(info.oid)


def _refs_creating_repo(api: Any, repo_id: str, private: bool) -> Any:
    """The repo's branches and tags; the repo is created first when it does not exist yet."""
    from huggingface_hub import errors

    with client.hub_errors("push", repo_id):
        try:
            return api.list_repo_refs(repo_id, repo_type=client.REPO_TYPE)
        except errors.RepositoryNotFoundError:
            api.create_repo(repo_id, repo_type=client.REPO_TYPE, private=private)
            return api.list_repo_refs(repo_id, repo_type=client.REPO_TYPE)


def remote_manifest(api: Any, repo_id: str, revision: str) -> dict[str, Any] | None:
    """The ``envhub.json`` of ``repo_id`` at ``revision``, or ``None`` when it has none."""
    from huggingface_hub import errors, hf_hub_download

    with client.hub_errors("read the manifest", repo_id, revision):
        try:
            path = hf_hub_download(
                repo_id,
                MANIFEST,
                revision=revision,
                repo_type=client.REPO_TYPE,
                endpoint=api.endpoint,
                token=api.token,
                cache_dir=tempfile.gettempdir() + "/envhub-manifests",
            )
        except errors.EntryNotFoundError:
            return None
    return json.loads(Path(path).read_text(encoding="utf-8"))
