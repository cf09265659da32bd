"""Typed wire objects shared by envs, the rollout runner, inference engines and the trainer.

Messages follow the OpenAI chat format, so anything that speaks that format (vLLM, SGLang, hosted
APIs) can be driven without translation. Everything here is a frozen pydantic model; the mutable
episode state that an env owns is :class:`~envhub.state.State`, one layer up.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from envhub.errors import EngineError, SandboxError

Role = Literal["system", "user", "assistant", "tool"]

Outcome = Literal["ok", "policy_failure", "env_failure", "infra_failure", "timeout"]
"""How an episode ended; see :attr:`Trajectory.outcome`."""
OUTCOMES: tuple[Outcome, ...] = ("ok", "policy_failure", "env_failure", "infra_failure", "timeout")
TRAINED_OUTCOMES: frozenset[Outcome] = frozenset({"ok", "policy_failure"})
"""The outcomes the trainer puts into the loss; every other one is kept out and counted."""


class FunctionCall(BaseModel):
    """The function part of an OpenAI tool call."""

    model_config = ConfigDict(frozen=True)

    name: str
    """Name of the tool the model asked for."""
    arguments: str
    """Arguments as the JSON text the model wrote (may be malformed: it is data, not trusted)."""


class ToolCall(BaseModel):
    """One tool call in OpenAI wire shape."""

    model_config = ConfigDict(frozen=True)

    id: str
    """Call id; the tool message that answers it carries the same ``tool_call_id``."""
    type: Literal["function"] = "function"
    function: FunctionCall

    @classmethod
    def make(cls, id: str, name: str, arguments: dict[str, Any] | str) -> ToolCall:
        """Build a call from a name and arguments given as a dict or as JSON text."""
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        return cls(id=id, function=FunctionCall(name=name, arguments=text))

    @property
    def name(self) -> str:
        """The name of the function called."""
        return self.function.name


class Message(BaseModel):
    """One chat message in OpenAI format."""

    model_config = ConfigDict(frozen=True)

    role: Role
    content: str | None = None
    """Text of the message. For assistant turns it is the raw text as sampled, tool-call markup
    included, so that re-rendering the conversation reproduces the sampled tokens."""
    tool_calls: tuple[ToolCall, ...] | None = None
    """Tool calls of an assistant turn, parsed from ``content`` or given by the server."""
    tool_call_id: str | None = None
    """For ``tool`` messages: the id of the call this message answers."""
    name: str | None = None
    """For ``tool`` messages: the tool's name."""
    actor: str | None = None
    """In an episode with several roles (:mod:`envhub.roles`): the actor whose turn produced
    the message (its own assistant turn, or an env message reporting its move); ``None``
    elsewhere. It is a label for records and reports: the model never sees it."""

    def to_openai(self) -> dict[str, Any]:
        """The message as a JSON-ready dict, without unset fields (nor the ``actor`` label,
        which is not part of the OpenAI format)."""
        return self.model_dump(mode="json", exclude_none=True, exclude={"actor"})


def system(content: str) -> Message:
    """A system message."""
    return Message(role="system", content=content)


def user(content: str) -> Message:
    """A user message."""
    return Message(role="user", content=content)


def assistant(content: str, tool_calls: list[ToolCall] | None = None) -> Message:
    """An assistant message, with its tool calls if any (an empty list counts as none)."""
    return Message(
        role="assistant", content=content, tool_calls=tuple(tool_calls) if tool_calls else None
    )


def tool_message(content: str, tool_call_id: str, name: str | None = None) -> Message:
    """A ``tool`` message answering the call ``tool_call_id`` (of the tool ``name``)."""
    return Message(role="tool", content=content, tool_call_id=tool_call_id, name=name)


def as_message(value: Message | dict[str, Any]) -> Message:
    """Accept a ``Message`` or an OpenAI-style dict."""
    return value if isinstance(value, Message) else Message.model_validate(value)


