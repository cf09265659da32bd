"""Distillation in the step: between the batch and the update.

    score -> advantages -> batch -> [the teacher scores each sampled sequence
                                     -> per-token advantages += weight x (teacher - student)]
          -> update

:class:`Distiller` holds the teacher and how it sees each record (:class:`TeacherContext`):
the student's own tokens, or, with ``teacher.env_args``, the env's prompt under other arguments
for the same task followed by the rest of the student's record token for token (the teacher
of self-distillation is shown a worked example the student never sees). The student's logprob
of each token is the sampler's, recorded with it. At a coefficient of 0 and a reward weight of
1 nothing is scored and the batch is the one RL built, exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from envhub.errors import EnvhubError
from envhub.trainer.batch import Batch, Sample
from envhub.trainer.config import EnvSpec, TrainConfig
from envhub.trainer.distill.advantages import distill_token_advantages, reverse_kl_terms
from envhub.trainer.distill.choice import make_teacher
from envhub.trainer.distill.teachers import Teacher
from envhub.types import Trajectory

_ENV_OF_GROUP = re.compile(r"e(\d+)g\d+$")


def env_index_of(group_id: str) -> int:
    """Which of ``config.envs`` a training group came from: its id is
    ``s{step}[r{n}]e{env index}g{position}`` (``GroupProducer``'s jobs name them so).

    Raises:
        EnvhubError: Not such an id.
    """
    match = _ENV_OF_GROUP.search(group_id)
    if match is None:
        raise EnvhubError(f"{group_id!r} is not a training group's id (s<step>e<env>g<position>)")
    return int(match.group(1))


@dataclass(frozen=True)
class TeacherView:
    """A record as the teacher sees it."""

    token_ids: list[int]
    shift: int
    """The teacher's index of the student's token ``j`` is ``j + shift``."""
    start: int
    """The student's first token the teacher scores in the same context (1, or the first
    after the prompt it replaced)."""

    def align(self, teacher_logprobs: list[float], length: int) -> list[float | None]:
        """The teacher's logprob of each of the student's ``length`` tokens (``None`` before
        :attr:`start`): the teacher's list holds the logprob of its token ``i + 1`` at ``i``."""
        return [
            teacher_logprobs[j + self.shift - 1] if j >= self.start else None for j in range(length)
        ]


class TeacherContext:
    """What the teacher is shown (see the module doc).

    Args:
        env_args: Env arguments over each training env's (empty: the student's own tokens).
        specs: The run's envs (``config.envs``), by index.
        tokenizer: The policy's chat tokenizer (renders the teacher's prompts as rollouts do).
    """

    def __init__(self, env_args: dict[str, Any], specs: list[EnvSpec], tokenizer: Any) -> None:
        self.env_args = env_args
        self.specs = specs
        self.tokenizer = tokenizer
        self._envs: dict[int, Any] = {}
        self._prompts: dict[tuple[int, int, int], list[int]] = {}

    async def view(self, sample: Sample, trajectory: Trajectory) -> TeacherView:
        """How the teacher sees ``sample`` (a record of ``trajectory``). A harness segment and
        a seat of a multi-role episode are seen as they are: the env's reset prompt is neither
        one's."""
        own = TeacherView(list(sample.token_ids), 0, 1)
        prompt_length = trajectory.prompt_token_count
        if (
            not self.env_args
            or prompt_length is None
            or trajectory.role is not None
            or trajectory.token_ids != sample.token_ids
        ):
            return own
        prompt = await self._prompt(trajectory)
        rest = list(sample.token_ids[prompt_length:])
        return TeacherView(prompt + rest, len(prompt) - prompt_length, prompt_length)

    async def _prompt(self, t: Trajectory) -> list[int]:
        """The teacher's prompt for ``t``'s task: the env made with :attr:`env_args`, reset
        with the episode's seed and task, rendered with the tools as rollouts render them."""
        from envhub.rollout.tool_prompt import ToolsInPrompt
        from envhub.types import as_message

        index = env_index_of(t.group_id)
        key = (index, t.task_index, t.seed)
        if key not in self._prompts:
            env = self._env(index)
            observation, _ = await env.areset(seed=t.seed, options={"task_index": t.task_index})
            messages = [as_message(m) for m in observation]
            rendering = ToolsInPrompt(self.tokenizer)
            self._prompts[key] = await rendering.render(messages, env.tool_schemas, True)
        return self._prompts[key]

    def _env(self, index: int) -> Any:
        import envhub

        if index not in self._envs:
            spec = self.specs[index]
            self._envs[index] = envhub.make(spec.name, **(spec.args | self.env_args))
        return self._envs[index]

    def close(self) -> None:
        """Close the envs the prompts came from."""
        from envhub.env import close_quietly

        for env in self._envs.values():
            close_quietly(env)
        self._envs.clear()


