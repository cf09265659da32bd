"""Harness envs: train agent programs you already have, as black boxes.

An agent program (an ``openai``-SDK loop, an OpenAI Agents SDK agent, a CLI agent, ...) is
pointed at an OpenAI-compatible endpoint that answers with the policy and records every call's
exact tokens; each run of the program on a task is one episode of a :class:`HarnessEnv`.

- :mod:`envhub.harness.env` — :class:`HarnessEnv`, the env (and what an episode records);
- :mod:`envhub.harness.endpoint` — the recording endpoint, one per process;
- :mod:`envhub.harness.programs` — Python callables and commands as programs;
- :mod:`envhub.harness.host` — the program host: Python programs in a child process;
- :mod:`envhub.harness.mailbox` — calls and replies between the endpoint's and the runner's loops;
- :mod:`envhub.harness.wire` — the chat-completions wire format;
- :mod:`envhub.harness.responses` — the Responses API wire format (the Agents SDK's default);
- :class:`VerifiersV1Env` — a verifiers 0.4 (v1) environment run in its own venv, a harness
  env kept with the rest of verifiers support (:mod:`envhub.adapters.verifiers.v1`).
"""

from envhub.harness.env import NEW_SEGMENT, HarnessEnv, HarnessError
from envhub.harness.programs import (
    CallableProgram,
    CommandProgram,
    Launch,
    PolicyFailure,
    Program,
    ProgramResult,
)

__all__ = [
    "NEW_SEGMENT",
    "CallableProgram",
    "CommandProgram",
    "HarnessEnv",
    "HarnessError",
    "Launch",
    "PolicyFailure",
    "Program",
    "ProgramResult",
    "VerifiersV1Env",
]


def __getattr__(name: str) -> object:
    """``VerifiersV1Env`` on first use: it lives with the rest of verifiers support, whose
    module imports this package's env (an import here would close a cycle)."""
    if name == "VerifiersV1Env":
        from envhub.adapters.verifiers.v1 import VerifiersV1Env

        return VerifiersV1Env
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
