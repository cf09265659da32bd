"""A tinker cookbook ``MessageEnv`` as an envhub env: the direction where both speak messages.

The cookbook's message-level envs (``MessageEnv``; its tool-use ``AgentToolMessageEnv``) take
an assistant message and answer with the conversation so far, a reward and whether the episode
ended; envhub's ``Env`` takes an assistant turn and answers with the new messages. So the
adapter only converts messages (envhub's calls parsed from the text when the turn carries
none, as the cookbook's renderer would have parsed them) and hands the rest on: the rewards
are the cookbook env's, and so is when it ends. Token-level cookbook envs (``Env``, whose
observation is a prompt it rendered) are not adapted: envhub renders with the policy's own
chat template and keeps its tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
from tinker_cookbook import renderers
from tinker_cookbook.rl.message_env import MessageEnv

from envhub.adapters.cookbook.messages import from_cookbook, openai_tools, to_cookbook
from envhub.env import Action, Env, StepResult, as_turn
from envhub.errors import EnvhubError
from envhub.tools.parsers import get_parser
from envhub.types import Message


class MessageEnvAsEnv(Env):
    """Episodes of cookbook ``MessageEnv``s, one made per episode, as one envhub env.

    Args:
        make: Makes the cookbook env of task ``i`` (a fresh one each episode: cookbook envs
            are single-use).
        num_tasks: How many tasks ``make`` knows (``reset(options={"task_index": i})``; a
            seeded draw otherwise).
        tools: The tools the cookbook env runs, as its ``ToolSpec`` dicts (what the model is
            shown; the cookbook env executes them itself).
        tool_parser: How calls are read from a turn's text when it carries none (envhub's
            parsers: ``auto``, ``hermes``, ...).
    """

    name = "cookbook-message-env"
    version = "0.1.0"

    def __init__(
        self,
        make: Callable[[int], MessageEnv],
        num_tasks: int,
        tools: Sequence[renderers.ToolSpec] = (),
        tool_parser: str = "auto",
    ) -> None:
        super().__init__()
        if num_tasks < 1:
            raise EnvhubError(f"{self.name}: num_tasks must be at least 1, got {num_tasks}")
        self.make, self.dataset = make, range(num_tasks)
        self._tools = openai_tools(tools) or None
        self._parse = get_parser(tool_parser)
        self.inner: MessageEnv | None = None
        self._seen, self._turn, self._total = 0, 0, 0.0

    @property
    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """The cookbook env's tools as OpenAI schemas."""
        return self._tools

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Make task ``options["task_index"]``'s cookbook env (else one drawn with ``seed``);
        its opening messages."""
        gym.Env.reset(self, seed=seed)
        options = options or {}
        index = int(options.get("task_index", self.np_random.integers(len(self.dataset))))
        if not 0 <= index < len(self.dataset):
            last = len(self.dataset) - 1
            raise EnvhubError(f"{self.name}: task_index {index} is outside 0..{last}")
        self.inner, self._turn, self._total = self.make(index), 0, 0.0
        history = await self.inner.initial_observation()
        self._seen = len(history)
        return [from_cookbook(m, "") for m in history], {"task_index": index}

    async def astep(self, action: Action) -> StepResult:
        """Hand the turn to the cookbook env; its new messages, reward and end."""
        if self.inner is None:
            raise EnvhubError(f"{self.name}: call reset() before step()")
        message = as_turn(action).message
        if not message.tool_calls:  # raw text: read the calls as a renderer would have
            parsed = self._parse(message.content or "", f"call_{self._turn}_")
            if parsed.calls:
                message = message.model_copy(update={"tool_calls": tuple(parsed.calls)})
        self._turn += 1
        result = await self.inner.step(to_cookbook(message))
        new = result.next_messages[self._seen + 1 :]  # after the turn just played
        self._seen = len(result.next_messages)
        self._total += float(result.reward)
        info: dict[str, Any] = {"turn": self._turn, "metrics": dict(result.metrics)}
        if result.episode_done:  # the episode's reward is the sum of the cookbook env's
            self.inner = None
            info["stop_reason"] = "terminated"
            info["reward_components"] = {"cookbook": self._total}
        replies = [from_cookbook(m, "") for m in new]
        return replies, float(result.reward), bool(result.episode_done), False, info
