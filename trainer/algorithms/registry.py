"""The names of the trainer's algorithms: one registry per family, and what each one needs.

The registries are the one place an algorithm's name is defined. The run config validates
against them (``algorithm.advantage: rlo`` fails with "did you mean 'rloo'?"), the checks
between options read the properties declared here (an estimator that compares the samples of a
task needs ``samples_per_task >= 2``), and the trainer calls the function registered under the
name. Nothing else lists names.

    family                registry          built-in names
    advantage estimator   ADVANTAGES        grpo, dr_grpo, rloo, reinforce++,
                                            reinforce++_baseline, opo, gpg, remax, gae
    policy loss           POLICY_LOSSES     ppo_clip, gspo
    loss aggregation      AGGREGATIONS      token-mean, seq-mean-token-mean,
                                            seq-mean-token-sum-norm
    KL estimator          KL_ESTIMATORS     k1, k2, k3
    mismatch correction   MISMATCH_MODES    tis, mask-token, mask-sequence, none

This module imports no torch: a built-in entry names its function as ``module:attribute``,
imported the first time the trainer calls it (as ``weight_sync/transfers`` finds transfers by
name), so a config is checked in a process that never loads torch.

Adding an algorithm is writing its function and registering it, in any module imported before
the config is validated::

    from envhub.trainer.algorithms.registry import ADVANTAGES, Estimator

    def best_of_group(rewards, group_ids):  # (N,) tensors -> (N,) advantages
        ...

    ADVANTAGES.register(Estimator("best_of_group", best_of_group, needs_group=True))

after which ``algorithm.advantage: best_of_group`` validates and trains. The function's
signature is its family's: see :class:`Estimator` and the modules of the built-in ones
(``advantages``, ``policy_losses``, ``aggregation``, ``kl``, ``mismatch``).

A registration lives in the process that made it. Estimators run in the trainer's driver, so
one registered there serves every backend; the loss's parts (policy loss, aggregation, KL,
mismatch) run where the update runs, which for the Megatron backend is its Ray ranks: there
only the built-in names (and what the ranks' own imports register) are known.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any, Generic, TypeVar

from envhub.errors import ConfigError

ESTIMATOR_INPUTS = {
    "lengths": "each sample's count of tokens the policy sampled",
    "baselines": "the reward of a greedy episode of each sample's task, rolled out beside it",
}
"""What an outcome estimator may ask for beyond the rewards and group ids (``Estimator.inputs``),
passed as keyword arguments of the same names."""


@dataclass(frozen=True)
class Algorithm:
    """One registered algorithm: its name, its function and a line saying what it does.

    Args:
        name: What the config calls it.
        function: The function, or where it lives as ``"package.module:attribute"`` (imported
            on first use, so that registering needs no torch).
        summary: One line for error messages and listings.
    """

    name: str
    function: str | Callable[..., Any] = field(repr=False)
    summary: str = ""

    def load(self) -> Callable[..., Any]:
        """The function itself (its module imported the first time)."""
        if callable(self.function):
            return self.function
        return _import_target(self.function)


@dataclass(frozen=True, kw_only=True)
class Estimator(Algorithm):
    """An advantage estimator, with what it needs from the rest of the run.

    An *outcome* estimator (``needs_critic=False``) is ``function(rewards (N,), group_ids (N,),
    **inputs) -> (N,)``: one advantage per sequence from one reward per sample (see
    ``advantages``). A *critic* estimator is
    ``function(trajectories, rewards, values, algorithm, kl_penalty) -> GAEResult`` (see
    ``critic/targets.gae_targets``): per-token advantages and the critic's targets.

    Args:
        needs_group: It compares the samples of one task with each other, so the run needs
            ``rollout.samples_per_task >= 2``.
        turn_credit: It can give each turn its own advantage (``algorithm.credit: turn``): an
            outcome estimator is then applied per turn position (``returns``); a critic
            estimator handles turns itself.
        needs_critic: It learns a value model beside the policy (``critic:``), and
            ``algorithm.lam`` and ``gae_unit`` apply.
        inputs: Keys of :data:`ESTIMATOR_INPUTS` it takes as keyword arguments.
        without_dynamic_sampling: Why it cannot run with ``algorithm.dynamic_sampling`` (which
            drops the groups whose rewards are all equal), as the end of a sentence starting
            "algorithm.advantage=NAME "; ``None``: it can.
    """

    needs_group: bool = False
    turn_credit: bool = False
    needs_critic: bool = False
    inputs: frozenset[str] = frozenset()
    without_dynamic_sampling: str | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.inputs) - set(ESTIMATOR_INPUTS))
        if unknown:
            raise ConfigError(
                f"estimator {self.name!r} asks for unknown inputs {unknown}; "
                f"known: {', '.join(ESTIMATOR_INPUTS)}"
            )
        object.__setattr__(self, "inputs", frozenset(self.inputs))


A = TypeVar("A", bound=Algorithm)


class Registry(Mapping[str, A], Generic[A]):
    """The algorithms of one family by name, in the order they were registered.

    A read-only mapping (``name in registry``, ``registry[name]``, iteration over names);
    :meth:`register` and :meth:`unregister` change it.

    Args:
        family: What one entry is, for messages ("advantage estimator").
        entries: The built-in ones.
    """

    def __init__(self, family: str, entries: list[A]) -> None:
        self.family = family
        self._entries: dict[str, A] = {}
        for entry in entries:
            self.register(entry)

    def register(self, entry: A, *, replace: bool = False) -> A:
        """Add ``entry`` under its name and return it.

        Raises:
            ConfigError: The name is taken (pass ``replace=True`` to replace it), or empty.
        """
        if not isinstance(entry.name, str) or not entry.name.strip():
            raise ConfigError(f"a {self.family} needs a name, got {entry.name!r}")
        if entry.name in self._entries and not replace:
            raise ConfigError(
                f"{self.family} {entry.name!r} is already registered; "
                "pass replace=True to replace it"
            )
        self._entries[entry.name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove ``name`` (nothing happens when it is not registered)."""
        self._entries.pop(name, None)

    def entry(self, name: str) -> A:
        """The entry registered as ``name``.

        Raises:
            ConfigError: No such name; the message suggests the nearest one and lists all.
        """
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ConfigError(self.unknown(name)) from None

    def function(self, name: str) -> Callable[..., Any]:
        """The function registered as ``name`` (see :meth:`entry` for the error)."""
        return self.entry(name).load()

    def unknown(self, name: object, among: list[str] | None = None) -> str:
        """The message for an unknown ``name``: the nearest of ``among`` (default: every
        name) and the list of them."""
        names = list(self._entries) if among is None else among
        close = difflib.get_close_matches(str(name), names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown {self.family} {name!r}{hint}; valid: {', '.join(sorted(names))}"

    def __getitem__(self, name: str) -> A:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.family!r}, {list(self._entries)})"


