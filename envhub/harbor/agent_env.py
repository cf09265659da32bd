"""Harbor tasks played by an agent program: :class:`HarborAgentEnv`.

The program (a named agent such as :func:`~envhub.harness.agents.mini_swe_agent`, or any
harness program) gets the task's instruction, works in the task's session (the task's own
image on a container back end, at its own paths: see :mod:`envhub.harbor.images`), and calls
the policy through the recording endpoint; when it ends, the task's tests run in that session
and their reward is the episode's, exactly as :class:`~envhub.harbor.env.HarborEnv` scores
the model's own tool calls.

    envhub.make("path/to/tasks", agent="mini-swe-agent", sandbox="podman")
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from envhub.harbor.env import HarborEnv
from envhub.harness.env import HarnessEnv
from envhub.harness.programs import Program
from envhub.rewards.rubric import Rubric, reward
from envhub.sandbox.base import Sandbox
from envhub.sandbox.session import Session
from envhub.state import State
from envhub.workspace_env import default_sandbox


def named_agents() -> dict[str, Callable[..., Program]]:
    """The agent presets ``agent=`` names."""
    from envhub.harness.agents import mini_swe_agent
    from envhub.harness.terminus import terminus_agent

    return {"mini-swe-agent": mini_swe_agent, "terminus": terminus_agent}


def agent_program(agent: str | Program | Callable[..., Any] | Sequence[str]) -> Any:
    """``agent`` as a program: a preset's name (:func:`named_agents`), else as it is.

    Raises:
        ValueError: An unknown preset name.
    """
    if not isinstance(agent, str) or " " in agent or "/" in agent:
        return agent
    presets = named_agents()
    if agent not in presets:
        raise ValueError(f"unknown agent {agent!r}; named agents: {', '.join(sorted(presets))}")
    return presets[agent]()


class HarborAgentEnv(HarnessEnv):
    """Harbor tasks played by an agent program (see the module docstring).

    Args:
        path: A task folder, a folder of them, or a registry file (as :class:`HarborEnv`'s).
        agent: A named agent (``"mini-swe-agent"``) or any harness program.
        sandbox: Where the sessions run (as :class:`HarborEnv`'s ``sandbox``; default: the
            local sandbox).
        image_map: Stand-ins for base images (container back ends).
        skip_unsupported: As :class:`HarborEnv`'s.
        **kwargs: See :class:`~envhub.harness.env.HarnessEnv` (``timeout``, ``max_turns``...).
    """

    name = "harbor-agent"
    version = "0.1.0"

    def __init__(
        self,
        path: str | Path,
        agent: Any = "mini-swe-agent",
        *,
        sandbox: Sandbox | str | None = None,
        image_map: dict[str, str] | None = None,
        skip_unsupported: bool = False,
        **kwargs: Any,
    ) -> None:
        self.harbor = HarborEnv(
            path, sandbox=sandbox, image_map=image_map, skip_unsupported=skip_unsupported
        )
        rows = [
            {"question": t.instruction, "info": {"id": key, "name": t.name}}
            for key, t in self.harbor.tasks.items()
        ]
        kwargs.setdefault("rubric", Rubric([reward(self._verified, name="verifier")]))
        super().__init__(
            agent_program(agent), rows, sandbox=self.harbor.sandbox or default_sandbox(), **kwargs
        )

    def task_text(self, task: dict[str, Any]) -> str:
        """The instruction as the session shows the task (its paths mapped where they are
        not shown)."""
        return str(self.harbor.format_prompt(task)[-1].content)

    async def setup_state(self, state: State) -> None:
        """Prepare the task's image or workspace (once per task) before its session opens."""
        await super().setup_state(state)
        await self.harbor.prepare_workspace(state.task)

    def session_for(self, task: dict[str, Any]) -> Session | None:
        """The task's session, as :class:`HarborEnv` opens it (its image, its paths)."""
        assert self.session_sandbox is not None
        workspace = self.harbor.workspace_for(task)
        return self.harbor.session_for(self.session_sandbox, workspace, task)

    async def _verified(self, state: State) -> float:
        """The task's tests' reward, run in the episode's session once the agent has ended."""
        verdict = await self.harbor.score(state.data["session"], state.task)
        state.reward_components.update(verdict.components)
        return verdict.reward

    def on_close(self) -> None:
        """Stop the program, then close the Harbor env's own resources."""
        super().on_close()
        self.harbor.close()
