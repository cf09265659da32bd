"""Tools: typed functions the model can call, their schemas, parsers and execution."""

from envhub.tools.executor import ERROR_KINDS, ToolExecutor, ToolOutcome
from envhub.tools.parsers import PARSERS, ParsedTurn, ToolCallError, check_openai_calls, get_parser
from envhub.tools.tool import Injected, Tool, ToolArgumentError, make_tool, tool

__all__ = [
    "ERROR_KINDS",
    "PARSERS",
    "Injected",
    "ParsedTurn",
    "Tool",
    "ToolArgumentError",
    "ToolCallError",
    "ToolExecutor",
    "ToolOutcome",
    "check_openai_calls",
    "get_parser",
    "make_tool",
    "tool",
]
