"""The distillation phase: what the teacher is shown (the student's tokens, or another prompt
for the same task), how its logprobs line up, and the batch's new advantages."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

import pytest

import envhub
from envhub.errors import ConfigError, EnvhubError
from envhub.rollout.tool_prompt import ToolsInPrompt
from envhub.testing import ByteChatTokenizer
from envhub.trainer.batch import Batch, Sample
from envhub.trainer.config import EnvSpec, validate_config
from envhub.trainer.distill.phase import Distiller, TeacherContext, TeacherView, env_index_of
from envhub.types import EnvRef, Trajectory, as_message

LN = math.log


def test_a_groups_env_is_read_from_its_id() -> None:
    assert env_index_of("s3e0g1") == 0
    assert env_index_of("s12r2e3g10") == 3
    with pytest.raises(EnvhubError, match="not a training group"):
        env_index_of("g0")


def test_a_teacher_view_lines_its_logprobs_up_with_the_students_tokens() -> None:
    # The student's record: 3 prompt tokens, then 2 sampled; the teacher's prompt is 5 tokens.
    view = TeacherView(token_ids=[9] * 5 + [7, 8], shift=2, start=3)
    teacher = [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6]  # logprob of its tokens 1..6
    assert view.align(teacher, 5) == [None, None, None, -0.5, -0.6]
    own = TeacherView(token_ids=[1, 2, 3], shift=0, start=1)
    assert own.align([-1.0, -2.0], 3) == [None, -1.0, -2.0]


def _episode(
    env_args: dict, task: int, seed: int, sampled: list[int]
) -> tuple[Trajectory, list[int]]:
    """A calculator episode's record as the runner makes it: the rendered prompt, then tokens."""
    tok = ByteChatTokenizer()
    env = envhub.make("calculator", **env_args)
    observation, _ = env.reset(seed=seed, options={"task_index": task})
    prompt = asyncio.run(
        ToolsInPrompt(tok).render([as_message(m) for m in observation], env.tool_schemas, True)
    )
    ids = prompt + sampled
    trajectory = Trajectory(
        env=EnvRef(name="calculator"), task_index=task, sample_index=0, group_id="s1e0g0",
        seed=seed, messages=list(observation), prompt_length=len(observation), reward=0.0,
        token_ids=ids, loss_mask=[0] * len(prompt) + [1] * len(sampled),
        sampler_logprobs=[0.0] * len(prompt) + [-1.0] * len(sampled),
        prompt_token_count=len(prompt),
    )  # fmt: skip
    return trajectory, prompt


def test_the_teacher_is_shown_the_envs_prompt_with_its_args_then_the_students_tokens() -> None:
    sampled = list(b"<tool_call>") + [ByteChatTokenizer.IM_END]
    student, student_prompt = _episode({}, task=4, seed=11, sampled=sampled)
    _, teacher_prompt = _episode({"demonstration": True}, task=4, seed=11, sampled=[])
    assert len(teacher_prompt) > len(student_prompt)  # the worked exchange
    context = TeacherContext(
        {"demonstration": True}, [EnvSpec(name="calculator")], ByteChatTokenizer()
    )
    sample = Sample(student.token_ids, student.loss_mask, student.sampler_logprobs, 0.0, 0)
    view = asyncio.run(context.view(sample, student))
    assert view.token_ids == teacher_prompt + sampled
    assert view.shift == len(teacher_prompt) - len(student_prompt)
    assert view.start == len(student_prompt)
    # The teacher's logprob of its token i + 1 sits at i: its sampled tokens' land on the
    # student's sampled places.
    teacher = [float(-i) for i in range(1, len(view.token_ids))]
    aligned = view.align(teacher, len(sample))
    first = len(student_prompt)
    assert aligned[first] == float(-len(teacher_prompt))  # the teacher's token len(prompt)
    assert aligned[:first] == [None] * first
    plain = TeacherContext({}, [EnvSpec(name="calculator")], ByteChatTokenizer())
    assert asyncio.run(plain.view(sample, student)).token_ids == student.token_ids
    context.close()


