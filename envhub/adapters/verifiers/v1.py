"""verifiers 0.4 ("v1") environments as harness envs, run in their own venv.

verifiers 0.4 cannot share envhub's venv (envhub pins verifiers 0.3 for its adapter, and 0.4
needs ``openai>=2.54`` and ``mcp==2.0.0``), so a v1 environment runs as a command: each episode
starts ``examples/agents/verifiers_v1_agent.py`` with the separate venv's Python; it loads the
environment, runs one verifiers rollout of the episode's task against the episode's endpoint
(every model call is the policy's turn, recorded token for token as for any harness env) and
prints verifiers' reward as a JSON line, which :class:`VerifiersV1Rubric` reads.

Build the venv once with ``bash scripts/verifiers_v1_venv.sh`` (it makes ``.venv-verifiers``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envhub.errors import EnvLoadError, MissingDependencyError
from envhub.harness.env import HarnessEnv
from envhub.harness.programs import CommandProgram
from envhub.rewards.rubric import Rubric, Score
from envhub.rows import RequiredField
from envhub.state import State
from envhub.types import ErrorRecord, Message, user

PYTHON_ENV_VAR = "ENVHUB_VERIFIERS_V1_PYTHON"
"""Names the Python of the verifiers 0.4 venv, when it is not ``.venv-verifiers/bin/python``."""
VENV = ".venv-verifiers"
VERIFIERS_VERSION = "0.4.0"
"""The verifiers release the runner script is written against."""
SCRIPT = Path("agents") / "verifiers_v1_agent.py"
"""The runner, under ``examples/`` (a checkout) or ``envhub.examples`` (an installed package)."""

_REPO = Path(__file__).resolve().parents[3]
_counts: dict[tuple[str, str], int] = {}


def setup_commands() -> str:
    """The commands that make the venv, as the error for a missing one says them."""
    return (
        f"in an envhub checkout run `bash scripts/verifiers_v1_venv.sh` (it makes {VENV}/); "
        f"elsewhere `python3 -m venv {VENV} && {VENV}/bin/python -m pip install "
        f"verifiers=={VERIFIERS_VERSION}`, or set {PYTHON_ENV_VAR} to the Python of a venv "
        f"that has verifiers {VERIFIERS_VERSION}"
    )


def find_python(python: str | os.PathLike[str] | None = None) -> Path:
    """The verifiers 0.4 venv's Python: ``python``, else ``$ENVHUB_VERIFIERS_V1_PYTHON``, else
    ``.venv-verifiers/bin/python`` in the current folder or the envhub checkout.

    Raises:
        MissingDependencyError: There is no such Python; the message says how to make it.
    """
    named = python if python is not None else os.environ.get(PYTHON_ENV_VAR)
    if named:
        candidates = [Path(named)]
    else:
        candidates = [Path.cwd() / VENV / "bin" / "python", _REPO / VENV / "bin" / "python"]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate.absolute()  # not resolve(): a venv's python is a symlink
    tried = ", ".join(str(c) for c in dict.fromkeys(candidates))
    raise MissingDependencyError(
        f"verifiers v1 envs run in a separate venv with verifiers {VERIFIERS_VERSION}; no "
        f"Python found at {tried}. To make it: {setup_commands()}"
    )


def find_script() -> Path:
    """The runner script: in the checkout's ``examples/``, else in ``envhub.examples``."""
    from envhub import examples

    for folder in (_REPO / "examples", examples.FOLDER):
        if (folder / SCRIPT).is_file():
            return folder / SCRIPT
    raise EnvLoadError(f"{SCRIPT} is missing from envhub's examples ({examples.FOLDER})")


class VerifiersV1Rubric(Rubric):
    """verifiers' own score of the rollout, read from the JSON line the runner printed: the
    total is its ``reward`` (the weighted sum of the task's rewards), each reward (unweighted)
    is a component, and verifiers' metrics go to the episode's metrics as ``verifiers/NAME``.

    An episode cut before the program finished (envhub's ``max_tokens``, say) has no result
    and scores 0; a result that is not the runner's JSON line scores 0 with an error.
    """

    async def score(self, state: State) -> Score:
        """Read the runner's result off ``state.data["result"]``."""
        if "result" not in state.data:
            return Score()
        try:
            result = parse_result(state.data["result"])
        except ValueError as e:
            error = ErrorRecord(stage="reward:verifiers", type="BadResult", message=str(e))
            return Score(errors=[error])
        for name, value in result.get("metrics", {}).items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                state.metrics[f"verifiers/{name}"] = float(value)
        components = {name: float(value) for name, value in result["rewards"].items()}
        return Score(total=float(result["reward"]), components=components)


def parse_result(output: Any) -> dict[str, Any]:
    """The runner's result: the last line of ``output`` that is a JSON object with a
    ``reward``.

    Raises:
        ValueError: No such line.
    """
    for line in reversed(str(output or "").splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("reward"), (int, float)):
            value.setdefault("rewards", {})
            return value
    tail = str(output or "")[-300:]
    raise ValueError(f"the program printed no verifiers result line (its output ends {tail!r})")


