"""Eval results and leaderboards on the local Hub server, through the real ``huggingface_hub``
client: pinned, attributed, append-only results; one version per leaderboard; the card's
section. The evals are played by scripted policies on the ``envhub init`` package's env."""

from __future__ import annotations

import asyncio
import json
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from conftest import ALICE, BOB
from hub_server import HubServer
from huggingface_hub import HfApi
from typer.testing import CliRunner

from envhub.cli.app import app
from envhub.errors import ConfigError
from envhub.evaluation import evaluate
from envhub.hub import pull, push
from envhub.hub.card import CARD_LEADERBOARD, LEADERBOARD_END
from envhub.hub.leaderboard import row
from envhub.hub.result_push import push_result
from envhub.hub.results import EvalResult, build_result, read_results
from envhub.hub.trajectories import load_trajectories
from envhub.rollout.io import TrajectoryWriter, read_trajectories
from envhub.rollout.manifest import manifest
from envhub.testing import ScriptedEngine
from envhub.types import EnvRef, Trajectory

REPO = "alice/capital-cities"
SAMPLING = {"max_tokens": 64, "temperature": 0.7, "top_p": 1.0}


def bump(package: Path, old: str, new: str) -> None:
    for name in ("pyproject.toml", "capital_cities/env.py"):
        path = package / name
        path.write_text(path.read_text().replace(f'version = "{old}"', f'version = "{new}"'))


def unsure(messages: Any, tools: Any) -> str:
    """Answers every question with a city nobody asked for: the format reward alone (0.1)."""
    return "Answer: Atlantis"


def eval_folder(folder: Path, package: Path, version: str, commit: str | None, policy: Any) -> Path:
    """Play 4 tasks x 2 samples of the package's env (pinned to ``commit``) and save them as
    ``envhub eval`` does."""
    import sys

    sys.path.insert(0, str(package))
    from capital_cities.env import CapitalCitiesEnv

    class Pinned(CapitalCitiesEnv):
        @property
        def ref(self) -> EnvRef:
            return EnvRef(name=self.name, version=version, commit=commit)

    done = asyncio.run(evaluate(ScriptedEngine(policy), Pinned, range(4), samples_per_task=2))
    folder.mkdir(parents=True)
    with TrajectoryWriter(folder / "trajectories.jsonl") as writer:
        for trajectory in done.trajectories:
            writer.write(trajectory)
    config = {"env": "capital-cities", "env_args": {}, "model": policy.__name__,
              "base_url": "http://127.0.0.1:1/v1", "mode": "chat", "tasks": [0, 1, 2, 3],
              "rollouts": 2, "seed": 0, "sampling": SAMPLING,
              **manifest(done.trajectories)}  # fmt: skip
    (folder / "summary.json").write_text(done.summary.model_dump_json())
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def result_of(tmp_path: Path, package: Path, version: str, commit: str | None, policy: Any,
              pushed_by: str, day: int) -> EvalResult:  # fmt: skip
    folder = eval_folder(tmp_path / f"eval-{pushed_by}-{version}-{day}", package, version,
                         commit, policy)  # fmt: skip
    when = datetime(2025, 1, day, 12, tzinfo=timezone.utc)
    return build_result(folder, repo_id=REPO, pushed_by=pushed_by, now=when)


def card(hub: HubServer) -> str:
    repo = hub.repos[("model", REPO)]
    text = repo.commits[repo.branches["main"]].files["README.md"].decode()
    return text.partition(CARD_LEADERBOARD)[2].partition(LEADERBOARD_END)[0]


@pytest.fixture
def solve(package: Path, unload: list[str]) -> Any:
    import sys

    sys.path.insert(0, str(package))
    from capital_cities.env import solve

    return solve