class AssistantTurn(BaseModel):
    """The action an env receives: one assistant turn plus what the engine knows about it.

    ``env.step`` also accepts a plain string or a ``Message``; the runner passes this richer form
    so that token budgets and truncated generations are accounted for.
    """

    model_config = ConfigDict(frozen=True)

    message: Message
    num_tokens: int | None = None
    """Tokens the policy sampled for this turn, when the engine reports them."""
    finish_reason: str | None = None
    """Why generation stopped: ``stop`` (end of turn) or ``length`` (hit max tokens)."""


# Libraries whose exceptions are network failures wherever they are raised (a judge's API call).
_NETWORK_MODULES = frozenset({"httpx", "httpcore", "aiohttp", "requests", "urllib3", "websockets"})
# What older records (written before ``ErrorRecord.infra``) are judged by: their type's name.
_INFRA_TYPE_NAMES = frozenset(
    {
        "EngineError",
        "EngineUnavailableError",
        "WeightSyncError",
        "SandboxError",
        "SandboxUnavailableError",
        "ConnectionError",
        "ConnectionRefusedError",
        "ConnectionResetError",
        "ConnectionAbortedError",
        "BrokenPipeError",
    }
)


def is_infrastructure_error(error: BaseException) -> bool:
    """Whether ``error`` is a failure of infrastructure rather than of the env's own code: an
    inference engine (:class:`~envhub.errors.EngineError`), a sandbox
    (:class:`~envhub.errors.SandboxError`), or the network (``ConnectionError``, or any
    exception of an HTTP client library: httpx, aiohttp, requests, ...)."""
    if isinstance(error, (EngineError, SandboxError, ConnectionError)):
        return True
    return any(cls.__module__.split(".")[0] in _NETWORK_MODULES for cls in type(error).__mro__)


class ErrorRecord(BaseModel):
    """An error attributed to one part of an episode. A bad rollout is data, not a crash."""

    model_config = ConfigDict(frozen=True)

    stage: str
    """Where it happened: ``env.reset``, ``env.step``, ``engine``, ``reward:<name>``,
    ``tool:<name>``, ``episode`` (timeout of the whole episode, or a failure no single part can be
    blamed for)."""
    type: str
    """Exception class name or a short kind such as ``timeout``."""
    message: str
    turn: int | None = None
    infra: bool = False
    """The failure lies in infrastructure the env does not own: the inference engine (every
    ``engine`` error), a sandbox or the network (:func:`is_infrastructure_error`, judged from
    the exception where it was caught). When absent from the data, it is inferred from the
    stage and the type's name."""

    @model_validator(mode="before")
    @classmethod
    def _infer_infra(cls, data: Any) -> Any:
        """Records without ``infra`` (older files, hand-made ones) take it from the stage and
        the type's name."""
        if isinstance(data, dict) and "infra" not in data:
            infra = data.get("stage") == "engine" or data.get("type") in _INFRA_TYPE_NAMES
            data = {**data, "infra": infra}
        return data


def episode_outcome(errors: Sequence[ErrorRecord], truncated: bool) -> Outcome:
    """The outcome of an episode with these ``errors`` (see :attr:`Trajectory.outcome`)."""
    if any(e.infra for e in errors):
        return "infra_failure"
    if any(e.type == "timeout" for e in errors):
        return "timeout"
    if errors:
        return "env_failure"
    return "policy_failure" if truncated else "ok"


def actor_role(actor: str) -> str:
    """The role an actor id plays: ``solver`` for ``solver#2`` (a seat), ``x`` for ``x``."""
    return actor.partition("#")[0]


class EnvRef(BaseModel):
    """Which environment produced a trajectory, exactly."""

    model_config = ConfigDict(frozen=True)

    name: str
    version: str | None = None
    commit: str | None = None


