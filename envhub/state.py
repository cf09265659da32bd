"""The episode state of a :class:`~envhub.env.TaskEnv`: the task, the conversation, counts,
metrics, errors and reward components, read by the env's hooks and by its rewards.

It sits below the rewards and the env in the SDK's import order (types -> state -> rewards ->
rows -> env -> rollout), so that a reward function can name its ``state`` argument's type
without importing the env.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from envhub.types import ErrorRecord, Message


@dataclass
class State:
    """Everything about the current episode of a :class:`~envhub.env.TaskEnv`."""

    task: dict[str, Any]
    """The dataset row this episode was drawn from."""
    task_index: int
    prompt: list[Message]
    messages: list[Message]
    """The whole conversation: prompt, assistant turns and env replies."""
    turn: int = 0
    tokens: int = 0
    """Tokens sampled by the policy so far (when the engine reports them)."""
    done: bool = False
    """Set by an env's reply hook to end the episode (``terminated``)."""
    stop_reason: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    """Scratch space for the env (game state, a sandbox handle, ...)."""
    metrics: Counter[str] = field(default_factory=Counter)
    errors: list[ErrorRecord] = field(default_factory=list)
    reward_components: dict[str, float] = field(default_factory=dict)
    step_reward: float = 0.0
    """What the reply hook paid for the turn being answered (see :meth:`pay`)."""
    paid: dict[str, float] = field(default_factory=dict)
    """Everything :meth:`pay` paid this episode, per component."""

    def pay(self, amount: float, component: str = "progress") -> None:
        """Pay ``amount`` for the turn being answered, from a reply hook: a dense reward that
        the step returns at once (per-turn credit sees it on this turn). The episode's reward
        is the sum of its steps' rewards, so the rubric's total on the final step comes on top;
        ``reward_components[component]`` reports the sum paid."""
        self.step_reward += amount
        self.paid[component] = self.paid.get(component, 0.0) + amount

    def pay_once(self, amount: float, component: str) -> bool:
        """:meth:`pay` ``amount`` unless ``component`` was already paid in this episode: a
        one-time bonus (the first well-formed tool call, say). Returns whether it paid now."""
        if self.paid.get(component):
            return False
        self.pay(amount, component)
        return True

    def truncate(self, reason: str) -> None:
        """End the episode as truncated (not solved, not failed: cut short) from a reply hook,
        e.g. when a wrapped simulator hits its own time limit. ``reason`` becomes the
        trajectory's ``stop_reason``."""
        self.stop_reason = reason

    @property
    def completion(self) -> list[Message]:
        """The messages after the prompt: assistant turns and env replies."""
        return self.messages[len(self.prompt) :]

    @property
    def response(self) -> str:
        """Text of the last assistant message ("" if there is none)."""
        for message in reversed(self.messages):
            if message.role == "assistant":
                return message.content or ""
        return ""

    @property
    def answer(self) -> Any:
        """The task's reference answer (its ``"answer"`` field), or ``None``."""
        return self.task.get("answer")

    @property
    def info(self) -> dict[str, Any]:
        """The task's ``"info"`` field (extra data for the env and rewards), or ``{}``."""
        return self.task.get("info") or {}