def test_two_users_two_versions_pinned_attributed_never_mixed(
    hub: HubServer, package: Path, tmp_path: Path, solve: Any
) -> None:
    first = push(package, token=ALICE, check=False)
    assert "No results for version 0.1.0 yet." in card(hub)
    mine = result_of(tmp_path, package, "0.1.0", first.commit, solve, "alice", 1)
    pushed = push_result(mine, token=ALICE)
    assert pushed.pull_request is None and pushed.path.startswith("results/20250101T120000Z-alice-")
    theirs = result_of(tmp_path, package, "0.1.0", first.commit, unsure, "bob", 2)
    proposed = push_result(theirs, token=BOB)  # bob may not write to alice's repo: a PR
    assert proposed.pull_request == f"{hub.url}/{REPO}/discussions/1"
    assert read_results(REPO) == [mine]  # read back equal; bob's counts once merged
    assert "| 1 | solve | 1.000 [1.000, 1.000] | 1.000 [1.000, 1.000] |" in card(hub)

    HfApi(endpoint=hub.url, token=ALICE).merge_pull_request(REPO, 1)
    assert read_results(REPO) == [mine, theirs]
    assert [(r.by, r.pushed_by, r.env.commit) for r in read_results(REPO)] == [
        ("alice", "alice", first.commit),
        ("bob", "bob", first.commit),
    ]

    bump(package, "0.1.0", "0.2.0")
    second = push(package, token=ALICE, check=False)
    assert "No results for version 0.2.0 yet.\n\nResults of other versions: 0.1.0 (2)." in card(hub)
    assert pull(f"{REPO}@0.2.0").version == "0.2.0"  # results/ in its tree: not package content
    newer = result_of(tmp_path, package, "0.2.0", second.commit, unsure, "alice", 3)
    push_result(newer, token=ALICE)
    assert len(read_results(REPO)) == 3  # the package push kept the results

    latest = runner.invoke(app, ["leaderboard", REPO, "--json"])
    data = json.loads(latest.output)
    assert (data["version"], data["versions"]) == ("0.2.0", {"0.2.0": 1, "0.1.0": 2})
    assert [(r["model"], r["by"]) for r in data["rows"]] == [("unsure", "alice")]
    older = json.loads(
        runner.invoke(app, ["leaderboard", REPO, "--version", "0.1.0", "--json"]).output
    )
    assert [(r["rank"], r["model"], r["by"]) for r in older["rows"]] == [
        (1, "solve", "alice"),
        (2, "unsure", "bob"),
    ]
    table = runner.invoke(app, ["leaderboard", REPO], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "alice/capital-cities 0.2.0" in table.output
    assert "Results of other versions: 0.1.0 (2)." in table.output
    assert "Results of other versions: 0.1.0 (2)." in card(hub) and "| 1 | unsure |" in card(hub)


runner = CliRunner()


def test_a_second_push_adds_a_file_and_changes_none(
    hub: HubServer, package: Path, tmp_path: Path, solve: Any
) -> None:
    first = push(package, token=ALICE, check=False)
    one = push_result(result_of(tmp_path, package, "0.1.0", first.commit, solve, "alice", 1),
                      token=ALICE)  # fmt: skip
    repo = hub.repos[("model", REPO)]
    before = repo.commits[repo.branches["main"]].files
    two = push_result(result_of(tmp_path, package, "0.1.0", first.commit, unsure, "alice", 2),
                      token=ALICE)  # fmt: skip
    after = repo.commits[repo.branches["main"]].files
    results = sorted(p for p in after if p.startswith("results/"))
    assert results == sorted([one.path, two.path]) and after[one.path] == before[one.path]
    assert {p for p in after if after[p] != before.get(p)} == {two.path, "README.md", "envhub.json"}
    assert json.loads(after["envhub.json"])["content_hash"] == first.content_hash


def test_a_result_must_be_pinned_to_the_published_commit(
    hub: HubServer, package: Path, tmp_path: Path, solve: Any
) -> None:
    push(package, token=ALICE, check=False)
    with pytest.raises(ConfigError, match="is not pinned to a Hub commit"):
        result_of(tmp_path, package, "0.1.0", None, solve, "alice", 1)
    other = result_of(tmp_path, package, "0.1.0", "f" * 40, solve, "alice", 2)
    with pytest.raises(ConfigError, match=f"but version 0.1.0 of {REPO} is commit"):
        push_result(other, token=ALICE)
    unpublished = result_of(tmp_path, package, "0.3.0", "f" * 40, solve, "alice", 3)
    with pytest.raises(ConfigError, match="0.3.0 of alice/capital-cities is not published"):
        push_result(unpublished, token=ALICE)
    assert read_results(REPO) == []


def test_leaderboard_json_is_exact(
    hub: HubServer, package: Path, tmp_path: Path, solve: Any
) -> None:
    commit = push(package, token=ALICE, check=False).commit
    low = result_of(tmp_path, package, "0.1.0", commit, unsure, "alice", 1)
    high = result_of(tmp_path, package, "0.1.0", commit, solve, "alice", 2)
    for result in (low, high):
        push_result(result, token=ALICE)
    shown = runner.invoke(app, ["leaderboard", REPO, "--json"])
    assert shown.exit_code == 0, shown.output

    def expected(rank: int, result: EvalResult, reward: float, passed: float) -> dict:
        return {"rank": rank, "model": result.model, "model_revision": None,
                "reward_mean": reward, "reward_ci95": [reward, reward],
                "pass_at": {k: {"value": passed, "ci95": [passed, passed]} for k in ("1", "2")},
                "episodes": 8, "tasks": 4, "samples_per_task": 2, "sampling": SAMPLING,
                "by": "alice", "pushed_by": "alice", "date": result.date, "commit": commit,
                "envhub_version": result.envhub_version, "config_sha256": result.config_sha256,
                "file": result.path(), "trajectories": None}  # fmt: skip

    assert json.loads(shown.output) == {
        "repo": REPO,
        "version": "0.1.0",
        "versions": {"0.1.0": 2},
        "rows": [expected(1, high, 1.0, 1.0), expected(2, low, 0.1, 0.0)],
    }
    assert row(1, high) == expected(1, high, 1.0, 1.0)
    assert (high.date, low.model, high.config["env_refs"][0]["commit"]) == (
        "2025-01-02T12:00:00Z",
        "unsure",
        commit,
    )
    assert "base_url" not in high.config


def test_eval_push_through_the_cli(
    hub: HubServer,
    package: Path,
    tmp_path: Path,
    http_server: Any,
    monkeypatch: Any,
    solve: Any,
) -> None:
    from capital_cities.env import TASKS

    commit = push(package, token=ALICE, check=False).commit
    # What an install from the Hub records (tested in test_fresh_venv): the env's commit.
    monkeypatch.setattr(
        "envhub.hub.provenance.env_ref", lambda env: env.ref.model_copy(update={"commit": commit})
    )
    answers = {t["question"]: t["answer"] for t in TASKS}

    def solver(method: str, path: str, body: Any) -> tuple[int, Any]:
        if path == "/v1/models":
            return 200, {"data": [{"id": "solver"}]}
        if path != "/v1/chat/completions":  # no /tokenize: chat mode
            return 404, {"error": {"message": f"no route {path}"}}
        text = f"Answer: {answers[body['messages'][-1]['content']]}"
        message = {"role": "assistant", "content": text}
        return 200, {"choices": [{"message": message, "finish_reason": "stop"}]}

    server = http_server(solver)
    env = f"{package}/capital_cities/env.py:CapitalCitiesEnv"
    args = ["eval", env, "-u", f"{server.url}/v1", "-n", "2", "-r", "2", "-o", str(tmp_path / "o")]
    unpinned = runner.invoke(app, [*args, "--push", "--hub-token", ALICE])
    assert isinstance(unpinned.exception, ConfigError) and "--push-repo" in str(unpinned.exception)
    shutil.rmtree(tmp_path / "o")
    alone = runner.invoke(app, [*args, "--push-trajectories"])
    assert str(alone.exception) == "--push-trajectories goes with --push (the result links to them)"
    done = runner.invoke(app, [*args, "--push", "--push-repo", REPO, "--by", "Alice's lab",
                               "--model-revision", "v1", "--hub-token", ALICE,
                               "--push-trajectories"])  # fmt: skip
    assert done.exit_code == 0, done.output
    [result] = read_results(REPO)
    ref = result.trajectories
    assert ref is not None and (ref.repo, ref.rows) == (
        "alice/capital-cities-solver-trajectories",
        4,
    )
    assert " ".join(done.output.split()).endswith(
        f"trajectories pushed to dataset {ref.repo}: {ref.path} (4 episodes) "
        f"result pushed to {REPO} (main): {result.path()}"
    )
    # The dataset reads back equal to the eval's trajectories, through the client and datasets.
    dataset = load_trajectories(ref)
    played = read_trajectories(tmp_path / "o" / "trajectories.jsonl")
    assert [Trajectory.model_validate_json(t) for t in dataset["trajectory"]] == played
    assert dataset["reward"] == [1.0] * 4 and set(dataset["env_commit"]) == {commit}
    assert dataset["messages"][0][-1] == {
        "role": "assistant",
        "content": played[0].messages[-1].content,
    }
    assert row(1, result)["trajectories"] == (
        f"{hub.url}/datasets/{ref.repo}/blob/{ref.commit}/{ref.path}"
    )
    dataset_files = hub.repos[("dataset", ref.repo)].commits[ref.commit].files
    assert sorted(dataset_files) == [".gitattributes", "README.md", ref.path]
    assert (result.by, result.pushed_by, result.model, result.model_revision) == (
        "Alice's lab", "alice", "solver", "v1",
    )  # fmt: skip
    assert (result.env.version, result.env.commit, result.episodes, result.reward.value) == (
        "0.1.0", commit, 4, 1.0,
    )  # fmt: skip
    assert json.loads((tmp_path / "o" / "hub_result.json").read_text()) == json.loads(
        result.to_json()
    )
