"""Push and pull through the real ``huggingface_hub`` client against the local Hub server:
versions, tags, hashes, private repos, tokens, bad packages, tampering and network failures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import ALICE, BOB
from hub_server import HubServer
from huggingface_hub import HfApi

from envhub.errors import (
    ConfigError,
    EnvCheckError,
    HubAuthError,
    HubError,
    HubNotFoundError,
    PackageIntegrityError,
    VersionConflictError,
)
from envhub.hub import install, pull, push, search
from envhub.hub.files import content_hash, select_files

REPO = "alice/capital-cities"


def bump(package: Path, old: str, new: str) -> None:
    """Change the version in pyproject and in the env class (the version gate wants them equal)."""
    for name in ("pyproject.toml", "capital_cities/env.py"):
        path = package / name
        path.write_text(path.read_text().replace(f'version = "{old}"', f'version = "{new}"'))


def test_push_publishes_a_tagged_version_with_manifest_and_card(
    hub: HubServer, package: Path
) -> None:
    (package / ".env").write_text("HF_TOKEN=hf_secret")
    result = push(package, token=ALICE, run_tests=False)
    repo = hub.repos[("model", REPO)]
    assert (result.repo_id, result.version, result.status) == (REPO, "0.1.0", "published")
    assert (
        repo.tags == {"0.1.0": result.commit}
        and repo.branches["main"] == result.commit
        and not repo.private
    )
    files = repo.commits[result.commit].files
    assert sorted(files) == sorted([".gitattributes", *result.uploaded])
    assert ".env" not in files and (".env", "looks like a secret") in result.skipped
    assert b"hf_secret" not in b"".join(files.values())
    manifest = json.loads(files["envhub.json"])
    assert manifest["content_hash"] == result.content_hash == content_hash(manifest["files"])
    assert sorted(manifest["files"]) == sorted(select_files(package).files)
    assert (
        manifest["envs"] == {"capital-cities": "capital_cities.env:CapitalCitiesEnv"}
        and manifest["check"]["passed"]
    )
    card = files["README.md"].decode()
    assert (
        "tags:\n- envhub\n" in card
        and "| capital-cities: reference policy at top | pass | 1.0 |" in card
        and "| capital-cities: reward audit | pass | 31 policies x 3 episodes" in card
    )
    assert manifest["check"]["audits"]["capital-cities"]["findings"] == []


def test_same_version_same_content_is_a_no_op_other_content_is_refused(
    hub: HubServer, package: Path
) -> None:
    first = push(package, token=ALICE, run_tests=False)
    again = push(package, token=ALICE, run_tests=False)
    assert (again.status, again.commit) == ("unchanged", first.commit)
    (package / "capital_cities" / "env.py").write_text(
        (package / "capital_cities" / "env.py").read_text() + "\n# changed\n"
    )
    with pytest.raises(
        VersionConflictError,
        match=r"alice/capital-cities@0.1.0 is already published with other content",
    ):
        push(package, token=ALICE, run_tests=False)
    bump(package, "0.1.0", "0.2.0")
    second = push(package, token=ALICE, run_tests=False)
    assert hub.repos[("model", REPO)].tags == {"0.1.0": first.commit, "0.2.0": second.commit}
    with pytest.raises(
        ConfigError, match="--version 0.3.0 differs from pyproject.toml's version 0.2.0"
    ):
        push(package, token=ALICE, version="0.3.0", check=False)


def test_pull_resolves_versions_to_commits_and_latest_to_the_highest(
    hub: HubServer, package: Path
) -> None:
    first = push(package, token=ALICE, run_tests=False)
    bump(
        package, "0.1.0", "0.10.0"
    )  # 0.10.0 > 0.9.0 > 0.1.0: versions compare as versions, not strings
    tenth = push(package, token=ALICE, run_tests=False)
    bump(package, "0.10.0", "0.9.0")
    push(package, token=ALICE, run_tests=False)
    assert pull(f"{REPO}@0.1.0").resolved.commit == first.commit
    latest = pull(REPO)
    assert (latest.resolved.revision, latest.resolved.commit, latest.version) == (
        "0.10.0",
        tenth.commit,
        "0.10.0",
    )
    assert pull(f"{REPO}@{first.commit}").version == "0.1.0"
    assert (pull(f"{REPO}@0.1.0").folder / "capital_cities" / "env.py").read_text() == (
        package / "capital_cities" / "env.py"
    ).read_text().replace("0.9.0", "0.1.0")
    with pytest.raises(
        HubNotFoundError, match=r"alice/capital-cities has no version or revision '9.9.9'"
    ):
        pull(f"{REPO}@9.9.9")
    with pytest.raises(HubNotFoundError, match=r"no repo alice/nothing-here"):
        pull("alice/nothing-here@0.1.0")


def test_private_repos_need_the_owners_token(hub: HubServer, package: Path) -> None:
    push(package, token=ALICE, private=True, run_tests=False)
    assert hub.repos[("model", REPO)].private
    with pytest.raises(HubNotFoundError, match="If it is private, give a token"):
        pull(f"{REPO}@0.1.0")
    with pytest.raises(HubNotFoundError):
        pull(
            f"{REPO}@0.1.0", token=BOB
        )  # signed in, but not the owner: the repo does not exist for bob
    with pytest.raises(HubAuthError, match="rejected the token"):
        pull(f"{REPO}@0.1.0", token="hf_wrong")
    assert pull(f"{REPO}@0.1.0", token=ALICE).version == "0.1.0"
    assert [p.repo_id for p in search("capital")] == []
    assert [p.repo_id for p in search("capital", token=ALICE)] == [REPO]


def test_push_needs_a_token_that_may_write(hub: HubServer, package: Path) -> None:
    with pytest.raises(HubAuthError, match="needs a Hub token with write access"):
        push(package, check=False)
    with pytest.raises(HubAuthError, match="rejected the token"):
        push(package, token="hf_wrong", check=False)
    push(package, token=ALICE, check=False)
    bump(package, "0.1.0", "0.2.0")
    with pytest.raises(HubAuthError, match="may not write to alice/capital-cities"):
        push(package, REPO, token=BOB, check=False)


def test_a_package_without_or_with_a_broken_entry_point_is_not_pushed(
    hub: HubServer, package: Path
) -> None:
    pyproject = package / "pyproject.toml"
    text = pyproject.read_text()
    pyproject.write_text(
        text.replace(
            'capital-cities = "capital_cities.env:CapitalCitiesEnv"',
            'capital-cities = "capital_cities.env:Missing"',
        )
    )
    with pytest.raises(
        EnvCheckError,
        match=(
            r"entry points: EnvLoadError: "
            r"cannot load env 'capital-cities' from capital_cities.env:Missing"
        ),
    ):
        push(package, token=ALICE, run_tests=False)
    pyproject.write_text(
        text.replace(
            '[project.entry-points."envhub.envs"]\n'
            'capital-cities = "capital_cities.env:CapitalCitiesEnv"\n',
            "",
        )
    )
    with pytest.raises(EnvCheckError, match="declares no envs"):
        push(package, token=ALICE, run_tests=False)
    assert hub.repos == {}


def test_a_failing_package_test_or_a_leaked_answer_blocks_the_push(
    hub: HubServer, package: Path
) -> None:
    env = package / "capital_cities" / "env.py"
    env.write_text(
        env.read_text().replace(
            '"Answer the question. ',
            '"Answer the question (Paris, Tokyo, Ottawa, Canberra, Nairobi, Lima, Oslo, Hanoi). ',
        )
    )
    with pytest.raises(EnvCheckError) as info:
        push(package, token=ALICE)
    assert (
        "capital-cities: no answer leak: "
        "the answer appears in 8 of 8 prompts (task 0: answer 'Paris')"
    ) in str(info.value)
    # The template's tests do not look at the prompt.
    assert "package tests: pytest exited 1" not in str(info.value)
    (package / "tests" / "test_more.py").write_text("def test_fails():\n    assert 1 == 2\n")
    with pytest.raises(
        EnvCheckError, match=r"package tests: pytest exited 1: .*1 failed, 6 passed"
    ):
        push(package, token=ALICE)
    assert hub.repos == {}


def test_a_repo_that_is_not_an_envhub_package_is_refused(hub: HubServer, tmp_path: Path) -> None:
    api = HfApi(endpoint=hub.url, token=ALICE)
    api.create_repo("alice/plain-model")
    (tmp_path / "config.json").write_text("{}")
    api.upload_folder(
        repo_id="alice/plain-model", folder_path=tmp_path, allow_patterns=["config.json"]
    )
    api.create_tag("alice/plain-model", tag="1.0.0")
    with pytest.raises(
        PackageIntegrityError,
        match=r"alice/plain-model@\w+ is not an envhub package: it has no envhub.json",
    ):
        pull("alice/plain-model")


def test_a_tampered_download_is_refused_and_leaves_nothing(hub: HubServer, package: Path) -> None:
    result = push(package, token=ALICE, run_tests=False)
    original = hub.repos[("model", REPO)].commits[result.commit].files["capital_cities/env.py"]
    hub.tamper(REPO, "capital_cities/env.py", original.replace(b'"Paris"', b'"Pari$"'))  # same size
    with pytest.raises(
        PackageIntegrityError,
        match=r"failed verification, nothing installed: capital_cities/env.py: sha256 differs",
    ):
        install(f"{REPO}@0.1.0", trust=True)
    assert not Path("envhub.lock").exists()
    snapshots = list((Path.cwd().parent / "envhub-cache" / "hub" / "snapshots").rglob("*"))
    assert [p.name for p in snapshots] == [
        "alice--capital-cities"
    ]  # the staged download was removed


def test_network_failure_mid_push_publishes_nothing_and_a_retry_completes(
    hub: HubServer, package: Path
) -> None:
    push(package, token=ALICE, run_tests=False)
    bump(package, "0.1.0", "0.2.0")
    repo = hub.repos[("model", REPO)]
    before = dict(repo.branches)
    hub.fail_next("commit", times=10)  # the connection drops halfway through every upload attempt
    with pytest.raises(HubError):
        push(package, token=ALICE, run_tests=False)
    assert repo.branches == before and list(repo.tags) == ["0.1.0"]
    hub.failures.clear()
    hub.fail_next("tag", times=10)  # the commit lands, the tag does not: 0.2.0 is not published
    with pytest.raises(HubError):
        push(package, token=ALICE, run_tests=False)
    assert repo.branches["main"] != before["main"] and list(repo.tags) == ["0.1.0"]
    with pytest.raises(HubNotFoundError, match="no version or revision '0.2.0'"):
        pull(f"{REPO}@0.2.0")
    hub.failures.clear()
    retry = push(package, token=ALICE, run_tests=False)
    assert (retry.status, retry.commit) == ("tagged", repo.branches["main"]) and repo.tags[
        "0.2.0"
    ] == retry.commit


def test_a_lost_answer_to_the_commit_does_not_commit_twice(hub: HubServer, package: Path) -> None:
    def repo_commits() -> int:
        return len(hub.repos[("model", REPO)].commits)

    push(package, token=ALICE, run_tests=False)
    bump(package, "0.1.0", "0.2.0")
    count = repo_commits()
    hub.fail_next("commit", after=True)  # applied, but the answer never arrives; the client retries
    with pytest.raises(
        HubError, match="412"
    ):  # the retry's parent is stale now: refused, not applied twice
        push(package, token=ALICE, run_tests=False)
    assert repo_commits() == count + 1 and "0.2.0" not in hub.repos[("model", REPO)].tags
    retry = push(package, token=ALICE, run_tests=False)
    assert retry.status == "tagged" and repo_commits() == count + 1


def test_install_needs_trust_and_shows_the_plan(hub: HubServer, package: Path) -> None:
    result = push(package, token=ALICE, run_tests=False)
    shown: list[str] = []
    with pytest.raises(ConfigError, match="code from the Hub needs your trust"):
        install(f"{REPO}@0.1.0", confirm=lambda plan: shown.append(plan) or False)
    assert shown[0].startswith(f"alice/capital-cities 0.1.0 at commit {result.commit}\n")
    assert (
        "envs: capital-cities (capital_cities.env:CapitalCitiesEnv)" in shown[0]
        and "dependencies: envhub>=" in shown[0]
    )
    assert not Path("envhub.lock").exists()


def test_an_env_name_that_clashes_with_an_installed_env_is_refused(
    hub: HubServer, package: Path
) -> None:
    pyproject = package / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace(
            'capital-cities = "capital_cities', 'calculator = "capital_cities'
        )
    )
    push(package, token=ALICE, check=False)
    with pytest.raises(
        ConfigError,
        match=(
            r"provides env\(s\) already installed from another package: "
            r"calculator \(from envhub\)"
        ),
    ):
        install(f"{REPO}@0.1.0", trust=True, python=sys.executable)
    assert not Path("envhub.lock").exists()