@dataclass
class Distiller:
    """The teacher of a run and what it is shown, applied to each step's batch."""

    config: TrainConfig
    teacher: Teacher
    context: TeacherContext

    async def __call__(
        self, step: int, batch: Batch, trajectories: list[Trajectory]
    ) -> tuple[Batch, dict[str, float]]:
        """``batch`` with each sampled token's advantage mixed with the teacher's signal at
        step ``step`` (the run's, counted from 0), and the ``distill/*`` metrics."""
        distill = self.config.distill
        assert distill is not None
        weight = distill.weight_at(step - self.config.sft_steps, self.config.steps)
        metrics = {"distill/weight": weight}
        if weight == 0 and distill.reward_weight == 1:
            return batch, metrics
        policy = [k for k, s in enumerate(batch.samples) if not s.supervised]
        scored = [batch.samples[k] for k in policy]
        teacher = await self._teacher_logprobs(scored, trajectories) if weight else None
        samples, kl, seen = list(batch.samples), [], []
        for n, k in enumerate(policy):
            s = samples[k]
            # At a coefficient of 0 only the reward weight acts: nothing was scored.
            lt = teacher[n] if teacher is not None else [0.0] * len(s)
            ls = s.sampler_logprobs if teacher is not None else [0.0] * len(s)
            base = s.token_advantages or [s.advantage] * len(s)
            advantages = distill_token_advantages(
                base, lt, ls, s.loss_mask, weight, distill.reward_weight
            )
            samples[k] = replace(s, token_advantages=advantages)
            if teacher is not None:
                kl += reverse_kl_terms(lt, ls, s.loss_mask)
                seen += [t for t, m in zip(lt, s.loss_mask, strict=True) if m and t is not None]
        if kl:
            metrics["distill/reverse_kl"] = sum(kl) / len(kl)
            metrics["distill/teacher_logprob"] = sum(seen) / len(seen)
        return Batch(samples, batch.stats), metrics

    async def _teacher_logprobs(
        self, samples: list[Sample], trajectories: list[Trajectory]
    ) -> list[list[float | None]]:
        """The teacher's logprob of each token of each sample, as it sees the sample."""
        views = [await self.context.view(s, trajectories[s.trajectory]) for s in samples]
        scored = await self.teacher.logprobs([v.token_ids for v in views])
        return [v.align(lps, len(s)) for v, lps, s in zip(views, scored, samples, strict=True)]

    async def start(self, tokenizer: Any) -> str:
        """Start the teacher, checking its tokenizer; the run header's line."""
        await self.teacher.start(tokenizer)
        assert self.config.distill is not None
        return _describe(self.config, self.teacher)

    async def aclose(self) -> None:
        """Release the teacher and the envs of its prompts."""
        self.context.close()
        await self.teacher.aclose()


def _describe(config: TrainConfig, teacher: Teacher) -> str:
    distill = config.distill
    assert distill is not None
    weight = f"{distill.weight:g}"
    if distill.final_weight is not None:
        weight += f" -> {distill.final_weight:g} ({distill.schedule})"
    reward = (
        "alone (no reward)" if distill.reward_weight == 0
        else f"plus the env's advantage x {distill.reward_weight:g}"
    )  # fmt: skip
    return (
        f"{teacher.describe()}{distill.teacher.shown()}: reverse KL x {weight} per token, {reward}"
    )


def make_distiller(config: TrainConfig, backend: Any) -> Distiller | None:
    """The run's distiller (``None`` without ``distill:``)."""
    if config.distill is None:
        return None
    from envhub.trainer.engines.hf_tokenizer import policy_chat_tokenizer

    teacher = make_teacher(config.distill.teacher, backend)
    tokenizer = policy_chat_tokenizer(backend.model_path, backend.tokenizer)
    context = TeacherContext(config.distill.teacher.env_args, config.envs, tokenizer)
    return Distiller(config, teacher, context)