class FixedTeacher:
    """A teacher whose logprob of every token is ``value`` (the pure math under test)."""

    def __init__(self, value: float) -> None:
        self.value, self.scored = value, []

    async def start(self, tokenizer: object) -> None:
        pass

    async def logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        self.scored += [list(s) for s in sequences]
        return [[self.value] * (len(s) - 1) for s in sequences]

    def describe(self) -> str:
        return "fixed"

    async def aclose(self) -> None:
        pass


def _run_config(**distill: object) -> object:
    return validate_config({
        "steps": 4, "envs": [{"name": "calculator"}],
        "algorithm": {"dynamic_sampling": False},
        "distill": {"teacher": {"kind": "server", "url": "http://x"}, **distill},
    })  # fmt: skip


def test_the_distiller_mixes_the_teachers_signal_into_each_sampled_token() -> None:
    config = _run_config(weight=1.0, final_weight=0.0, schedule="linear", reward_weight=0.5)
    teacher = FixedTeacher(LN(0.5))
    distiller = Distiller(config, teacher, TeacherContext({}, config.envs, None))
    rl = Sample([1, 2, 3, 4], [0, 0, 1, 1], [0.0, 0.0, LN(0.25), LN(0.5)], 2.0, 0)
    demo = Sample([1, 5, 6], [0, 1, 1], [0.0] * 3, 0.0, -1, supervised=1.0)
    trajectories = [
        Trajectory(
            env=EnvRef(name="c"), task_index=0, sample_index=0, group_id="s1e0g0", seed=0,
            messages=[], prompt_length=0,
        )
    ]  # fmt: skip
    batch, metrics = asyncio.run(distiller(1, Batch([rl, demo]), trajectories))  # weight 2/3
    w = 1 - 1 / 3
    got = batch.samples[0].token_advantages
    assert got == pytest.approx([0.0, 0.0, 0.5 * 2.0 + w * LN(2), 0.5 * 2.0 + w * 0.0])
    assert batch.samples[1] is demo and teacher.scored == [[1, 2, 3, 4]]  # demos not scored
    assert metrics["distill/weight"] == pytest.approx(w)
    assert metrics["distill/reverse_kl"] == pytest.approx((LN(0.25) - LN(0.5)) / 2)
    # At the last RL step the coefficient is 0: only the reward weight applies, nothing scored.
    last, metrics = asyncio.run(distiller(3, Batch([rl]), trajectories))
    assert last.samples[0].token_advantages == [0.0, 0.0, 1.0, 1.0]
    assert metrics == {"distill/weight": 0.0} and len(teacher.scored) == 1


def test_a_coefficient_of_zero_with_the_full_reward_leaves_the_batch_as_rl_built_it() -> None:
    config = _run_config(weight=0.0, final_weight=1.0, schedule="linear")
    distiller = Distiller(config, FixedTeacher(0.0), TeacherContext({}, config.envs, None))
    batch = Batch([Sample([1, 2], [0, 1], [0.0, -1.0], 2.0, 0)], {"batch/kept": 1.0})
    assert asyncio.run(distiller(0, batch, []))[0] is batch


def test_the_run_config_refuses_dynamic_sampling_with_a_teacher() -> None:
    with pytest.raises(ConfigError, match="set algorithm.dynamic_sampling=false"):
        validate_config({
            "envs": [{"name": "calculator"}],
            "distill": {"teacher": {"kind": "server", "url": "http://x"}},
        })  # fmt: skip
    alone = validate_config({
        "envs": [{"name": "calculator"}], "rollout": {"samples_per_task": 1},
        "algorithm": {"dynamic_sampling": False},
        "distill": {"teacher": {"kind": "server", "url": "http://x"}, "reward_weight": 0.0},
    })  # fmt: skip
    assert alone.rollout.samples_per_task == 1  # no group needed without the reward
