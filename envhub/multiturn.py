"""Multi-turn envs: a conversation that goes on until the env says done or a budget runs out.

- :class:`MultiTurnEnv` — implement ``env_response(state, turn)``: return the env's reply
  (a user message, game feedback, ...) and set ``state.done = True`` to end the episode.
- :class:`ToolEnv` — the model calls tools; each call's result (or what was wrong with the call)
  goes back as a ``tool`` message; the episode ends when the model answers without a tool call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from envhub.env import TaskEnv
from envhub.state import State
from envhub.tools.executor import ToolExecutor
from envhub.tools.parsers import ParsedTurn, check_openai_calls, get_parser
from envhub.tools.prompt import TOOL_FORMAT_HINT
from envhub.tools.tool import Tool, make_tool
from envhub.types import AssistantTurn, Message

__all__ = ["TOOL_FORMAT_HINT", "MultiTurnEnv", "ToolEnv"]


class MultiTurnEnv(TaskEnv):
    """An env with several assistant turns per episode (default budget: 10 turns)."""

    default_max_turns = 10


class ToolEnv(MultiTurnEnv):
    """A multi-turn env whose replies are the results of the model's tool calls.

    Args:
        tools: Tools (``@tool`` functions or plain typed functions); defaults to the class's
            ``tools``.
        tool_parser: How to read calls from raw text: ``auto``, ``hermes``, ``llama3``, ``mistral``.
        tool_timeout: Seconds a call may take when the tool sets no timeout of its own.
        **kwargs: Passed to :class:`TaskEnv` (dataset, rubric, system_prompt, max_turns,
            max_tokens).
    """

    tools: ClassVar[Sequence[Any]] = ()

    def __init__(
        self,
        *args: Any,
        tools: Sequence[Any] | None = None,
        tool_parser: str = "auto",
        tool_timeout: float = 30.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.toolset: dict[str, Tool] = {
            t.name: t for t in (make_tool(f) for f in (tools if tools is not None else self.tools))
        }
        self.tool_parser = tool_parser
        self._parse = get_parser(tool_parser)
        self.executor = ToolExecutor(self.toolset, default_timeout=tool_timeout)

    @property
    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """The OpenAI schemas of the env's tools, or ``None`` when it has none."""
        return [t.schema for t in self.toolset.values()] or None

    def tool_context(self, state: State) -> dict[str, Any]:
        """Values for the tools' ``Injected`` parameters: ``state`` plus ``state.data``."""
        return {"state": state, **state.data}

    def parse_turn(self, state: State, turn: AssistantTurn) -> ParsedTurn:
        """Read the tool calls of a turn: structured ones from the server, else from the text."""
        message = turn.message
        if message.tool_calls:
            return check_openai_calls(message.content, message.tool_calls)
        return self._parse(message.content or "", f"call_{state.turn}_")

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        """Run the turn's tool calls and reply with their results, one tool message each.

        A turn that attempts no tool call ends the episode. Calls parsed from raw text are
        recorded on the assistant message; every call and every failed call (by error kind) is
        counted in ``state.metrics``.
        """
        parsed = self.parse_turn(state, turn)
        if parsed.calls and not turn.message.tool_calls:
            # Keep the raw text as content (it is what was sampled) and record the parsed calls.
            state.messages[-1] = turn.message.model_copy(update={"tool_calls": tuple(parsed.calls)})
        if parsed.attempted == 0:
            state.done = True
            return []
        outcomes = await self.executor.run(parsed, self.tool_context(state))
        state.metrics["tool_calls"] += len(outcomes)
        for outcome in outcomes:
            if outcome.error:
                state.metrics["tool_errors"] += 1
                state.metrics[f"tool_error/{outcome.error}"] += 1
        return [o.message for o in outcomes]