class VerifiersV1Env(HarnessEnv):
    """A verifiers 0.4 (v1) environment as a harness env: each episode is one verifiers
    rollout of one task, run by ``examples/agents/verifiers_v1_agent.py`` in the separate
    venv; its reward is verifiers' reward (see :class:`VerifiersV1Rubric`).

    Args:
        env_id: The taskset id (an installed taskset package, a built-in one, or
            ``vf-arith-v1``, the example shipped next to the runner).
        env_args: Fields of the taskset's config (``--env.taskset.*`` in ``vf-eval``).
        harness: The harness of the ``agent`` seat (default: the taskset's own, else ``null``,
            verifiers' tool-less chat loop).
        harness_args: Fields of that harness's config (with ``harness``).
        env_config: More of verifiers' ``[env]`` block, merged under the above (another
            env ``id``, other seats, ...).
        dataset: The tasks: rows ``{"index": i}`` (the taskset's i-th task) or rows of the
            taskset's task data (``prompt``, ``answer``, ...). Default: every task of the
            taskset, by index (counted once, in the venv).
        python: The venv's Python (default: ``$ENVHUB_VERIFIERS_V1_PYTHON``, else
            ``.venv-verifiers/bin/python``).
        reward_range: Bounds of verifiers' reward, when known (for ``envhub check``).
        max_turns: Model calls per episode; verifiers gets the same limit, so that it stops
            and scores the rollout itself.
        max_tokens: Tokens the policy may sample in the episode (a cut episode scores 0).
        timeout: Seconds the runner may take (starting the venv's Python included).
        tool_parser: How tool calls are read from the policy's text.

    Raises:
        MissingDependencyError: The venv is missing; the message gives the commands that make it.
    """

    name = "verifiers-v1"
    version = "0.1.0"
    reward_range = (float("-inf"), float("inf"))

    def __init__(
        self,
        env_id: str,
        env_args: Mapping[str, Any] | None = None,
        *,
        harness: str | None = None,
        harness_args: Mapping[str, Any] | None = None,
        env_config: Mapping[str, Any] | None = None,
        dataset: Sequence[dict[str, Any]] | None = None,
        python: str | os.PathLike[str] | None = None,
        reward_range: tuple[float, float] | None = None,
        max_turns: int | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        tool_parser: str | None = None,
    ) -> None:
        self.python = find_python(python)
        self.script = find_script()
        config: dict[str, Any] = json.loads(json.dumps(dict(env_config or {})))
        config["taskset"] = {**config.get("taskset", {}), **dict(env_args or {}), "id": env_id}
        if harness_args and harness is None:
            raise ValueError(f"{self.name}: harness_args needs harness= (the harness id)")
        if harness is not None:
            agent = config.setdefault("agent", {})
            agent["harness"] = {**dict(harness_args or {}), "id": harness}
        self.env_config = config
        if reward_range is not None:
            self.reward_range = (float(reward_range[0]), float(reward_range[1]))
        if dataset is None:
            dataset = [{"index": i} for i in range(self._count())]
        super().__init__(
            CommandProgram([str(self.python), str(self.script)]),
            dataset,
            rubric=VerifiersV1Rubric(),
            max_turns=max_turns,
            max_tokens=max_tokens,
            timeout=timeout,
            tool_parser=tool_parser,
        )

    def task_text(self, task: dict[str, Any]) -> str:
        """The runner's stdin: the env config, the turn limit, and the task's index or row."""
        spec: dict[str, Any] = {"env": self.env_config, "max_turns": self.max_turns}
        if set(task) == {"index"}:
            spec["index"] = int(task["index"])
        else:
            spec["row"] = task
        return json.dumps(spec)

    def format_prompt(self, task: dict[str, Any]) -> list[Message]:
        """The task as the runner gets it (the prompt verifiers makes of it is known only in
        the venv, when the harness calls)."""
        return [user(self.task_text(task))]

    def required_fields(self) -> list[RequiredField]:
        """None: a row is an index or the taskset's own task data, checked in the venv."""
        return []

    def _count(self) -> int:
        """The taskset's size, asked of the venv once per Python and config."""
        key = (str(self.python), json.dumps(self.env_config, sort_keys=True))
        if key not in _counts:
            try:
                done = subprocess.run(
                    [str(self.python), str(self.script), "--count"],
                    input=json.dumps({"env": self.env_config}),
                    capture_output=True,
                    text=True,
                    timeout=300,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                raise EnvLoadError(f"{self.name}: cannot count {self.env_id}'s tasks: {e}") from e
            if done.returncode != 0:
                raise EnvLoadError(
                    f"{self.name}: loading {self.env_id} in {self.python} failed: "
                    f"{done.stderr.strip()[-2000:]}"
                )
            try:
                _counts[key] = int(json.loads(done.stdout.strip().splitlines()[-1])["num_tasks"])
            except (ValueError, IndexError, KeyError, TypeError) as e:
                raise EnvLoadError(
                    f"{self.name}: counting {self.env_id}'s tasks printed {done.stdout[-300:]!r}"
                ) from e
        return _counts[key]

    @property
    def env_id(self) -> str:
        """The taskset id."""
        return str(self.env_config["taskset"]["id"])
