"""The ``sft:`` section: supervised steps on demonstrations before RL, and beside it.

Imports no ML library (the run config is checked in processes that never load torch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from envhub.trainer.config_base import ConfigPart, EnvName


class DemoSource(ConfigPart):
    """Where demonstrations come from: exactly one of ``env``, ``path`` and ``dataset``.

    Each gives conversations (OpenAI ``messages``, with ``tools``) that are rendered with the
    policy's chat template and checked with the rollouts' prefix rule; only the assistant
    turns' tokens are trained on.
    """

    env: EnvName | None = None
    """An env (name or reference, as in ``envs:``) whose ``reference_policy`` plays
    ``num_tasks`` of its tasks; only the episodes that reach ``min_reward`` are kept."""
    args: dict[str, Any] = Field(default_factory=dict)
    """``env``: keyword arguments for ``envhub.make`` (another ``task_seed`` than training,
    or the same: the reference shows how to solve the tasks the policy will meet)."""
    num_tasks: int = Field(64, ge=1)
    """``env``: tasks played, spread over its dataset (one episode each)."""
    path: Path | None = None
    """A JSONL file, or a folder of them: recorded episodes (``envhub eval``'s
    ``trajectories.jsonl``, a run's ``trajectories/step-*.jsonl``) or records holding OpenAI
    ``messages`` (and ``tools``, and optionally ``reward``)."""
    dataset: str | None = None
    """A ``datasets`` dataset (a local folder saved with ``save_to_disk``, or a name
    ``load_dataset`` finds) whose rows hold ``messages`` (and ``tools``, ``reward``)."""
    split: str = "train"
    """``dataset``: the split to read."""
    min_reward: float | None = None
    """Keep only conversations whose reward reaches this. Default: for ``env``, the top of its
    ``reward_range`` (else its ``pass_threshold``); for recorded episodes and datasets, every
    record (records without a reward always pass). Episodes that did not end on their own (a
    failure, a timeout, a budget run out) are never kept."""
    limit: int | None = Field(None, ge=1)
    """Keep at most this many conversations (the first ones)."""

    @model_validator(mode="after")
    def _one_source(self) -> DemoSource:
        given = [name for name in ("env", "path", "dataset") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                "sft.sources: each source names exactly one of env (an env's reference "
                "policy), path (a JSONL file or folder) or dataset (a datasets dataset); "
                f"got {', '.join(given) if given else 'none'}"
            )
        if self.env is None and self.args:
            raise ValueError("sft.sources: args are env arguments: they need env")
        return self

    def describe(self) -> str:
        """What the source is, in a few words (for the run header)."""
        if self.env is not None:
            return f"{self.env}'s reference policy (up to {self.num_tasks} tasks)"
        if self.path is not None:
            return str(self.path)
        return f"dataset {self.dataset} ({self.split})"


class SFTConfig(ConfigPart):
    """Supervised fine-tuning on demonstrations (``sft:``; off when absent).

    A warm start: the run's first ``steps`` (or ``epochs`` over the demonstrations) are
    supervised updates, each on ``batch_size`` demonstrations: cross-entropy on the assistant
    turns' tokens only, token-mean over the batch. RL's ``steps`` follow in the same run folder
    (one ``metrics.jsonl``, one report, checkpoints and held-out evaluation as for RL, resumable
    in either stage); step numbers run on across both. ``aux_weight`` keeps a supervised term
    during RL. ``envhub train cfg.yaml sft.steps=20``.
    """

    sources: list[DemoSource] = Field(min_length=1)
    steps: int | None = Field(None, ge=0)
    """Supervised updates before RL (0: none, for ``aux_weight`` alone; with both 0 the run
    is plain RL, exactly)."""
    epochs: float | None = Field(None, gt=0)
    """Instead of ``steps``: passes over the demonstrations (the steps are counted once they
    are loaded: ``ceil(epochs x demonstrations / batch_size)``)."""
    batch_size: int = Field(8, ge=1)
    """Demonstrations per supervised update."""
    lr: float | None = Field(None, gt=0.0)
    """The learning rate of the supervised updates (constant); default ``optimizer.lr``. RL's
    schedule (``optimizer.warmup_steps``, ``schedule``) starts after them; the optimizer's
    state carries over."""
    aux_weight: float = Field(0.0, ge=0.0)
    """During RL: a supervised term in every update, each demonstration token weighing this
    much against one policy token (token-mean over both). 0: plain RL, exactly."""
    aux_batch_size: int | None = Field(None, ge=1)
    """Demonstrations added to each RL update with ``aux_weight``; default ``batch_size``."""

    @model_validator(mode="after")
    def _length(self) -> SFTConfig:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError(
                "sft: give either steps (supervised updates before RL; 0 for aux_weight "
                "alone) or epochs (passes over the demonstrations), not both or neither"
            )
        return self
