"""A Terminus-style agent: the model types keystrokes into a tmux terminal and reads the screen.

The shape of Harbor's default agent (Terminus), written for envhub as a harness program:
each turn the model gets what the terminal shows and answers with one JSON object,

    {"analysis": "...", "plan": "...",
     "commands": [{"keystrokes": "ls -la\\n", "duration": 0.5}, ...],
     "task_complete": false}

whose keystrokes are typed into a tmux session inside the episode's session (a line ends with
``\\n``; a tmux key name such as ``C-c`` or ``Escape`` on its own is pressed as that key), each
followed by a wait of its ``duration`` (capped). ``"task_complete": true`` ends the episode;
a reply that is not such an object is answered with what was wrong, and counts as a turn.
The image needs ``tmux`` (the program says so when it is missing).

    from envhub.harness.terminus import terminus_agent
    env = HarborAgentEnv("tasks/", agent=terminus_agent(), sandbox="podman")
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

from envhub.harness.programs import CallableProgram, PolicyFailure

TMUX_SESSION = "envhub"
"""The tmux session's name inside the episode's session."""
MAX_WAIT_S = 30.0
"""The longest wait after a command's keystrokes."""
SCREEN = (160, 40)
"""The terminal's columns and rows."""
KEY_NAME = re.compile(r"(C-|M-|S-)[A-Za-z0-9]+|Enter|Escape|Tab|BSpace|Up|Down|Left|Right")
"""Keystrokes pressed as one tmux key (matched whole); anything else is typed literally."""
SYSTEM = """You are an AI assistant solving a task in a Linux terminal (a tmux session).
Each turn you see the terminal's screen. Reply with ONE JSON object and nothing else:
{"analysis": "what the screen shows", "plan": "what you do next",
 "commands": [{"keystrokes": "ls -la\\n", "duration": 0.5}],
 "task_complete": false}
Keystrokes are typed as written (end a command with \\n); a key name such as C-c is pressed.
duration: seconds to wait after the keystrokes (short for quick commands).
Set "task_complete": true once the task is done."""


@dataclass(frozen=True)
class Command:
    """One command of a reply: what to type, and how long to wait after."""

    keystrokes: str
    duration: float


def parse_reply(text: str) -> tuple[list[Command], bool]:
    """A reply's commands and whether it says the task is complete.

    Raises:
        ValueError: The reply holds no JSON object of that shape (the message says what is
            wrong, for the model).
    """
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError("no JSON object in the reply")
    try:
        data = json.loads(text[start : end + 1])
    except json.JSONDecodeError as e:
        raise ValueError(f"the JSON object does not parse: {e}") from None
    if not isinstance(data, dict):
        raise ValueError("the reply must be one JSON object")
    commands = data.get("commands", [])
    if not isinstance(commands, list) or not all(
        isinstance(c, dict) and isinstance(c.get("keystrokes"), str) for c in commands
    ):
        raise ValueError('"commands" must be a list of {"keystrokes": str, "duration": number}')
    parsed = [Command(c["keystrokes"], _duration(c.get("duration", 1.0))) for c in commands]
    return parsed, bool(data.get("task_complete", False))


def _duration(value: Any) -> float:
    try:
        return min(max(float(value), 0.0), MAX_WAIT_S)
    except (TypeError, ValueError):
        return 1.0


class Terminal:
    """A tmux session inside an envhub session."""

    def __init__(self, session: Any) -> None:
        self.session = session

    async def start(self) -> None:
        """Start the tmux server and its session.

        Raises:
            RuntimeError: tmux is missing or does not start (the message says so).
        """
        columns, rows = SCREEN
        started = await self.session.arun(
            ["tmux", "new-session", "-d", "-s", TMUX_SESSION, "-x", str(columns), "-y", str(rows)]
        )
        if not started.ok:
            raise RuntimeError(
                f"the Terminus agent needs tmux in the session's image: {started.describe()}: "
                f"{started.stderr.strip()[-200:]} (install it: RUN apt-get install -y tmux)"
            )

    async def type(self, command: Command) -> None:
        """Type (or press) ``command``'s keystrokes, then wait its duration."""
        keys = command.keystrokes
        literal = [] if KEY_NAME.fullmatch(keys) else ["-l"]
        argv = ["tmux", "send-keys", "-t", TMUX_SESSION, *literal, "--", keys]
        await self.session.arun(["/bin/sh", "-c", shlex.join(argv)])
        await asyncio.sleep(command.duration)

    async def screen(self) -> str:
        """What the terminal shows now (trailing blank lines dropped)."""
        shown = await self.session.arun(["tmux", "capture-pane", "-p", "-t", TMUX_SESSION])
        return shown.stdout.rstrip() + "\n"


def terminus_agent(*, max_turns: int = 30) -> CallableProgram:
    """The Terminus-style agent as a harness program (see the module docstring).

    Args:
        max_turns: Model calls before it stops (a policy failure: the task was not finished).
    """

    async def run(client: Any, model: str, prompt: str, session: Any) -> str:
        if session is None:
            raise ValueError("the Terminus agent types into a session: give the env a sandbox")
        terminal = Terminal(session)
        await terminal.start()
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Task:\n{prompt}\n\nScreen:\n{await terminal.screen()}"},
        ]
        for _ in range(max_turns):
            reply = await client.chat.completions.create(model=model, messages=messages)
            text = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": text})
            try:
                commands, complete = parse_reply(text)
            except ValueError as e:
                messages.append({"role": "user", "content": f"Invalid reply: {e}. {SYSTEM}"})
                continue
            for command in commands:
                await terminal.type(command)
            if complete:
                return await terminal.screen()
            messages.append({"role": "user", "content": f"Screen:\n{await terminal.screen()}"})
        raise PolicyFailure(f"the task was not marked complete in {max_turns} turns")

    run.__qualname__ = run.__name__ = "terminus_agent"
    return CallableProgram(run)