def _import_target(target: str) -> Callable[..., Any]:
    module, _, attribute = target.partition(":")
    return getattr(import_module(module), attribute)


_ALGORITHMS = "envhub.trainer.algorithms"
_OUTCOME = f"{_ALGORITHMS}.advantages"
_FROM_THE_GROUP = (
    "not from the group, so a group whose rewards are all equal still carries signal (and "
    "with one sample per task every group would be dropped)"
)

ADVANTAGES: Registry[Estimator] = Registry(
    "advantage estimator",
    [
        Estimator(
            name="grpo", function=f"{_OUTCOME}:grpo", needs_group=True, turn_credit=True,
            summary="(r - group mean) / group std (DeepSeekMath)",
        ),
        Estimator(
            name="dr_grpo", function=f"{_OUTCOME}:dr_grpo", needs_group=True, turn_credit=True,
            summary="r - group mean (Dr.GRPO: no std scaling)",
        ),
        Estimator(
            name="rloo", function=f"{_OUTCOME}:rloo", needs_group=True, turn_credit=True,
            summary="r - mean of the group's other samples (leave one out)",
        ),
        Estimator(
            name="reinforce++", function=f"{_OUTCOME}:reinforce_pp", turn_credit=True,
            summary="rewards whitened over the whole batch (REINFORCE++)",
        ),
        Estimator(
            name="reinforce++_baseline", function=f"{_OUTCOME}:reinforce_pp_baseline",
            turn_credit=True,
            summary="r - group mean, then whitened over the batch (REINFORCE++-baseline)",
        ),
        Estimator(
            name="opo", function=f"{_OUTCOME}:opo", needs_group=True, inputs={"lengths"},
            summary="r - the group's length-weighted mean reward (OPO)",
        ),
        Estimator(
            name="gpg", function=f"{_OUTCOME}:gpg", needs_group=True,
            summary="r - group mean, scaled by samples / samples in groups that differ (GPG)",
            without_dynamic_sampling=(
                "scales the advantages for the groups whose rewards are all equal, which "
                "dynamic sampling drops"
            ),
        ),
        Estimator(
            name="remax", function=f"{_OUTCOME}:remax", inputs={"baselines"},
            summary="r - the reward of a greedy episode of the same task (ReMax)",
            without_dynamic_sampling=f"takes its baseline from a greedy episode, {_FROM_THE_GROUP}",
        ),
        Estimator(
            name="gae", function="envhub.trainer.critic.targets:gae_targets",
            needs_critic=True, turn_credit=True,
            summary="generalised advantage estimation from a learned critic's values (PPO)",
            without_dynamic_sampling=f"takes its baseline from the critic, {_FROM_THE_GROUP}",
        ),
    ],
)  # fmt: skip
"""Advantage estimators (``algorithm.advantage``)."""

