"""The ``distill:`` section: on-policy distillation from a teacher. Imports no ML library."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from envhub.trainer.config_base import ConfigPart


class TeacherConfig(ConfigPart):
    """Who scores the student's tokens (``distill.teacher``).

    ``server``: an OpenAI-compatible server that returns prompt logprobs for given token ids
    (vLLM's ``prompt_logprobs``; ``envhub serve-model CHECKPOINT`` serves one). ``local``: a
    checkpoint loaded beside the trainer (in its process beside the torch backend, in a Ray actor
    of its own beside the Megatron backend's ranks). ``self``: the policy itself, shown
    another context (``env_args``): a model distils what it does when shown, say, a worked
    example into what it does without one. The teacher must use the policy's tokenizer: it
    is checked when the run starts.
    """

    kind: Literal["server", "local", "self"]
    url: str | None = None
    """``server``: the server's base URL (``http://127.0.0.1:8000`` or ``.../v1``)."""
    model: str | None = None
    """``server``: the served model's name (default: the server's first); ``local``: an HF
    folder (a run's ``final/``), id or alias."""
    api_key: str | None = None
    """``server``: a bearer token, if the server wants one."""
    env_args: dict[str, Any] = Field(default_factory=dict)
    """The teacher's context: env arguments over the training env's (``{demonstration:
    true}``). The teacher sees that env's prompt for the same task in place of the student's,
    then the rest of the student's episode token for token (a harness env's segments and the
    seats of a multi-role episode are scored as they are). Empty: the student's own tokens."""
    gpus: float = Field(1.0, gt=0.0)
    """``local`` beside the Megatron backend on GPUs: the GPUs its Ray actor takes (a share
    below 1 lets it sit on a GPU beside something else; on CPUs it takes none)."""
    max_concurrency: int = Field(16, ge=1)
    """``server``: requests in flight at once."""
    timeout: float = Field(300.0, gt=0.0)
    """``server``: seconds one scoring request may take."""

    @model_validator(mode="after")
    def _fields_of_the_kind(self) -> TeacherConfig:
        if self.kind == "server" and not self.url:
            raise ValueError("distill.teacher.kind=server needs url (the teacher server's)")
        if self.kind == "local" and not self.model:
            raise ValueError("distill.teacher.kind=local needs model (a checkpoint folder)")
        if self.kind != "server" and (self.url or self.api_key):
            raise ValueError(f"distill.teacher: url and api_key are a server's, not {self.kind}")
        if self.kind != "local" and "gpus" in self.model_fields_set:
            raise ValueError(f"distill.teacher: gpus is a local teacher's, not {self.kind}")
        if self.kind == "self" and self.model:
            raise ValueError("distill.teacher.kind=self is the policy: drop model")
        if self.kind == "self" and not self.env_args:
            raise ValueError(
                "distill.teacher.kind=self with no env_args is the student itself (every "
                "advantage ~0): give the teacher another context, e.g. env_args: "
                "{demonstration: true}"
            )
        return self

    def describe(self) -> str:
        """The teacher in a few words (for the run header)."""
        who = {
            "server": f"{self.model or 'the model'} at {self.url}",
            "local": f"{self.model} (beside the trainer)",
            "self": "the policy itself",
        }[self.kind]
        return who + self.shown()

    def shown(self) -> str:
        """What the teacher is shown besides the student's tokens (``""``: nothing)."""
        if not self.env_args:
            return ""
        args = ", ".join(f"{k}={v!r}" for k, v in self.env_args.items())
        return f", shown the env's prompt with {args}"


class DistillConfig(ConfigPart):
    """On-policy distillation (``distill:``; off when absent).

    The student samples as in RL; the teacher scores the student's own tokens; each sampled
    token's advantage gets ``weight x (teacher logprob - student logprob)``: the negative
    reverse KL's per-token estimate, the student's logprob being the sampler's. Added to the
    env's advantage times ``reward_weight`` (0: distillation alone, no reward needed).
    The teacher scores at temperature 1: sample at ``rollout.temperature: 1`` for the KL to
    the teacher's own distribution. Every group teaches, tied or not, so it needs
    ``algorithm.dynamic_sampling: false``.
    """

    teacher: TeacherConfig
    weight: float = Field(1.0, ge=0.0)
    """The coefficient of the per-token reverse KL in the advantage (at the first RL step)."""
    final_weight: float | None = Field(None, ge=0.0)
    """Anneal the coefficient to this by the last RL step (``schedule``); default: kept."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """How the coefficient goes from ``weight`` to ``final_weight`` over the RL steps."""
    reward_weight: float = Field(1.0, ge=0.0)
    """The env's advantages are multiplied by this (0: the teacher alone)."""

    @model_validator(mode="after")
    def _schedule(self) -> DistillConfig:
        if (self.schedule == "constant") != (self.final_weight is None):
            raise ValueError(
                "distill: final_weight is where a linear or cosine schedule ends: give both "
                "(schedule: linear, final_weight: 0.0) or neither"
            )
        if not self.weight and not (self.final_weight or 0.0):
            raise ValueError("distill: weight 0 throughout teaches nothing: remove distill")
        return self

    def weight_at(self, rl_step: int, rl_steps: int) -> float:
        """The coefficient at RL step ``rl_step`` (0-based) of ``rl_steps``: ``weight`` at the
        first, ``final_weight`` at the last, the schedule between."""
        import math

        if self.final_weight is None:
            return self.weight
        progress = min(1.0, rl_step / max(1, rl_steps - 1))
        left = (
            1.0 - progress if self.schedule == "linear" else (1 + math.cos(math.pi * progress)) / 2
        )
        return self.final_weight + (self.weight - self.final_weight) * left
