"""envhub envs in the tinker cookbook's RL loops (``pip install tinker-cookbook``).

:class:`EnvhubDatasetBuilder` is an ``RLDatasetBuilder`` (a chz class) over any envhub env,
so a cookbook recipe trains on it by naming it on its command line
(``dataset_builder=envhub.adapters.cookbook:EnvhubDatasetBuilder``): each batch holds
``batch_size`` tasks of the env, each task ``group_size`` episodes (the cookbook centres their
rewards within the group); :class:`EnvhubEnv` plays one episode, rendering the env's messages
with the cookbook's renderer and parsing the sampled tokens back into the env's assistant
turns (``env.py`` says where the tokens stay exact and where they cannot).

The reverse, where both sides speak messages: :class:`MessageEnvAsEnv` is a cookbook
``MessageEnv`` (its tool-use ``AgentToolMessageEnv``, say) as an envhub env, its rewards the
cookbook env's. A token-level cookbook ``Env`` is not adapted: its observation is a prompt it
rendered with its own renderer, while envhub renders with the policy's chat template and keeps
the tokens the policy sampled.
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
from envhub.adapters.cookbook.message_env import MessageEnvAsEnv

__all__ = [
    "EnvhubDataset",
    "EnvhubDatasetBuilder",
    "EnvhubEnv",
    "EnvhubGroupBuilder",
    "MessageEnvAsEnv",
    "continue_tokens",
    "episode_metrics",
    "make_env",
    "task_count",
]
