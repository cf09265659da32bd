"""Named agents: published agent programs as harness programs, their commands run in the
episode's sandbox session and their model calls recorded by the endpoint.

    from envhub.harness import HarnessEnv
    from envhub.harness.agents import mini_swe_agent

    env = HarnessEnv(mini_swe_agent(step_limit=20), tasks, sandbox=ContainerSandbox(), ...)

:func:`mini_swe_agent` runs `mini-swe-agent <https://pypi.org/project/mini-swe-agent/>`_
(``pip install 'envhub[agents]'``) as it is: its ``DefaultAgent`` with its text-based model
(one fenced bash command per reply, which any chat model can write) and its own prompts,
talking to the endpoint through litellm's OpenAI provider. Only its environment is envhub's:
each command runs in the episode's session (:class:`SessionEnvironment`) instead of on the
host, so the agent works where the task is (a container of the task's image, a bubblewrap
session) and the session's limits hold. The agent's submission is the episode's result.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from envhub.harness.programs import CallableProgram

if TYPE_CHECKING:
    from envhub.sandbox.session import Session

MINI_CONFIG = "mini_textbased"
"""mini-swe-agent's config whose prompts the preset uses (its own file, as shipped)."""


def _local_environment() -> type:
    """mini-swe-agent's local environment class (imported when a preset runs)."""
    from minisweagent.environments.local import LocalEnvironment

    return LocalEnvironment


class SessionEnvironment:
    """A mini-swe-agent environment whose commands run in an envhub session.

    mini-swe-agent calls :meth:`execute` from its own thread; each command is handed to the
    event loop that owns the session and waited for there. Output is stdout then stderr (the
    agent's own local environment merges them); a command past ``timeout`` comes back as the
    agent's timeouts do (``returncode`` -1 with the reason), so the agent can carry on.

    Args:
        session: The episode's session.
        loop: The event loop the session's calls run on.
        cwd: Where commands start (default: the session's working folder).
        timeout: Seconds each command may run.
        env: Variables every command gets (the agent's config sets ``PAGER=cat`` and such).
    """

    def __init__(
        self,
        session: Session,
        loop: asyncio.AbstractEventLoop,
        cwd: str = "",
        timeout: int = 60,
        env: dict[str, str] | None = None,
    ) -> None:
        self.session, self.loop, self.env = session, loop, dict(env or {})
        # The agent's own local environment holds what it needs besides running a command:
        # its config (cwd, timeout), the submission check and the prompt's template values.
        self._agent_side = _local_environment()(cwd=cwd, timeout=timeout)
        self.config = self._agent_side.config

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run ``action["command"]`` in the session; the agent's result dict."""
        command = action.get("command", "")
        folder = cwd or self.config.cwd
        if folder:
            command = f"cd {folder} && {command}"
        limit = timeout or self.config.timeout
        call = self.session.arun(["/bin/bash", "-c", command], wall_time=limit, env=self.env)
        result = asyncio.run_coroutine_threadsafe(call, self.loop).result()
        output: dict[str, Any] = {
            "output": result.stdout + result.stderr,
            "returncode": result.exit_code if result.exit_code is not None else -1,
            "exception_info": "",
        }
        if result.stop_reason != "ok":
            output["exception_info"] = f"The command stopped: {result.describe()}"
        self._agent_side._check_finished(output)  # raises Submitted on the agent's signal
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The values the agent's prompts are rendered with (its local environment's)."""
        return self._agent_side.get_template_vars(**kwargs)

    def serialize(self) -> dict:
        """How the agent saves its environment in its trajectory file."""
        return {"info": {"config": {"environment": self.config.model_dump(mode="json"),
                                    "environment_type": "envhub session"}}}  # fmt: skip


def mini_swe_agent(
    *, step_limit: int = 30, command_timeout: int = 60, cwd: str = "", config: str = MINI_CONFIG
) -> CallableProgram:
    """mini-swe-agent as a harness program (see the module docstring).

    Args:
        step_limit: Model calls before the agent stops (its ``step_limit``).
        command_timeout: Seconds each of its commands may run in the session.
        cwd: Where its commands start (default: the session's working folder).
        config: Which of mini-swe-agent's shipped configs gives the prompts.

    Raises:
        ImportError: mini-swe-agent is not installed (``pip install 'envhub[agents]'``).
    """
    agent_config = _agent_config(config)

    async def run(base_url: str, api_key: str, model: str, prompt: str, session: Any) -> str:
        if session is None:
            raise ValueError(
                "mini_swe_agent runs its commands in a session: give the env a sandbox"
            )

        loop = asyncio.get_running_loop()
        variables = agent_config["environment"].get("env", {})
        environment = SessionEnvironment(session, loop, cwd, command_timeout, variables)
        agent = _make_agent(environment, base_url, api_key, model, agent_config, step_limit)
        result = await asyncio.to_thread(agent.run, prompt)
        return str(result.get("submission", "")).strip()

    run.__qualname__ = run.__name__ = "mini_swe_agent"
    return CallableProgram(run)


def _agent_config(name: str) -> dict[str, Any]:
    """The ``agent``, ``model`` and ``environment`` sections of one of mini-swe-agent's
    shipped configs."""
    import yaml
    from minisweagent.config import builtin_config_dir

    loaded = yaml.safe_load((builtin_config_dir / f"{name}.yaml").read_text())
    return {part: loaded.get(part) or {} for part in ("agent", "model", "environment")}


def _make_agent(
    environment: SessionEnvironment,
    base_url: str,
    api_key: str,
    model: str,
    config: dict[str, Any],
    step_limit: int,
) -> Any:
    """The agent, its model the endpoint through litellm's OpenAI provider."""
    # litellm would fetch its model price map from the internet on import; the shipped one
    # serves, and the endpoint's model has no price anyway.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

    model_settings = {
        key: value for key, value in config["model"].items() if key not in ("model_name",)
    }
    kwargs = {"api_base": base_url, "api_key": api_key, **model_settings.pop("model_kwargs", {})}
    language_model = LitellmTextbasedModel(
        model_name=f"openai/{model}",
        model_kwargs=kwargs,
        cost_tracking="ignore_errors",
        **model_settings,
    )
    agent_settings = {**config["agent"], "step_limit": step_limit, "cost_limit": 0}
    return DefaultAgent(language_model, environment, **agent_settings)
