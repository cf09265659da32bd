"""An env written from scratch in one file (two tools and a reward; no pyproject, README, tests
or version) through ``envhub check``, ``eval`` and ``train --dry-run``, by its reference
``path/file.py:Class`` or ``path/file.py``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from envhub.cli.app import app
from envhub.cli.console import console
from envhub.errors import ConfigError, EnvLoadError, EnvNotFoundError
from envhub.references import load_reference
from envhub.rollout.io import read_trajectories
from envhub.types import Message
from tests.file_envs import LOOKUP_SUM, write_env_file

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


@pytest.fixture
def env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unload: list[str]) -> Path:
    """``lookup_sum.py`` in tmp_path; the console wide enough for one table row per line."""
    monkeypatch.setattr(console, "_width", 300)
    return write_env_file(tmp_path)


def rows(output: str) -> dict[str, tuple[str, str]]:
    cells = [line.split("│")[1:4] for line in output.splitlines() if line.startswith("│")]
    return {name.strip(): (result.strip(), detail.strip()) for name, result, detail in cells}


@pytest.mark.parametrize("form", ["{path}", "{path}:LookupSum", "lookup_sum:LookupSum"])
def test_check_runs_the_contract_and_the_audit_without_publishing_gates(
    env_file: Path, form: str, monkeypatch: pytest.MonkeyPatch, unload: list[str]
) -> None:
    monkeypatch.syspath_prepend(str(env_file.parent))  # for the module form
    unload.append("lookup_sum")
    reference = form.format(path=env_file)
    result = runner.invoke(app, ["check", reference])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].strip() == f"lookup_sum ({reference}): passed"
    table = rows(result.output)
    assert list(table) == [
        "api",
        "reset",
        "dataset",
        "determinism",
        "tool schemas",
        "episodes",
        "null policy at floor",
        "reference policy at top",
        "close",
        "reward audit",
    ]
    assert {name: outcome for name, (outcome, _) in table.items()} == dict.fromkeys(table, "ok")
    assert table["api"][1] == "LookupSum v0.0.0"  # no version: the default, and that is fine here
    assert table["tool schemas"][1] == "lookup, add"
    assert table["reference policy at top"][1] == "1.0"
    assert result.output.splitlines()[-1] == (
        "Local check: the publishing gates (metadata and README, version, performance, tests) "
        "need a package; `envhub init NAME` makes one, and `envhub check NAME --publish` runs them."
    )


def test_publish_asks_for_a_package(env_file: Path) -> None:
    result = runner.invoke(app, ["check", str(env_file), "--publish"])
    assert (result.exit_code, type(result.exception)) == (1, ConfigError)
    assert str(result.exception).startswith(
        f"--publish runs the publishing gates on a package folder; {env_file} is not one."
    )


def test_a_folder_without_pyproject_names_its_env_files(env_file: Path) -> None:
    result = runner.invoke(app, ["check", str(env_file.parent)])
    assert (result.exit_code, type(result.exception)) == (1, EnvLoadError)
    assert str(result.exception) == (
        f"{env_file.parent.resolve()} is not an env package: it has no pyproject.toml. Name an "
        f"env file instead ({env_file.resolve()}:LookupSum), or create a package with "
        "`envhub init`"
    )


def test_check_shows_the_error_in_the_users_file(env_file: Path) -> None:
    env_file.write_text(
        env_file.read_text().replace('"fig": 11}', '"fig": 11}\nPRICES["kiwi"] += 1')
    )
    line = env_file.read_text().splitlines().index('PRICES["kiwi"] += 1') + 1
    result = runner.invoke(app, ["check", f"{env_file}:LookupSum"])
    assert (result.exit_code, type(result.exception)) == (1, EnvLoadError)
    assert str(result.exception) == (
        f"importing {env_file} (for '{env_file}:LookupSum') raised KeyError: 'kiwi' "
        f'at {env_file.resolve()}:{line}: PRICES["kiwi"] += 1'
    )


def test_check_fails_a_broken_reward_in_the_file(env_file: Path) -> None:
    env_file.write_text(env_file.read_text().replace("found[-1] == answer", "found[-1] == 'x'"))
    result = runner.invoke(app, ["check", str(env_file)])
    assert result.exit_code == 1
    table = rows(result.output)
    assert {n: o for n, (o, _) in table.items() if o != "ok"} == {"reference policy at top": "fail"}


def solver(method: str, path: str, body: Any) -> tuple[int, Any]:
    """A chat server that answers with the file env's reference policy."""
    solve = load_reference(str(LOOKUP_SUM)).reference_policy
    if path == "/v1/models":
        return 200, {"data": [{"id": "solver"}]}
    messages = [Message.model_validate(m) for m in body["messages"]]
    text = solve(messages, body.get("tools"))
    choice = {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    return 200, {"choices": [choice]}


def test_eval_plays_the_file_env(env_file: Path, http_server, tmp_path: Path) -> None:
    server = http_server(solver)
    out = tmp_path / "run"
    reference = f"{env_file}:LookupSum"
    args = ["eval", reference, "-u", f"{server.url}/v1", "-n", "3", "-r", "1", "-o", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    trajectories = read_trajectories(out / "trajectories.jsonl")
    assert [(t.reward, len(t.turns), t.env.name) for t in trajectories] == [
        (1.0, 3, "lookup_sum")
    ] * 3
    assert json.loads((out / "config.json").read_text())["env"] == reference


def test_eval_names_its_folder_after_the_env() -> None:
    from envhub.cli.eval import default_output

    folder = default_output(str(LOOKUP_SUM), "org/model")
    assert re.fullmatch(r"lookup_sum-model-\d{8}-\d{6}", folder.name)
    assert folder.parent == Path("outputs") / "eval"


def test_train_dry_run_takes_the_file_env_and_stores_its_absolute_path(
    env_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    monkeypatch.chdir(env_file.parent)
    result = runner.invoke(
        app,
        [
            "train",
            str(QUICKSTART),
            "envs.0.name=lookup_sum.py:LookupSum",
            "envs.0.args={}",
            "eval.envs.0.name=lookup_sum.py",
            "eval.envs.0.args={}",
            "--dry-run",
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"- name: {env_file.resolve()}:LookupSum\n" in result.output
    assert f"- name: {env_file.resolve()}\n" in result.output


@pytest.mark.parametrize(
    ("override", "error", "message"),
    [
        (
            "envs.0.name=arithmatic",
            EnvNotFoundError,
            "envs.0.name: no env named 'arithmatic'. Did you mean 'arithmetic'?",
        ),
        (
            "eval.envs.0.name=arithmatic",
            EnvNotFoundError,
            "eval.envs.0.name: no env named 'arithmatic'. Did you mean 'arithmetic'?",
        ),
        (
            "envs.0.name={path}:LookupSun",
            EnvNotFoundError,
            "envs.0.name: {path} has no 'LookupSun' (in '{path}:LookupSun'); the Env subclasses "
            "it defines: LookupSum",
        ),
        (
            "envs.0.name={folder}/missing.py",
            EnvNotFoundError,
            "envs.0.name: env file {folder}/missing.py (in '{folder}/missing.py') does not exist",
        ),
    ],
    ids=["unknown-name", "unknown-eval-name", "no-such-class", "no-such-file"],
)
def test_train_dry_run_fails_on_a_bad_env_before_any_model_loads(
    env_file: Path, override: str, error: type[Exception], message: str
) -> None:
    override = override.format(path=env_file, folder=env_file.parent)
    result = runner.invoke(
        app, ["train", str(QUICKSTART), override, "model.name=/no/such/model", "--dry-run"]
    )
    assert (result.exit_code, type(result.exception)) == (1, error), result.output
    assert str(result.exception).startswith(message.format(path=env_file, folder=env_file.parent))


def test_list_shows_the_references_a_file_offers(env_file: Path) -> None:
    result = runner.invoke(app, ["list", str(env_file)])
    assert result.exit_code == 0, result.output
    lines = [line.rstrip() for line in result.output.splitlines()]
    assert lines[0] == f"envs in {env_file}"
    assert lines[1].split() == ["name", "kind", "tools", "version", "from", "description"]
    assert lines[2].split() == [
        f"{env_file}:LookupSum", "tool", "lookup,", "add", "0.0.0", str(env_file),
        *"Look up two prices and add them.".split(),
    ]  # fmt: skip
    assert len(lines) == 3


HARNESS_INSTANCE = """
import envhub
from envhub.harness import HarnessEnv


async def my_agent(client, prompt):
    messages = [{"role": "user", "content": prompt}]
    reply = await client.chat.completions.create(model="policy", messages=messages)
    return reply.choices[0].message.content


@envhub.reward
def says_four(state) -> float:
    return float(state.data["result"].rstrip(".").split()[-1:] == ["4"])


env = HarnessEnv(my_agent, [{"question": "What is 2 + 2?"}], rubric=envhub.Rubric([says_four]))
"""


def test_the_harness_guides_instance_checks_and_trains(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, unload: list[str]
) -> None:
    # What a user saw: "defines no subclass of envhub.Env", and for file.py:env "is a
    # HarnessEnv, not a subclass of envhub.Env".
    pytest.importorskip("openai")
    monkeypatch.setattr(console, "_width", 300)
    path = tmp_path / "four_agent.py"
    path.write_text(HARNESS_INSTANCE)
    checked = runner.invoke(app, ["check", str(path)])
    assert checked.exit_code == 0, checked.output
    assert rows(checked.output)["api"] == ("ok", "HarnessEnv v0.1.0")
    assert rows(checked.output)["reward audit"][0] == "ok"
    out = tmp_path / "outputs"
    trained = runner.invoke(
        app,
        [
            "train",
            str(QUICKSTART),
            f"envs.0.name={path}:env",
            f"model.name={tiny_model_dir}",
            "steps=1",
            "rollout.tasks_per_step=1",
            "rollout.samples_per_task=2",
            "rollout.max_tokens=4",
            "algorithm.max_empty_steps=null",
            "backend.device=cpu",
            f"logging.output_dir={out}",
            "logging.plot=false",
        ],  # fmt: skip
    )
    assert trained.exit_code == 0, trained.output
    run = out / f"four_agent-{tiny_model_dir.name.lower()}"  # named after the env, not quickstart
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").open()] == [1]
    episodes = read_trajectories(run / "trajectories" / "step-000001.jsonl")
    assert [t.env.name for t in episodes] == ["four_agent"] * 2
    assert all(t.outcome == "ok" and len(t.turns) == 1 for t in episodes)
