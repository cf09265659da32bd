"""envhub envs in the tinker cookbook's RL loops (``pip install tinker-cookbook``).

:class:`EnvhubDatasetBuilder` is an ``RLDatasetBuilder`` (a chz class) over any envhub env,
so a cookbook recipe trains on it by naming it on its command line
(``dataset_builder=envhub.adapters.cookbook:EnvhubDatasetBuilder``): each batch holds
``batch_size`` tasks of the env, each task ``group_size`` episodes (the cookbook centres their
rewards within the group); :class:`EnvhubEnv` plays one episode, rendering the env's messages
with the cookbook's renderer and parsing the sampled tokens back into the env's assistant
turns (``env.py`` says where the tokens stay exact and where they cannot).

The reverse, a cookbook env as an envhub env, is not offered: a cookbook ``Env`` speaks
tokens (its observation is a rendered prompt, its action sampled token ids) and owns its
renderer, while an envhub env speaks messages and leaves rendering to the policy's own chat
template; turning one into the other would need the policy's renderer inside the env, and the
token-exact records envhub's runner keeps would be the cookbook env's re-rendering of them.
"""

from __future__ import annotations

try:
    import tinker_cookbook  # noqa: F401
except ModuleNotFoundError as e:  # pragma: no cover - the message is the point
    raise ModuleNotFoundError(
        "envhub.adapters.cookbook needs the tinker cookbook: pip install tinker-cookbook",
        name=e.name,
    ) from e

from envhub.adapters.cookbook.dataset import (
    EnvhubDataset,
    EnvhubDatasetBuilder,
    EnvhubGroupBuilder,
    make_env,
    task_count,
)
from envhub.adapters.cookbook.env import EnvhubEnv, continue_tokens, episode_metrics

__all__ = [
    "EnvhubDataset",
    "EnvhubDatasetBuilder",
    "EnvhubEnv",
    "EnvhubGroupBuilder",
    "continue_tokens",
    "episode_metrics",
    "make_env",
    "task_count",
]
