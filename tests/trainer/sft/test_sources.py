"""Demonstration sources: an env's reference policy filtered by the env's own reward, recorded
episodes and ``messages`` records filtered by ``min_reward``, datasets; bad records counted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from envhub.errors import ConfigError
from envhub.trainer.sft.config import DemoSource, SFTConfig
from envhub.trainer.sft.sources import load_source, read_record
from envhub.types import EnvRef, Trajectory, assistant, user

HALF_ENV = '''
import re
import envhub
from envhub.rewards.match import exact_match
from envhub.rewards.rubric import Rubric


class Half(envhub.SingleTurnEnv):
    """Say the number back; the reference policy only manages the even ones."""

    name = "half-solved"
    version = "0.0.1"
    reward_range = (0.0, 1.0)

    def load_dataset(self):
        return [{"question": f"Say {i}.", "answer": str(i)} for i in range(6)]

    def default_rubric(self):
        return Rubric([exact_match()])


def reference_policy(messages, tools):
    number = int(re.search(r"\\d+", messages[-1].content).group())
    return f"\\\\boxed{{{number}}}" if number % 2 == 0 else "no"


Half.reference_policy = staticmethod(reference_policy)
'''


def _load(source: DemoSource):
    return asyncio.run(load_source(source))


def test_the_reference_policy_keeps_only_episodes_at_the_top_of_the_reward_range(
    tmp_path: Path,
) -> None:
    env_file = tmp_path / "half.py"
    env_file.write_text(HALF_ENV)
    result = _load(DemoSource(env=f"{env_file}:Half", num_tasks=6))
    assert result.read == 6
    assert [c.origin for c in result.conversations] == [
        "half-solved task 0", "half-solved task 2", "half-solved task 4"
    ]  # fmt: skip
    assert dict(result.dropped) == {"below reward 1": 3}
    first = result.conversations[0]
    assert [m.role for m in first.messages][-2:] == ["user", "assistant"]
    assert first.messages[-1].content == "\\boxed{0}" and first.reward == 1.0
    assert result.describe().endswith("kept 3 of 6 (3 below reward 1)")


def test_an_env_without_a_reference_policy_says_what_to_give_instead(tmp_path: Path) -> None:
    env_file = tmp_path / "none.py"
    env_file.write_text(HALF_ENV + "\nHalf.reference_policy = None\n")
    with pytest.raises(ConfigError, match="has no reference_policy.*give recorded demonstrations"):
        _load(DemoSource(env=f"{env_file}:Half"))


def _episode(task: int, reward: float, *, failed: bool = False) -> dict:
    t = Trajectory(
        env=EnvRef(name="e"), task_index=task, sample_index=0, group_id="g0", seed=0,
        messages=[user(f"q{task}"), assistant(f"a{task}")], prompt_length=1, reward=reward,
        stop_reason="terminated", terminated=True,
    )  # fmt: skip
    data = t.model_dump(mode="json")
    if failed:
        data["errors"] = [{"stage": "env.step", "type": "RuntimeError", "message": "boom"}]
    return data


def test_records_are_filtered_by_reward_and_bad_lines_are_counted(tmp_path: Path) -> None:
    lines = [
        json.dumps(_episode(0, 1.0)),
        json.dumps(_episode(1, 0.0)),
        json.dumps(_episode(2, 1.0, failed=True)),
        json.dumps({"messages": [{"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": "hello"}], "reward": 0.9}),
        json.dumps({"messages": [{"role": "user", "content": "no reward"},
                                 {"role": "assistant", "content": "kept"}]}),
        "{not json",
        json.dumps({"prompt": "no messages"}),
        "",
    ]  # fmt: skip
    path = tmp_path / "demos.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = _load(DemoSource(path=path, min_reward=0.5))
    assert result.read == 7  # the blank line is no record
    assert [c.origin for c in result.conversations] == [
        "demos.jsonl:1", "demos.jsonl:4", "demos.jsonl:5"
    ]  # fmt: skip
    assert dict(result.dropped) == {
        "below reward 0.5": 1, "unfinished or failed episodes": 1, "unreadable": 2
    }  # fmt: skip
    assert result.first_problem == "below reward 0.5: demos.jsonl:2"
    unfiltered = _load(DemoSource(path=path))
    assert len(unfiltered.conversations) == 4  # every readable, finished record


def test_a_source_with_nothing_readable_names_the_first_problem(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "x"}\n')
    with pytest.raises(ConfigError, match="first problem: unreadable: bad.jsonl:1: a record needs"):
        _load(DemoSource(path=path))
    with pytest.raises(ConfigError, match="does not exist"):
        _load(DemoSource(path=tmp_path / "missing.jsonl"))


def test_a_folder_of_a_runs_trajectories_is_read_without_its_eval_subfolder(
    tmp_path: Path,
) -> None:
    (tmp_path / "eval").mkdir()
    (tmp_path / "step-000001.jsonl").write_text(json.dumps(_episode(0, 1.0)) + "\n")
    (tmp_path / "step-000002.jsonl").write_text(json.dumps(_episode(1, 1.0)) + "\n")
    (tmp_path / "eval" / "step-000002.jsonl").write_text(json.dumps(_episode(9, 1.0)) + "\n")
    result = _load(DemoSource(path=tmp_path))
    assert [c.origin for c in result.conversations] == [
        "step-000001.jsonl:1", "step-000002.jsonl:1"
    ]  # fmt: skip


def test_a_datasets_dataset_with_tools_as_json_text(tmp_path: Path) -> None:
    import datasets

    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    rows = {
        "messages": [
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            [{"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}],
        ],
        "tools": [json.dumps([tool]), ""],
    }
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "ds"))
    result = _load(DemoSource(dataset=str(tmp_path / "ds")))
    assert [c.tools for c in result.conversations] == [[tool], None]
    assert result.conversations[1].messages[1].content == "d"
    with pytest.raises(ConfigError, match="cannot load dataset"):
        _load(DemoSource(dataset=str(tmp_path / "nowhere")))


def test_a_record_with_malformed_tools_or_messages_says_which() -> None:
    with pytest.raises(ValueError, match="'tools' must be a list"):
        read_record({"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}}, "r")
    with pytest.raises(ValueError, match="not in OpenAI chat format"):
        read_record({"messages": [{"role": "wizard", "content": "x"}]}, "r")
    with pytest.raises(ValueError, match="'reward' must be a number"):
        read_record({"messages": [{"role": "user", "content": "x"}], "reward": "high"}, "r")


def test_the_config_takes_exactly_one_source_and_one_length() -> None:
    with pytest.raises(ValueError, match="exactly one of env"):
        DemoSource(env="arithmetic", path=Path("x.jsonl"))
    with pytest.raises(ValueError, match="args are env arguments"):
        DemoSource(path=Path("x.jsonl"), args={"a": 1})
    with pytest.raises(ValueError, match="either steps .* or epochs"):
        SFTConfig(sources=[DemoSource(env="arithmetic")], steps=3, epochs=1)
    with pytest.raises(ValueError, match="either steps .* or epochs"):
        SFTConfig(sources=[DemoSource(env="arithmetic")])
