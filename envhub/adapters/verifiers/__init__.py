"""`verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ environments as envhub envs.

``envhub.make("verifiers:NAME")`` loads an installed verifiers environment with verifiers' own
``load_environment(NAME, **kwargs)``; :func:`from_verifiers` adapts one already built. The
adapter targets verifiers' classic environment API (``vf.SingleTurnEnv``, ``vf.MultiTurnEnv``,
``vf.ToolEnv``, ``vf.StatefulToolEnv``, ``vf.Rubric``), which verifiers 0.3 keeps under
``verifiers.legacy`` and still answers at ``import verifiers as vf``; verifiers 0.4 dropped it
for its ``verifiers.v1`` stack, whose environments run as harness envs in a venv of their own
(:mod:`envhub.adapters.verifiers.v1`: :class:`VerifiersV1Env`).

How verifiers' concepts map to envhub's:

- dataset rows (``prompt``/``question``, ``answer``, ``info``, ``example_id``) are the tasks of a
  :class:`~envhub.env.TaskEnv`, formatted by verifiers itself (system prompt, few-shot);
- an episode *is* verifiers' own ``env.rollout(...)``, run as a task on the caller's event
  loop with a client that hands each model request to envhub and waits for the turn that
  envhub's runner sampled: ``setup_state``, ``env_response``, stop conditions
  (``is_completed``), ``final_env_response``, tool calls (executed by the verifiers env's own
  functions, ``update_tool_args`` included) all run as verifiers runs them. The adapter only
  passes messages: envhub's runner renders and records the tokens, so the token contract holds;
- the ``tool_defs`` of the env (or of a task's ``info``) become OpenAI tool schemas; a turn's
  calls are the engine's structured ones or, from raw text, those envhub's parsers read;
- the rubric is verifiers' own ``score_rollout`` (``score_group`` for group rewards): the
  episode's reward is its weighted total and every function's value (metrics included) is a
  reward component. A reward function that raises scores 0, as in verifiers, and is also
  recorded on the trajectory as an error (verifiers itself only logs it);
- verifiers' stop conditions map to ``terminated``, except ``max_turns_reached`` (but for a
  ``SingleTurnEnv``, whose one turn is the task), ``max_total_completion_tokens_reached``,
  ``prompt_too_long`` and ``timeout_reached``, which truncate; a rollout error
  (``state["error"]``) is recorded with stage ``env.step``.
"""

from __future__ import annotations

import json
from importlib import metadata, util
from typing import Any

from envhub.adapters.verifiers._load import _vf
from envhub.adapters.verifiers.env import VerifiersEnv
from envhub.errors import EnvLoadError, EnvNotFoundError

__all__ = ["VerifiersEnv", "from_verifiers", "list_envs", "make_env"]

_loaded: dict[str, Any] = {}

# -- discovery and loading ------------------------------------------------------------------------


def list_envs() -> dict[str, str]:
    """Installed verifiers environments: distributions that require ``verifiers`` and whose
    module (the name with ``-`` as ``_``) defines ``load_environment``; ``{}`` without
    verifiers. Nothing is imported: the module's source is read."""
    if util.find_spec("verifiers") is None:
        return {}
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name == "verifiers" or not any(
            r.split(";")[0].strip().lower().startswith("verifiers") for r in dist.requires or ()
        ):
            continue
        if _defines_load_environment(name.replace("-", "_")):
            found[name] = dist.metadata["Summary"] or f"verifiers environment {name}"
    return found


def _defines_load_environment(module: str) -> bool:
    try:
        spec = util.find_spec(module)
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    try:
        with open(spec.origin, encoding="utf-8") as f:
            return "def load_environment" in f.read()
    except OSError:
        return False


def make_env(name: str, **kwargs: Any) -> VerifiersEnv:
    """The verifiers environment ``name`` (``load_environment(name, **kwargs)``), adapted.

    One verifiers environment serves every adapted env made with the same name and arguments
    in this process (verifiers runs many rollouts on one environment), so a runner's pool of
    envs loads the dataset once.

    Raises:
        EnvNotFoundError: No installed verifiers environment is called ``name``.
        EnvLoadError: Its ``load_environment`` failed.
        MissingDependencyError: verifiers is not installed.
    """
    vf = _vf()
    key = f"{name}\0{json.dumps(kwargs, sort_keys=True, default=repr)}"
    if key not in _loaded:
        module = name.replace("-", "_").split("/")[-1]
        if util.find_spec(module) is None:
            known = ", ".join(sorted(list_envs())) or "none"
            raise EnvNotFoundError(
                f"no verifiers environment {name!r} is installed (no module {module!r}); "
                f"install its package first. Installed: {known}"
            )
        try:
            _loaded[key] = vf.load_environment(name, **kwargs)
        except Exception as e:
            cause = e.__cause__ or e
            raise EnvLoadError(
                f"verifiers environment {name!r} failed to load: {type(cause).__name__}: {cause}"
            ) from e
    return from_verifiers(_loaded[key], name=f"verifiers:{name}", version=_version(name))


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "0.0.0"


from_verifiers = VerifiersEnv
"""Adapt a verifiers environment instance as an envhub env: :class:`VerifiersEnv`'s arguments."""
