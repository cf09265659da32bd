"""Check a chat template for the multi-turn exact-prefix property before training on it.

Token-exact multi-turn RL needs every turn's prompt to be an exact token prefix of the next
one. Some templates break this: they rewrite earlier assistant turns (dropping reasoning, as
Qwen3's does), re-render tool calls, or add text that depends on the position of a message.
The rollout runner detects and records such drift per episode; this module finds it up front,
for any :class:`ChatTokenizer` (a vLLM server's, a local one), with one implementation
(:func:`check_prefix_property`) on two sources of conversations:

- ``envhub doctor``: synthetic plain, tool-calling and reasoning conversations
  (:data:`CONVERSATIONS`);
- ``envhub check ENV --model M``: the env's real episodes, played by its scripted
  ``reference_policy`` (:func:`env_conversations`), before any GPU is spent on it.

Conversations are rendered as rollouts render them (tools in the system prompt when the
template drops them: :class:`~envhub.rollout.tool_prompt.ToolsInPrompt`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envhub.checks.checker import spread_tasks
from envhub.env import Env, TaskEnv
from envhub.inference.base import ChatTokenizer
from envhub.rollout.tokens import common_prefix_length
from envhub.rollout.tool_prompt import ToolsInPrompt
from envhub.testing import Policy, null_policy
from envhub.tools.prompt import tool_call_block
from envhub.types import Message, as_message, assistant, system, tool_message, user

Conversations = dict[str, tuple[list[Message], list[dict[str, Any]] | None]]
"""Named conversations to check, each with the tools it was held with."""

_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}

CONVERSATIONS: Conversations = {
    "plain multi-turn": (
        [
            system("You are terse."),
            user("Pick a number."),
            assistant("7"),
            user("Higher."),
            assistant("9"),
            user("Correct!"),
        ],
        None,
    ),
    "tool calls": (
        [
            user("What is 12 * 34?"),
            assistant(tool_call_block("calculate", {"expression": "12 * 34"})),
            tool_message("408", "call_1", "calculate"),
            assistant("It is 408."),
            user("And plus 2?"),
        ],
        [_TOOL],
    ),
    "reasoning": (
        [
            user("2+2?"),
            assistant("<think>2 and 2 make 4.</think>4"),
            user("3+3?"),
            assistant("<think>Easy.</think>6"),
            user("ok"),
        ],
        None,
    ),
}


@dataclass(frozen=True)
class PrefixFinding:
    """One place where a turn's prompt is not a prefix of the next turn's."""

    conversation: str
    turn: int
    position: int
    expected: list[int]
    """Up to 8 tokens from ``position`` as the earlier render has them."""
    rendered: list[int]
    """The same span as the later render has it."""
    expected_text: str | None = None
    """``expected`` decoded, when the tokenizer can decode."""
    rendered_text: str | None = None


async def check_prefix_property(
    tokenizer: ChatTokenizer, conversations: Conversations | None = None
) -> tuple[int, list[PrefixFinding]]:
    """Render each conversation turn by turn (as rollouts do: tools in the system prompt when
    the template drops them); report every turn whose prompt plus assistant turn is not an
    exact prefix of the next turn's prompt. Returns (turns checked, findings)."""
    decode = getattr(tokenizer, "decode", None)
    tokenizer = ToolsInPrompt(tokenizer)
    findings, checked = [], 0
    for name, (messages, tools) in (conversations or CONVERSATIONS).items():
        turns = [i for i, m in enumerate(messages) if m.role == "assistant"]
        for number, index in enumerate(turns):
            if index + 1 >= len(messages):
                continue
            opened = await tokenizer.render(messages[:index], tools, add_generation_prompt=True)
            closed = await tokenizer.render(
                messages[: index + 1], tools, add_generation_prompt=False
            )
            following = await tokenizer.render(
                messages[: next_prompt_end(messages, index)], tools, add_generation_prompt=True
            )
            checked += 1
            # The generation prompt must open the turn as history renders it, and the history
            # must stay as it was once the env replies.
            for before, after in ((opened, closed), (closed, following)):
                at = common_prefix_length(before, after)
                if at < len(before):
                    findings.append(_finding(name, number, at, before, after, decode))
                    break
    return checked, findings


def next_prompt_end(messages: list[Message], index: int) -> int:
    """End of the env's reply that follows the assistant turn at ``index``."""
    end = index + 1
    while end < len(messages) and messages[end].role != "assistant":
        end += 1
    return end


def _finding(
    name: str, turn: int, at: int, before: list[int], after: list[int], decode: Any
) -> PrefixFinding:
    expected, rendered = before[at : at + 8], after[at : at + 8]
    if decode is None:
        return PrefixFinding(name, turn, at, expected, rendered)
    return PrefixFinding(name, turn, at, expected, rendered, decode(expected), decode(rendered))


def env_conversations(
    env: Env, episodes: int = 3, policy: Policy | None = None, max_steps: int = 50
) -> Conversations:
    """The conversations of ``episodes`` real episodes of ``env``, played by ``policy`` (default:
    the env's ``reference_policy``, else the empty reply), on tasks spread over its dataset.

    Named ``"task N"`` (``"seed N"`` for an env without a dataset). An episode cut at
    ``max_steps`` is kept as far as it went.
    """
    policy = policy or getattr(env, "reference_policy", None) or null_policy
    size = len(env.dataset) if isinstance(env, TaskEnv) else 0
    tasks = spread_tasks(episodes, size) if size else [None] * episodes
    out: Conversations = {}
    for seed, task in enumerate(tasks):
        options = None if task is None else {"task_index": task}
        observation, _ = env.reset(seed=seed, options=options)
        messages = [as_message(m) for m in observation]
        for _ in range(max_steps):
            reply = policy(list(messages), env.tool_schemas)
            observation, _, terminated, truncated, _ = env.step(reply)
            messages += [assistant(reply), *(as_message(m) for m in observation)]
            if terminated or truncated:
                break
        out[f"task {task}" if task is not None else f"seed {seed}"] = (messages, env.tool_schemas)
    return out
