"""A :class:`Sample`: one trajectory ready for the loss.

Below both :mod:`envhub.trainer.batch` (which builds samples and packs them, and re-exports
:class:`Sample`) and :mod:`envhub.trainer.role_balance` (which reweights them).
"""

from __future__ import annotations

from dataclasses import dataclass

from envhub.trainer.critic.targets import ValueTarget


@dataclass
class Sample:
    """One trajectory ready for the loss."""

    token_ids: list[int]
    loss_mask: list[int]
    sampler_logprobs: list[float]
    advantage: float
    """The sequence's advantage (with ``credit: turn``: its first turn's)."""
    trajectory: int
    """Index of the trajectory in the step's rollouts."""
    token_advantages: list[float] | None = None
    """Each token's advantage, aligned with ``token_ids`` (0.0 off the turns), when they differ
    within the sequence (``credit: turn``, ``advantage: gae``); ``None``: ``advantage`` on every
    token."""
    value_target: ValueTarget | None = None
    """With a critic: what it learns on this sequence (``advantage: gae``)."""
    supervised: float = 0.0
    """A demonstration's weight: its loss-mask tokens learn by cross-entropy times this
    (``sft``), not by the policy loss; 0: the policy sampled them (RL)."""

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def has_signal(self) -> bool:
        """Some token in the loss has a non-zero advantage (a demonstration always has)."""
        if self.supervised:
            return True
        if self.token_advantages is None:
            return self.advantage != 0.0
        pairs = zip(self.token_advantages, self.loss_mask, strict=True)
        return any(a != 0.0 and m for a, m in pairs)