class SamplerRef(BaseModel):
    """What sampled a trajectory's assistant turns: engine, model, software version, sampling
    settings and chat template. With :class:`EnvRef` it says exactly what produced a run."""

    model_config = ConfigDict(frozen=True)

    engine: str
    """``openai`` (an OpenAI-compatible server), ``hf`` (transformers, in process), ``vllm``
    (the trainer's), ``scripted`` (a test policy), or another engine's class name."""
    mode: str | None = None
    """How the engine runs: ``tokens`` or ``chat`` (``openai``); ``server``, ``inprocess`` or
    ``ray`` (``vllm``)."""
    model: str | None = None
    """The model's name or path as the engine knows it."""
    version: str | None = None
    """The engine software's version: a server's ``GET /version`` (vLLM), the installed vLLM
    or transformers package; ``None`` when it cannot be known (hosted APIs)."""
    sampling: dict[str, Any] = Field(default_factory=dict)
    """The run's sampling settings (``SamplingParams``); a turn's ``max_tokens`` may be lower,
    cut to the episode's token budget or the context left."""
    chat_template_sha256: str | None = None
    """sha256 of the chat template's text, when the engine renders with a template it can read
    (a ``transformers`` tokenizer; a vLLM server started with
    ``--enable-tokenizer-info-endpoint``). ``None`` otherwise: an OpenAI-compatible server
    does not expose its template by default, and message-level engines use none of envhub's."""


def template_sha256(template: str | dict[str, str] | None) -> str | None:
    """sha256 (hex) of a chat template's text; a dict of named templates (older
    ``transformers``) is hashed as sorted JSON; ``None`` for no template."""
    if not template:
        return None
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class TurnRecord(BaseModel):
    """Per-turn bookkeeping of a rollout."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    tool_calls: int = 0
    tool_errors: int = 0
    generate_seconds: float = 0.0
    env_seconds: float = 0.0
    policy_version: int | None = None
    """The version of the weights that sampled this turn's first token (the number of weight
    updates the engine had received), when the engine reports it. A turn that straddles an update
    carries the older version: staleness is counted from a turn's oldest token."""
    structured_tool_calls: bool = False
    """The engine returned the turn's tool calls already parsed (an OpenAI server's
    ``tool_calls``) rather than as text only; a replay hands them to the env the same way."""
    reward: float = 0.0
    """The reward ``env.step`` returned for this turn. The episode's ``Trajectory.reward`` is
    the sum over its turns, plus what no step returned: the score of an episode the runner cut
    (``atruncate``) and group rewards. A :class:`~envhub.env.TaskEnv` returns 0.0 before the
    final step and the rubric's total on it. The turn's tokens are its ``completion_tokens``
    sampled tokens, in turn order, among the ``loss_mask`` 1s of the token record."""


class TokenSegment(BaseModel):
    """A token record of part of an episode, laid out like a trajectory's token fields.

    An episode whose conversation was rewritten midway (a harness that cut or re-wrote its
    history: :data:`envhub.harness.NEW_SEGMENT`) cannot be one token sequence: each stretch
    whose prompts extend one another token for token is a segment."""

    model_config = ConfigDict(frozen=True)

    token_ids: list[int]
    loss_mask: list[int]
    sampler_logprobs: list[float]
    prompt_token_count: int
    first_turn: int
    """Index of the segment's first turn in the trajectory's ``turns``."""


