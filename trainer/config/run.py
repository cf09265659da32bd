"""The whole run (:class:`TrainConfig`): its sections, the checks that span several of them
(``_check_consistency`` and the ``_check_*`` methods it calls), and what is derived from them
(run name and folder, step counts)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from envhub.errors import ConfigError
from envhub.trainer.config.algorithm import AlgorithmConfig
from envhub.trainer.config.backend import BackendConfig, ClusterConfig, OptimizerConfig
from envhub.trainer.config.envs import CurriculumConfig, EnvSpec
from envhub.trainer.config.model import CriticConfig, ModelConfig
from envhub.trainer.config.outputs import CheckpointConfig, EvalConfig, LoggingConfig
from envhub.trainer.config.rollout import RolloutConfig
from envhub.trainer.config_base import ConfigPart as _Part
from envhub.trainer.distill.config import DistillConfig
from envhub.trainer.sft.config import SFTConfig


class TrainConfig(_Part):
    """A whole training run."""

    steps: int = Field(20, ge=0)
    """RL steps (after ``sft``'s supervised ones, if any; 0 only with ``sft``: a supervised
    run alone)."""
    seed: int = 0
    model: ModelConfig = Field(default_factory=ModelConfig)
    envs: list[EnvSpec] = Field(min_length=1)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    """The value model of ``algorithm.advantage: gae``."""
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    backend: BackendConfig = Field(default_factory=BackendConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    eval: EvalConfig | None = None
    """Held-out evaluation during training; none when absent."""
    curriculum: CurriculumConfig | None = None
    """Online curriculum (which tasks and levels each step draws); none when absent."""
    sft: SFTConfig | None = None
    """Supervised steps on demonstrations before RL (a warm start), and a supervised term
    during it; none when absent."""
    distill: DistillConfig | None = None
    """On-policy distillation from a teacher (alone or with the env's reward); none when
    absent."""

    @model_validator(mode="after")
    def _check_consistency(self) -> TrainConfig:
        if self.steps == 0 and self.sft is None:
            raise ValueError(
                "steps must be at least 1 (0 only with sft:, for supervised steps alone)"
            )
        if self.algorithm.mismatch_low >= self.algorithm.mismatch_high:
            raise ValueError("algorithm.mismatch_low must be below algorithm.mismatch_high")
        buffer = self.algorithm.overlong.soft_penalty_buffer
        if buffer is not None and buffer >= self.rollout.max_tokens:
            raise ValueError(
                "algorithm.overlong.soft_penalty_buffer must be smaller than rollout.max_tokens"
            )
        if self.distill is not None:
            self._check_distill()
        alone = self.distill is not None and self.distill.reward_weight == 0
        if self.algorithm.estimator.needs_group and self.rollout.samples_per_task < 2 and not alone:
            raise ValueError(
                f"{self.algorithm.advantage} compares samples of a task: "
                "set rollout.samples_per_task >= 2"
            )
        if self.backend.kind == "megatron":
            self._check_megatron()
        self._check_vllm_placement()
        if self.rollout.workers:
            self._check_rollout_workers()
        self._check_sampling()
        return self

    def _check_distill(self) -> None:
        if self.algorithm.dynamic_sampling:
            raise ValueError(
                "distill: the teacher's signal is in every group, tied or not, and dynamic "
                "sampling drops the tied ones: set algorithm.dynamic_sampling=false"
            )
        if self.steps == 0:
            raise ValueError("distill teaches the RL steps: set steps >= 1")

    def _check_sampling(self) -> None:
        r = self.rollout
        if r.top_p < 1.0 or r.top_k is not None:
            raise ValueError(
                "rollout.top_p < 1 and rollout.top_k truncate the sampler's distribution, so its "
                "logprobs are not the policy's that the trainer scores and every importance "
                "ratio is biased: train with rollout.top_p=1 and no top_k (the temperature "
                "applies to both sides); envhub eval takes both"
            )
        if r.max_staleness and r.engine != "vllm":
            raise ValueError(
                "rollout.max_staleness >= 1 samples while the trainer updates, which needs "
                "rollout.engine=vllm: the hf engine generates with the very module the update "
                "changes, so it stays synchronous (rollout.max_staleness=0)"
            )
        if r.max_staleness and r.vllm.sleep == "on":
            raise ValueError(
                "rollout.vllm.sleep=on puts vLLM to sleep during each update, which "
                "rollout.max_staleness >= 1 spends sampling: set rollout.vllm.sleep=auto or off"
            )

    def adapter_sync_problem(self) -> str | None:
        """Why this run cannot sync its LoRA adapter alone (``rollout.vllm.lora_sync``), as a
        message saying what to set; ``None`` when it can."""
        if self.model.lora is None:
            return (
                "rollout.vllm.lora_sync=adapter sends the LoRA adapter: set model.lora "
                "(or rollout.vllm.lora_sync=auto)"
            )
        if self.rollout.engine != "vllm" or self.rollout.vllm.mode != "server":
            return (
                "rollout.vllm.lora_sync=adapter is built for rollout.engine=vllm with "
                "rollout.vllm.mode=server (the engine loads the adapter from a folder on the "
                "trainer's host): use that mode, or rollout.vllm.lora_sync=merged"
            )
        if self.rollout.workers:
            return (
                "rollout.vllm.lora_sync=adapter is not built for rollout.workers (the workers' "
                "requests would name the base model): set rollout.workers=0 or "
                "rollout.vllm.lora_sync=merged"
            )
        if self.rollout.max_staleness:
            return (
                "rollout.vllm.lora_sync=adapter is not built for rollout.max_staleness >= 1: "
                "vLLM 0.32's CPU LoRA layers fail on a sync's verification batched with running "
                "requests (a prompt-logprobs request beside decodes), and the GPU path is "
                "untested; set rollout.max_staleness=0 or rollout.vllm.lora_sync=merged"
            )
        return None

    def _check_rollout_workers(self) -> None:
        if self.rollout.engine != "vllm":
            raise ValueError(
                "rollout.workers runs episodes in Ray actors that reach vLLM over HTTP: "
                "set rollout.engine=vllm "
                "(the hf engine lives in the trainer's process and cannot be shared), "
                "or rollout.workers=0"
            )
        if self.rollout.vllm.mode == "inprocess":
            raise ValueError(
                "rollout.workers needs a vLLM server the actors can reach: "
                "set rollout.vllm.mode=server (or ray); "
                "an inprocess engine lives in the trainer's process"
            )

    def _check_vllm_placement(self) -> None:
        v = self.rollout.vllm
        if v.lora_sync == "adapter" and (problem := self.adapter_sync_problem()):
            raise ValueError(problem)
        if v.url is not None and v.mode != "server":
            raise ValueError(
                "rollout.vllm.url names a running server: it needs rollout.vllm.mode=server"
            )
        if v.colocate and (v.mode != "ray" or self.backend.kind != "megatron"):
            raise ValueError(
                "rollout.vllm.colocate places the engine with the Megatron ranks on Ray: "
                "set rollout.vllm.mode=ray and backend.kind=megatron"
            )
        if v.engines > 1 and (v.mode != "ray" or v.colocate):
            raise ValueError(
                "several vLLM engines are placed by Ray, each in a bundle of its own: "
                "set rollout.vllm.mode=ray without colocate, or rollout.vllm.engines=1"
            )
        if v.colocate and v.tensor_parallel > 1:
            raise ValueError(
                "a colocated engine shares one rank's GPU: "
                "rollout.vllm.tensor_parallel must be 1 (or drop colocate)"
            )

    def _check_megatron(self) -> None:
        if self.rollout.engine != "vllm":
            raise ValueError("backend.kind=megatron generates with vLLM: set rollout.engine=vllm")
        if self.model.lora is not None:
            raise ValueError(
                "the Megatron backend trains all weights: "
                "remove model.lora (or use backend.kind=torch)"
            )

    @property
    def sft_steps(self) -> int:
        """The supervised steps before RL (``sft.steps``; 0 without ``sft``).

        Raises:
            ConfigError: ``sft.epochs`` was given and the demonstrations are not loaded yet
                (the loop counts the steps from them first: :func:`with_sft_steps`).
        """
        if self.sft is None:
            return 0
        if self.sft.steps is None:
            raise ConfigError(
                "sft.epochs: the supervised steps are counted once the demonstrations are loaded"
            )
        return self.sft.steps

    @property
    def sft_lr_scale(self) -> float:
        """The supervised updates' learning rate over ``optimizer.lr`` (``sft.lr``; 1 when
        unset or without ``sft``)."""
        if self.sft is None or self.sft.lr is None:
            return 1.0
        return self.sft.lr / self.optimizer.lr

    @property
    def total_steps(self) -> int:
        """Every step of the run: the supervised ones, then ``steps`` of RL."""
        return self.sft_steps + self.steps

    @property
    def run_name(self) -> str:
        """``logging.run_name``, or ``<first env>-<model>`` (``/`` in the env name as ``-``, an
        env reference by its env's name, the model's last path part lower-cased)."""
        from envhub.references import display_name

        if self.logging.run_name:
            return self.logging.run_name
        model = Path(self.model.name).name.lower()
        return f"{display_name(self.envs[0].name).replace('/', '-')}-{model}"

    @property
    def run_dir(self) -> Path:
        """Where this run writes its outputs: ``logging.output_dir / run_name``."""
        return self.logging.output_dir / self.run_name
