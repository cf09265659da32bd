"""Gymnasium spaces for chat: observations are lists of messages, actions are assistant turns."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from pydantic import ValidationError

from envhub.types import AssistantTurn, Message


class _TextSampler:
    """The gymnasium ``Text`` space a chat space samples from, made on first use: making one
    costs ~75 us, and a rollout makes an env (with two chat spaces) per concurrent episode
    while almost never sampling from them."""

    def __init__(self, max_length: int, seed: int | np.random.Generator | None) -> None:
        self.max_length = max_length
        self._seed = seed
        self._space: spaces.Text | None = None

    def seed(self, seed: int | None) -> None:
        """Seed the space now, or when it is made."""
        if self._space is None:
            self._seed = seed
        else:
            self._space.seed(seed)

    def sample(self) -> str:
        """A random text from the space."""
        if self._space is None:
            self._space = spaces.Text(max_length=self.max_length, seed=self._seed)
        return self._space.sample()


class MessagesSpace(spaces.Space[list]):
    """Lists of OpenAI-format chat messages (``Message`` objects or dicts)."""

    def __init__(self, seed: int | np.random.Generator | None = None) -> None:
        self._text = _TextSampler(64, seed)  # first: a seed given here reaches seed()
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        """False: chat messages have no flat numpy form."""
        return False

    def seed(self, seed: int | None = None) -> int | list[int] | dict[str, int]:
        """Seed this space and the text space that :meth:`sample` draws from."""
        self._text.seed(seed)
        return super().seed(seed)

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        """One user message of random text (``mask`` and ``probability`` are ignored)."""
        return [Message(role="user", content=self._text.sample())]

    def contains(self, x: Any) -> bool:
        """True if ``x`` is a list or tuple whose items are messages or valid message dicts."""
        if not isinstance(x, (list, tuple)):
            return False
        try:
            for item in x:
                if not isinstance(item, Message):
                    Message.model_validate(item)
        except ValidationError:
            return False
        return True

    def __repr__(self) -> str:
        return "MessagesSpace()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessagesSpace)


class AssistantTurnSpace(spaces.Space[Any]):
    """An assistant turn: text, an assistant ``Message``, or an ``AssistantTurn``."""

    def __init__(
        self, max_length: int = 256, seed: int | np.random.Generator | None = None
    ) -> None:
        self._text = _TextSampler(max_length, seed)  # first: a seed given here reaches seed()
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        """False: chat messages have no flat numpy form."""
        return False

    def seed(self, seed: int | None = None) -> int | list[int] | dict[str, int]:
        """Seed this space and the text space that :meth:`sample` draws from."""
        self._text.seed(seed)
        return super().seed(seed)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random text turn (``mask`` and ``probability`` are ignored)."""
        return self._text.sample()

    def contains(self, x: Any) -> bool:
        """True for any string, an assistant ``Message``, or an ``AssistantTurn`` holding one."""
        if isinstance(x, str):
            return True
        if isinstance(x, AssistantTurn):
            return x.message.role == "assistant"
        return isinstance(x, Message) and x.role == "assistant"

    def __repr__(self) -> str:
        return "AssistantTurnSpace()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AssistantTurnSpace)