class Trajectory(BaseModel):
    """One episode, recorded for evaluation, training, inspection and replay.

    The token fields are the contract with the trainer: ``token_ids`` is the prompt and every turn
    exactly as sampled (never re-tokenised), ``loss_mask`` is 1 on tokens the policy sampled and 0
    elsewhere, ``sampler_logprobs`` holds the sampling engine's logprob of each token (0.0 where
    the mask is 0). They are ``None`` when the engine returned text only. An episode whose
    conversation was rewritten midway records its last segment there and the ones before it in
    ``segments``; the trainer trains each with the episode's advantage.
    """

    env: EnvRef
    sampler: SamplerRef | None = None
    """What sampled the turns (``None`` in files written before it was recorded)."""
    role: str | None = None
    """In an episode with several roles (:mod:`envhub.roles`): the actor this trajectory
    records (``x``, ``solver#2``); its ``messages`` are that actor's own view, its tokens
    and reward that actor's. ``None`` for a one-role episode."""
    task_index: int
    sample_index: int = 0
    group_id: str
    seed: int | None = None
    messages: list[Message]
    prompt_length: int
    """How many of ``messages`` form the prompt (the observation from ``reset``)."""
    tools: list[dict[str, Any]] | None = None
    token_ids: list[int] | None = None
    loss_mask: list[int] | None = None
    sampler_logprobs: list[float] | None = None
    prompt_token_count: int | None = None
    """Tokens before the first sampled token."""
    segments: list[TokenSegment] = Field(default_factory=list)
    """The token records of the segments before the last (see the class doc); empty for an
    episode that is one sequence, as every non-harness episode is."""
    reward: float = 0.0
    reward_components: dict[str, float] = Field(default_factory=dict)
    baseline_reward: float | None = None
    """The reward of a greedy episode of the same task, rolled out beside this one as its
    baseline (the trainer's ``advantage: remax``); ``None`` where there is none."""
    terminated: bool = False
    truncated: bool = False
    stop_reason: str = "terminated"
    """``terminated``; truncated by a budget: ``max_turns``, ``max_tokens``, ``max_context``, or
    an env's own reason (``State.truncate``, e.g. ``env_truncated``); failed: ``timeout``,
    ``error``."""
    turns: list[TurnRecord] = Field(default_factory=list)
    metrics: dict[str, float] = Field(default_factory=dict)
    errors: list[ErrorRecord] = Field(default_factory=list)
    token_drift: list[dict[str, Any]] = Field(default_factory=list)
    """Turns where re-rendering the conversation with the chat template did not reproduce the
    sampled tokens as a prefix (see ``envhub doctor``): ``turn`` is the index of the turn whose
    prompt was being built, ``position`` the first token that differs. The token fields stay
    exact regardless."""
    info: dict[str, Any] = Field(default_factory=dict)
    seconds: float = 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def outcome(self) -> Outcome:
        """How the episode ended, derived from ``errors`` and ``truncated`` (saved with the
        trajectory, recomputed on load), in this order of precedence:

        - ``infra_failure``: an error of infrastructure the env does not own: the engine, a
          sandbox, the network (:attr:`ErrorRecord.infra`);
        - ``timeout``: an env reset or step, or the whole episode, ran out of time;
        - ``env_failure``: the env's own code raised: making the env, ``reset``, ``step``, a
          reward or a tool;
        - ``policy_failure``: nothing failed, but the policy's budget ran out before the
          episode ended (``max_turns``, ``max_tokens``, ``max_context``, an env's own limit);
        - ``ok``: the episode ended on its own and was scored.

        Only ``ok`` and ``policy_failure`` episodes are trained on (:data:`TRAINED_OUTCOMES`):
        their rewards say how the policy did. The other three say nothing about the policy, so
        they never enter the loss as a reward of 0. A wrong answer is ``ok`` with a low reward;
        malformed tool calls are counted in ``metrics``, not here.
        """
        return episode_outcome(self.errors, self.truncated)

    @property
    def ok(self) -> bool:
        """True when nothing went wrong outside the policy's control (the outcome is ``ok`` or
        ``policy_failure``)."""
        return not self.errors

    @property
    def completion(self) -> list[Message]:
        """Messages after the prompt."""
        return self.messages[self.prompt_length :]

    @property
    def role_name(self) -> str | None:
        """The role this trajectory's actor plays (``solver`` for ``solver#2``), or ``None``."""
        return None if self.role is None else actor_role(self.role)

    @property
    def group_key(self) -> str:
        """The training group this trajectory's advantage is taken within: its ``group_id``
        for a one-role episode; per role, the group's samples of the same role (``g0/x``); for
        an actor with a seat (``solver#2``: one of several attempts at what its episode posed),
        its episode's attempts (``g0/s3/solver``), since the task they share is the episode's."""
        if self.role is None:
            return self.group_id
        role = actor_role(self.role)
        if role == self.role:
            return f"{self.group_id}/{role}"
        return f"{self.group_id}/s{self.sample_index}/{role}"

    @property
    def policy_version(self) -> int | None:
        """The oldest policy version that sampled any of this episode's turns (None when the
        engine reports none)."""
        versions = [t.policy_version for t in self.turns if t.policy_version is not None]
        return min(versions) if versions else None

    @property
    def num_completion_tokens(self) -> int:
        """Tokens the policy sampled over all turns (turns that report no count add 0)."""
        return sum(t.completion_tokens or 0 for t in self.turns)
