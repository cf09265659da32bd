"""The task schedule: weighted envs, epoch permutations, and resumption from cursors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from envhub.errors import ConfigError
from envhub.rollout.tool_prompt import where_tools_go
from envhub.testing import ByteChatTokenizer
from envhub.trainer.config import EnvSpec
from envhub.trainer.engines.hf_tokenizer import HFChatTokenizer
from envhub.trainer.tasks import ScheduleState, TaskSchedule


def _schedule(seed: int = 0) -> TaskSchedule:
    specs = [
        EnvSpec(name="arithmetic", args={"num_tasks": 5}),
        EnvSpec(name="arithmetic", args={"num_tasks": 7, "difficulty": "hard"}, weight=3.0),
    ]
    return TaskSchedule.from_specs(specs, seed)


def test_sizes_and_thresholds_come_from_the_envs() -> None:
    schedule = _schedule()
    assert [s.size for s in schedule.slots] == [5, 7]
    assert [s.pass_threshold for s in schedule.slots] == [1.0, 1.0]


def test_each_epoch_is_a_permutation_of_the_tasks() -> None:
    schedule = TaskSchedule.from_specs([EnvSpec(name="arithmetic", args={"num_tasks": 5})], seed=1)
    drawn = [schedule.draw(step, 5)[0] for step in range(3)]
    assert all(sorted(epoch) == [0, 1, 2, 3, 4] for epoch in drawn)
    assert drawn[0] != drawn[1]  # a fresh order every epoch (this seed)


def test_draws_are_deterministic_and_resume_from_the_cursors() -> None:
    straight = _schedule()
    expected = [straight.draw(step, 4) for step in range(6)]
    first = _schedule()
    for step in range(3):
        assert first.draw(step, 4) == expected[step]
    resumed = _schedule()
    resumed.load_state_dict(first.state_dict())
    assert [resumed.draw(step, 4) for step in range(3, 6)] == expected[3:]


def test_a_checkpoint_of_other_envs_is_refused_with_what_to_do() -> None:
    first = _schedule()
    first.draw(0, 4)
    other = TaskSchedule.from_specs(
        [EnvSpec(name="guess-number"), EnvSpec(name="arithmetic", args={"num_tasks": 7})], 0
    )
    with pytest.raises(ConfigError) as raised:
        other.load_state_dict(first.state_dict())
    assert str(raised.value) == (
        "this run's folder has a checkpoint made on ['arithmetic', 'arithmetic'], the config "
        "trains on ['guess-number', 'arithmetic']: give the new run its own folder "
        "(logging.run_name=NAME) or start over in this one (checkpoint.resume=never)"
    )
    old = {"cursors": [3, 1]}  # saved before the names were: only the count is checked
    renamed = _schedule()
    renamed.load_state_dict(old)
    assert [s.cursor for s in renamed.slots] == [3, 1]
    with pytest.raises(ConfigError, match=r"made on 2 envs, the config trains on \['guess"):
        TaskSchedule.from_specs([EnvSpec(name="guess-number")], 0).load_state_dict(old)


def test_weights_split_the_slots() -> None:
    schedule = _schedule(seed=3)
    counts = [0, 0]
    for step in range(50):
        for env_index, tasks in enumerate(schedule.draw(step, 4)):
            counts[env_index] += len(tasks)
    assert sum(counts) == 200
    assert 0.65 < counts[1] / 200 < 0.85  # weight 3 of 4


def test_envs_count_their_tools_and_the_header_says_where_they_go(smollm2_dir: Path) -> None:
    schedule = TaskSchedule.from_specs(
        [EnvSpec(name="calculator", args={"num_tasks": 4}), EnvSpec(name="arithmetic")], seed=0
    )
    assert [s.num_tools for s in schedule.slots] == [1, 0]
    renders = ByteChatTokenizer()
    assert asyncio.run(where_tools_go(renders, 1)) == "1 tool(s), rendered by the chat template"
    smollm2 = HFChatTokenizer(AutoTokenizer.from_pretrained(smollm2_dir))
    assert asyncio.run(where_tools_go(smollm2, 1)).startswith(
        "1 tool(s) in the system prompt: the chat template ignores `tools`"
    )
    assert asyncio.run(where_tools_go(None, 2)) == (
        "2 tool(s), sent to the server as `tools` (chat mode)"
    )


def test_a_harness_envs_tools_are_its_programs_and_the_header_and_eval_say_so(
    smollm2_dir: Path, tmp_path: Path, unload: list[str]
) -> None:
    # What a user saw: eval said where tools go for a Harbor env, and nothing for a harness env.
    from envhub.cli.eval import plan_tasks

    path = tmp_path / "agent_env.py"
    path.write_text(
        "from envhub.harness import HarnessEnv\n\n"
        "def agent(client, prompt):\n    return ''\n\n"
        "env = HarnessEnv(agent, [{'question': 'Hi?'}])\n"
    )
    schedule = TaskSchedule.from_specs([EnvSpec(name=f"{path}:env")], seed=0)
    assert [(s.num_tools, s.tools_from_program) for s in schedule.slots] == [(0, True)]
    assert plan_tasks(f"{path}:env", {}, 1, 0).tools_from_program is True
    assert plan_tasks("arithmetic", {}, 1, 0).tools_from_program is False
    smollm2 = HFChatTokenizer(AutoTokenizer.from_pretrained(smollm2_dir))
    assert asyncio.run(where_tools_go(smollm2, 0, from_program=True)).startswith(
        "the program's tools (sent with its calls) in the system prompt: the chat template "
        "ignores `tools`"
    )
    assert asyncio.run(where_tools_go(None, 0, from_program=True)) == (
        "the program's tools, sent to the server as `tools` (chat mode)"
    )


def test_a_schedule_state_reads_every_layout_a_run_wrote() -> None:
    oldest = {"cursors": [3, "5"]}  # before the envs' names were saved
    assert ScheduleState.from_json(oldest) == ScheduleState(cursors=[3, 5])
    assert ScheduleState(cursors=[3, 5]).to_json() == {"cursors": [3, 5], "envs": None}
    levelled = {"cursors": [1], "envs": ["arithmetic"], "curriculum": {"stats": []},
                "level_cursors": [{"easy": "2"}]}  # fmt: skip
    state = ScheduleState.from_json(levelled)
    assert state.level_cursors == [{"easy": 2}] and state.curriculum == {"stats": []}
    assert state.to_json() == {**levelled, "level_cursors": [{"easy": 2}]}
