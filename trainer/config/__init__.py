"""The training configuration: one pydantic model per part, loaded from YAML with overrides.

A run is described by a :class:`TrainConfig`. ``load_config("run.yaml", ["optimizer.lr=1e-6"])``
reads the file, applies ``key=value`` overrides (values parsed as YAML, so ``true``, ``1e-6``,
``[a, b]`` and ``{k: v}`` work) and validates everything before any work starts. Unknown keys
are errors, with the nearest valid name suggested. This package imports no ML library.

Its modules, one per section or close group (every name is imported from here):
``model`` (policy, LoRA, critic), ``envs`` (envs, curriculum), ``rollout`` (with vLLM),
``algorithm``, ``backend`` (optimizer, backend, Megatron, cluster), ``outputs`` (logging,
checkpoints, held-out evaluation), ``run`` (:class:`TrainConfig` and its cross-section
checks), ``overrides`` and ``loading`` (the file, validation, readable errors).
"""

from __future__ import annotations

from envhub.trainer.config.algorithm import (
    AdvantageName,
    AggregationName,
    AlgorithmConfig,
    KLEstimatorName,
    KLInRewardConfig,
    MismatchName,
    OverlongConfig,
    PolicyLossName,
)
from envhub.trainer.config.backend import (
    BackendConfig,
    ClusterConfig,
    MegatronConfig,
    OptimizerConfig,
)
from envhub.trainer.config.envs import CurriculumConfig, EnvSpec, LevelsConfig
from envhub.trainer.config.loading import (
    load_config,
    read_config_file,
    unknown_keys,
    validate_config,
)
from envhub.trainer.config.model import CriticConfig, LoraConfig, ModelConfig
from envhub.trainer.config.outputs import (
    CheckpointConfig,
    EvalConfig,
    EvalEnvSpec,
    LoggingConfig,
)
from envhub.trainer.config.overrides import apply_overrides, follow_overridden_envs
from envhub.trainer.config.rollout import RolloutConfig, VLLMConfig
from envhub.trainer.config.run import TrainConfig

# The reference page lists them in this order (mkdocs: `members_order: [__all__, source]`).
__all__ = [
    "AdvantageName",
    "PolicyLossName",
    "AggregationName",
    "KLEstimatorName",
    "MismatchName",
    "LoraConfig",
    "ModelConfig",
    "EnvSpec",
    "EvalEnvSpec",
    "EvalConfig",
    "VLLMConfig",
    "RolloutConfig",
    "OverlongConfig",
    "KLInRewardConfig",
    "AlgorithmConfig",
    "OptimizerConfig",
    "CriticConfig",
    "MegatronConfig",
    "ClusterConfig",
    "BackendConfig",
    "LoggingConfig",
    "CheckpointConfig",
    "LevelsConfig",
    "CurriculumConfig",
    "TrainConfig",
    "load_config",
    "follow_overridden_envs",
    "read_config_file",
    "apply_overrides",
    "validate_config",
    "unknown_keys",
]