POLICY_LOSSES: Registry[Algorithm] = Registry(
    "policy loss",
    [
        Algorithm(
            name="ppo_clip", function=f"{_ALGORITHMS}.policy_losses:ppo_clip",
            summary="PPO's clipped surrogate per token (decoupled clip range, dual clip)",
        ),
        Algorithm(
            name="gspo", function=f"{_ALGORITHMS}.policy_losses:gspo",
            summary="one clipped ratio per sequence, the geometric mean of its tokens' (GSPO)",
        ),
    ],
)  # fmt: skip
"""Per-token policy losses (``algorithm.policy_loss``)."""

AGGREGATIONS: Registry[Algorithm] = Registry(
    "loss aggregation",
    [
        Algorithm(
            name="token-mean", function=f"{_ALGORITHMS}.aggregation:token_mean",
            summary="every token of the batch weighs the same",
        ),
        Algorithm(
            name="seq-mean-token-mean", function=f"{_ALGORITHMS}.aggregation:seq_mean_token_mean",
            summary="each sequence's token mean, averaged over sequences",
        ),
        Algorithm(
            name="seq-mean-token-sum-norm",
            function=f"{_ALGORITHMS}.aggregation:seq_mean_token_sum_norm",
            summary="token sums over sequences x a constant length (Dr.GRPO)",
        ),
    ],
)  # fmt: skip
"""How token losses become the batch's loss (``algorithm.aggregation``)."""

KL_ESTIMATORS: Registry[Algorithm] = Registry(
    "KL estimator",
    [
        Algorithm(name="k1", function=f"{_ALGORITHMS}.kl:k1", summary="logp - ref"),
        Algorithm(
            name="k2", function=f"{_ALGORITHMS}.kl:k2",
            summary="(logp - ref)^2 / 2 (biased, low variance)",
        ),
        Algorithm(
            name="k3", function=f"{_ALGORITHMS}.kl:k3",
            summary="exp(ref - logp) - (ref - logp) - 1 (unbiased, never negative)",
        ),
    ],
)  # fmt: skip
"""Per-token KL estimates (``algorithm.kl_estimator``, ``kl_in_reward.estimator``)."""

MISMATCH_MODES: Registry[Algorithm] = Registry(
    "mismatch correction",
    [
        Algorithm(
            name="tis", function=f"{_ALGORITHMS}.mismatch:_tis",
            summary="weight each token by min(trainer/sampler ratio, cap)",
        ),
        Algorithm(
            name="mask-token", function=f"{_ALGORITHMS}.mismatch:_mask_token",
            summary="drop tokens whose ratio is outside [low, high]",
        ),
        Algorithm(
            name="mask-sequence", function=f"{_ALGORITHMS}.mismatch:_mask_sequence",
            summary="drop sequences whose geometric-mean ratio is outside [low, high]",
        ),
        Algorithm(name="none", function=f"{_ALGORITHMS}.mismatch:_none", summary="no correction"),
    ],
)  # fmt: skip
"""Corrections for the sampler's and the trainer's logprob gap (``algorithm.mismatch``)."""


def outcome_estimators() -> list[str]:
    """Names of the estimators that work from one reward per sample (no critic)."""
    return [name for name, e in ADVANTAGES.items() if not e.needs_critic]


def turn_estimators() -> list[str]:
    """Names of the outcome estimators that can be applied per turn position."""
    return [name for name, e in ADVANTAGES.items() if e.turn_credit and not e.needs_critic]
