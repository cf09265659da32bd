"""OpenEnv servers as envhub envs: ``envhub.make("openenv:http://HOST:PORT")``.

An OpenEnv env (``pip install 'envhub[openenv]'``, the ``openenv-core`` package) lives behind a
server; the name is its URL (``http``, ``https``, ``ws`` or ``wss``), and a query or keyword
arguments set the options of :class:`OpenEnvEnv` (``openenv:http://HOST:PORT?max_turns=4``).
Episodes run over the server's WebSocket ``/ws`` with OpenEnv's own ``GenericEnvClient``: that
is where OpenEnv keeps a session (its HTTP ``/reset`` and ``/step`` make a fresh env for every
call).

The action, in one of three modes read from the server's ``/schema`` (``action_mode`` picks
one by hand):

- **text**: the assistant turn's text becomes one string field of the action
  (``action_field``, or the schema's only string field, or the first of
  :data:`~envhub.adapters.openenv.schema.TEXT_FIELDS` it has); ``action_defaults`` fills the
  other fields. Chosen when that fills every required field (an echo env, text games, envs
  that take code or a command as one string). Replies are user messages.
- **tool**: any other typed action (an ``int`` field, several fields) is one tool the model
  calls, named after the action class (``GuessAction`` -> ``guess``; ``tool_name`` renames it),
  whose JSON schema is the action's own (less ``metadata`` and what ``action_defaults`` fills).
  Each call is one ``step``; its reply is a tool message.
- **mcp**: an env whose action is OpenEnv's ``CallToolAction`` (an ``MCPEnvironment``) offers
  one tool per MCP tool the server lists (its ``/mcp`` ``tools/list``); each call is one
  ``step`` with a ``call_tool`` action, answered with the tool's result as text.

A reply that makes no valid action (a call to an unknown tool, arguments the schema rejects,
malformed call JSON, no call at all in a tool mode, or an action the server rejects as
invalid) is the policy's failed turn, not an env error: the server is not stepped (as OpenEnv's
server steps nothing for an action its schema rejects), the model reads what was wrong, the
turn pays ``invalid_reward`` (default 0) and counts towards ``max_turns``, and the episode's
metrics count it (``tool_calls``, ``tool_errors``, ``tool_error/<kind>``, ``invalid_turns``).

- **observation**: one string field becomes the message (``observation_field``, found as for
  the action), or else the observation's fields as JSON. The reset observation is the prompt
  (after ``system_prompt``, if given).
- **reward**: each step's reward (``None`` -> 0.0), summed over a turn's calls; the episode's
  reward is their sum.
- **done** -> ``terminated``; after ``max_turns`` turns without it the episode is
  ``truncated``. As with OpenEnv's own client, ``step`` after the episode ended is still sent
  to the server, which answers as its env does; only a ``step`` before the first ``reset``
  raises.
- **info**: ``{"observation": <the last whole observation>, "turn": n, "metrics": {...}}``;
  ``reset(options=...)`` sends the options as extra reset arguments (OpenEnv passes those its
  env's reset takes).

An env whose action cannot be mapped in the mode asked for fails when made with
:class:`~envhub.errors.EnvLoadError` naming the fields and the option to set. Failures while
running, as the rollout runner records them: the server unreachable or the connection lost ->
:class:`~envhub.errors.RemoteEnvUnavailableError` (infrastructure; between episodes, ``reset``
connects again); any other error the server reports -> :class:`~envhub.errors.RemoteEnvError`
(the env's failure).

OpenEnv has no catalog of envs to list: :func:`list_envs` returns ``{}``.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from envhub.adapters.openenv.env import OpenEnvEnv
from envhub.errors import EnvNotFoundError, MissingDependencyError

__all__ = ["OpenEnvEnv", "list_envs", "make_env"]


def list_envs() -> dict[str, str]:
    """Nothing: OpenEnv envs are servers, named by URL (``openenv:http://HOST:PORT``)."""
    return {}


def make_env(name: str, **kwargs: Any) -> OpenEnvEnv:
    """The OpenEnv env served at the URL ``name``; see the module docstring for ``kwargs``.

    Raises:
        MissingDependencyError: openenv-core is not installed.
        EnvNotFoundError: ``name`` is not a URL.
        RemoteEnvUnavailableError: Nothing answers at the URL.
        EnvLoadError: The env's action cannot be mapped in the mode asked for.
    """
    if importlib.util.find_spec("openenv") is None:
        raise MissingDependencyError.for_extra("openenv-core", "openenv")
    from envhub.errors import ConfigError
    from envhub.serve.remote import parse_url

    try:
        url, query = parse_url(name)
    except ConfigError:
        raise EnvNotFoundError(
            f"openenv:{name}: name an OpenEnv server by its URL, e.g. openenv:http://HOST:PORT"
        ) from None
    return OpenEnvEnv(url, **{**query, **kwargs})
