"""An envhub env as a tinker cookbook RL dataset: groups of one task, batches of groups."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

import chz
import numpy as np
from tinker_cookbook import renderers
from tinker_cookbook.rl import types
from tinker_cookbook.tokenizer_utils import get_tokenizer

from envhub.adapters.cookbook.env import EnvhubEnv
from envhub.env import Env, close_quietly
from envhub.errors import EnvhubError
from envhub.loader import make
from envhub.rollout.runner import episode_seed


def make_env(name: str, args: dict[str, Any]) -> Env:
    """``envhub.make(name, **args)`` (module level, so a group builder pickles)."""
    return make(name, **args)


def task_count(env: Env) -> int:
    """How many tasks ``env`` draws from (``len(env.dataset)``); 0 for an env without a
    dataset, whose task its ``reset`` seed chooses."""
    dataset = getattr(env, "dataset", None)
    return len(dataset) if dataset is not None else 0


class EnvhubGroupBuilder(types.EnvGroupBuilder):
    """``group_size`` episodes of one task of an envhub env (their rewards are centred
    together, GRPO-style).

    Args:
        env_name: What ``envhub.make`` takes.
        env_args: The env's constructor arguments.
        renderer: The cookbook renderer of the policy's model.
        group_size: Episodes in the group.
        task_index: The task (``reset(options={"task_index": ...})``); ``None`` for an env
            without a dataset, whose episodes then share one reset seed.
        seed: The run's seed; each episode's reset seed derives from it, the task and the
            episode's place in the group (as envhub's own runner derives them).
    """

    def __init__(
        self,
        env_name: str,
        env_args: dict[str, Any],
        renderer: renderers.Renderer,
        group_size: int,
        task_index: int | None,
        seed: int,
    ) -> None:
        self.env_name, self.env_args, self.renderer = env_name, env_args, renderer
        self.group_size, self.task_index, self.seed = group_size, task_index, seed
        self.envs: list[EnvhubEnv] = []

    async def make_envs(self) -> Sequence[types.Env]:
        """The group's episodes; each makes its envhub env when it starts."""
        make = functools.partial(make_env, self.env_name, self.env_args)
        if self.task_index is None:
            self.envs = [
                EnvhubEnv(make, self.renderer, seed=self.seed) for _ in range(self.group_size)
            ]
        else:
            options = {"task_index": self.task_index}
            self.envs = [
                EnvhubEnv(make, self.renderer, episode_seed(self.seed, self.task_index, i), options)
                for i in range(self.group_size)
            ]
        return self.envs

    async def cleanup(self) -> None:
        """Close every episode's envhub env (idempotent)."""
        for env in self.envs:
            env.close()

    def logging_tags(self) -> list[str]:
        """The env's name, so the cookbook logs its metrics under ``env/<name>/...``."""
        return [self.env_name]


class EnvhubDataset(types.RLDataset):
    """``n_batches`` batches of ``batch_size`` groups, each group one task of the env, the
    tasks in an order shuffled by ``seed`` and cycled through.

    Args:
        tasks: How many tasks the env has (0: none; each group then gets its own seed).
        Others: see :class:`EnvhubGroupBuilder`.
    """

    def __init__(
        self,
        env_name: str,
        env_args: dict[str, Any],
        renderer: renderers.Renderer,
        batch_size: int,
        group_size: int,
        n_batches: int,
        tasks: int,
        seed: int = 0,
    ) -> None:
        self.env_name, self.env_args, self.renderer = env_name, env_args, renderer
        self.batch_size, self.group_size, self.n_batches = batch_size, group_size, n_batches
        self.seed = seed
        self.order = [int(i) for i in np.random.default_rng(seed).permutation(tasks)]

    def task_of(self, number: int) -> int | None:
        """The task of the run's ``number``-th group (``None``: the env has no dataset)."""
        return self.order[number % len(self.order)] if self.order else None

    def get_batch(self, index: int) -> Sequence[EnvhubGroupBuilder]:
        """Batch ``index``: ``batch_size`` groups."""
        numbers = range(index * self.batch_size, (index + 1) * self.batch_size)
        return [self._group(n) for n in numbers]

    def __len__(self) -> int:
        return self.n_batches

    def _group(self, number: int) -> EnvhubGroupBuilder:
        task = self.task_of(number)
        seed = self.seed if task is not None else self.seed + number
        return EnvhubGroupBuilder(
            self.env_name, self.env_args, self.renderer, self.group_size, task, seed
        )


def parse_args(text: str) -> dict[str, Any]:
    """``env_args`` as given on a recipe's command line: a JSON object.

    Raises:
        EnvhubError: It is not one.
    """
    try:
        args = json.loads(text or "{}")
    except json.JSONDecodeError as e:
        raise EnvhubError(
            f'env_args must be a JSON object, e.g. env_args=\'{{"difficulty": "tiny"}}\' ({e})'
        ) from None
    if not isinstance(args, dict):
        raise EnvhubError(f"env_args must be a JSON object, got {type(args).__name__}: {text}")
    return args


def _positive(builder: Any, attr: str) -> None:
    """chz's validator: ``attr`` of ``builder`` is at least 1."""
    value = getattr(builder, attr)
    if value < 1:
        raise ValueError(f"{attr} must be at least 1, got {value}")


@chz.chz
class EnvhubDatasetBuilder(types.RLDatasetBuilder):
    """Any envhub env as the dataset of a cookbook RL recipe.

    Name it on the recipe's command line::

        python -m tinker_cookbook.recipes.rl_basic \\
            dataset_builder=envhub.adapters.cookbook:EnvhubDatasetBuilder \\
            dataset_builder.env=arithmetic dataset_builder.env_args='{"difficulty": "tiny"}' \\
            dataset_builder.model_name_for_tokenizer=... dataset_builder.renderer_name=... \\
            dataset_builder.batch_size=2 dataset_builder.group_size=4 dataset_builder.n_batches=8
    """

    env: str = chz.field(doc="The envhub env: a built-in or installed name, a Hub reference, "
                         "an adapted name (verifiers:NAME), a served env's URL.")  # fmt: skip
    env_args: str = chz.field(default="{}", doc="The env's constructor arguments, a JSON object.")
    model_name_for_tokenizer: str = chz.field(doc="Whose tokenizer the renderer uses.")
    renderer_name: str = chz.field(doc="The cookbook renderer (renderers.get_renderer's name).")
    batch_size: int = chz.field(validator=_positive, doc="Groups (tasks) per step.")
    group_size: int = chz.field(validator=_positive, doc="Episodes per task.")
    n_batches: int = chz.field(validator=_positive, doc="Steps of the run.")
    seed: int = chz.field(default=0, doc="Orders the tasks and seeds every episode.")

    async def __call__(self) -> tuple[EnvhubDataset, None]:
        """The training dataset (no test set: evaluate with ``envhub eval``)."""
        args = parse_args(self.env_args)
        probe = make_env(self.env, args)
        try:
            tasks = task_count(probe)
        finally:
            close_quietly(probe)
        tokenizer = get_tokenizer(self.model_name_for_tokenizer)
        renderer = renderers.get_renderer(
            self.renderer_name, tokenizer, model_name=self.model_name_for_tokenizer
        )
        dataset = EnvhubDataset(
            self.env, args, renderer, self.batch_size, self.group_size, self.n_batches, tasks,
            self.seed,
        )  # fmt: skip
        return dataset, None
