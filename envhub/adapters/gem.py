"""GEM's text envs as envhub envs: ``envhub.make("gem:game:GuessTheNumber-v0-easy")``.

GEM (``pip install 'envhub[gem]'``, the ``gem-llm`` package) registers gym-style text envs:
``reset(seed) -> (text, info)`` and ``step(text) -> (text, reward, terminated, truncated,
info)``. The name after ``gem:`` is GEM's env id; keyword arguments go to ``gem.make`` (they
override the registered ones, e.g. ``max_turns=3``), except ``system_prompt``, a system message
put before the first observation.

The mapping: the reset text is the prompt (a user message); the assistant turn's text is the
action; each step's text comes back as a user message, with GEM's reward, ``terminated``,
``truncated`` and info unchanged (the episode's reward is the sum of the steps'). GEM's reset
takes only a seed: reset options are ignored.

GEM's envs draw from the process-wide ``random`` and ``numpy.random`` (its reset seeds them). So
that adapted envs neither disturb the rest of the process nor each other, every call runs under
one lock with the env's own copy of that state swapped in: an adapted env under a seed sees the
same numbers GEM would alone, whatever else runs.

Offline: the ``game:`` envs (GuessTheNumber, Mastermind, Minesweeper, Sudoku, Sokoban, ...) and
the ``rg:`` envs (reasoning-gym's generated tasks), except Wordle, Hangman and WordSearch, which
download nltk's word list when made. The ``math:``, ``code:``, ``qa:``, ``logic:`` and ``eval:``
envs load data sets from the Hugging Face Hub when made. :func:`list_envs` says which download.
"""

from __future__ import annotations

import importlib.util
import logging
import random
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from envhub.env import Action, Env, StepResult, as_turn
from envhub.errors import EnvhubError, EnvLoadError, EnvNotFoundError, MissingDependencyError
from envhub.types import Message, system, user

T = TypeVar("T")
OFFLINE_PREFIXES = ("game:", "rg:")
"""GEM env ids that need no data set from the Hub."""
WORD_LIST_GAMES = ("Wordle", "Hangman", "WordSearch")
"""Games that download nltk's word list when made."""
_RNG_LOCK = threading.Lock()
"""Held around every call into GEM: they share the process's random state."""


def list_envs() -> dict[str, str]:
    """GEM's registered env ids and what each one is (``{}`` without GEM)."""
    if importlib.util.find_spec("gem") is None:
        return {}
    registry = _import_gem().envs.registration.ENV_REGISTRY
    return {env_id: _describe(spec) for env_id, spec in registry.items()}


def make_env(name: str, **kwargs: Any) -> GemEnv:
    """The GEM env ``name`` (a GEM env id); see the module docstring.

    Raises:
        MissingDependencyError: gem-llm is not installed.
        EnvNotFoundError: GEM has no env by that id.
        EnvLoadError: GEM failed to make it.
    """
    if importlib.util.find_spec("gem") is None:
        raise MissingDependencyError.for_extra("gem-llm", "gem")
    gem = _import_gem()
    registry = gem.envs.registration.ENV_REGISTRY
    if name not in registry:
        from difflib import get_close_matches

        near = get_close_matches(name, list(registry), n=3)
        hint = f"; did you mean {', '.join(near)}?" if near else " (envhub list shows them)"
        raise EnvNotFoundError(f"GEM has no env {name!r}{hint}")
    return GemEnv(name, **kwargs)


class GemEnv(Env):
    """A GEM env; see the module docstring.

    Args:
        env_id: GEM's id of the env.
        system_prompt: A system message put before the first observation.
        **gem_kwargs: Arguments for ``gem.make``.

    Raises:
        EnvLoadError: GEM failed to make the env.
    """

    def __init__(self, env_id: str, *, system_prompt: str | None = None, **gem_kwargs: Any):
        super().__init__()
        import numpy as np

        gem = _import_gem()
        self.env_id, self.system_prompt = env_id, system_prompt
        self.name = f"gem:{env_id}"
        self.version = _gem_version()
        # Fresh entropy: unseeded episodes of two adapted envs differ, as two GEM envs' would.
        self._rng: tuple[Any, Any] = (
            random.Random().getstate(),
            np.random.RandomState().get_state(),
        )
        try:
            self.gem_env = self._isolated(lambda: gem.make(env_id, **gem_kwargs))
        except Exception as e:
            raise EnvLoadError(f"GEM could not make {env_id!r}: {type(e).__name__}: {e}") from e
        self._in_episode = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """GEM's reset under ``seed``; its text is the prompt."""
        text, info = self._isolated(lambda: self.gem_env.reset(seed=seed))
        self._in_episode = True
        head = [system(self.system_prompt)] if self.system_prompt else []
        return [*head, user(str(text))], dict(info or {})

    def step(self, action: Action) -> StepResult:
        """GEM's step on the turn's text; see the module docstring."""
        if not self._in_episode:
            raise EnvhubError(f"{self.name}: call reset() before step() (or after an episode ends)")
        text = as_turn(action).message.content or ""
        observation, reward, terminated, truncated, info = self._isolated(
            lambda: self.gem_env.step(text)
        )
        self._in_episode = not (terminated or truncated)
        return [user(str(observation))], float(reward), bool(terminated), bool(truncated), info

    def on_close(self) -> None:
        """Close the GEM env if it has a ``close``."""
        close = getattr(self.gem_env, "close", None)
        if callable(close):
            close()

    def _isolated(self, call: Callable[[], T]) -> T:
        """Run ``call`` with this env's random state in the process's generators, then put the
        process's state back (see the module docstring)."""
        import numpy as np

        with _RNG_LOCK:
            saved = (random.getstate(), np.random.get_state())
            random.setstate(self._rng[0])
            np.random.set_state(self._rng[1])
            try:
                return call()
            finally:
                self._rng = (random.getstate(), np.random.get_state())
                random.setstate(saved[0])
                np.random.set_state(saved[1])


def _import_gem() -> Any:
    """``import gem`` without its side effect on logging (it configures the root logger)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    import gem
    import gem.envs.registration

    root.handlers[:], root.level = handlers, level
    return gem


def _gem_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gem-llm")
    except PackageNotFoundError:
        return "0.0.0"


def _describe(spec: Any) -> str:
    entry = spec.entry_point if isinstance(spec.entry_point, str) else repr(spec.entry_point)
    args = ", ".join(f"{k}={v!r}" for k, v in spec.kwargs.items())
    where = "" if spec.id.startswith(OFFLINE_PREFIXES) else " (downloads its data set)"
    if spec.id.startswith("game:") and spec.id[5:].startswith(WORD_LIST_GAMES):
        where = " (downloads nltk's word list)"
    return f"GEM {entry.rpartition(':')[2]}({args}){where}"
