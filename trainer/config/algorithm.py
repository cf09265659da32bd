"""The RL objective (``algorithm:``): estimator, loss and aggregation names read from the
algorithm registry, the overlong and KL-in-reward subsections, and what each estimator needs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, NonNegativeFloat, model_validator

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
