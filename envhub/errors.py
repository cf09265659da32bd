"""Every exception envhub raises, in one tree.

    EnvhubError                      base class; the CLI prints its message as one line
    ├── ConfigError                  invalid arguments or configuration, found before work starts
    ├── EnvNotFoundError             no env by that name (the message suggests the nearest names)
    ├── EnvLoadError                 an env package is broken: entry point, import, constructor
    ├── EnvCheckError                ``check_env`` found a contract violation, ``audit_env`` a hack
    ├── ToolDefinitionError          a ``@tool`` function cannot become a tool (bad signature)
    ├── ToolArgumentError            the model's arguments do not fit a tool (a tool message)
    ├── ToolServerUnavailableError   an MCP tool server cannot be reached, or was lost mid-episode
    │                                (a ConnectionError: an infrastructure failure)
    ├── RewardDefinitionError        a reward function asks for an argument nobody can give
    ├── VerifierError                a task's verifier ran but left no reward (or a malformed one)
    ├── EngineError                  an inference engine failed
    │   ├── EngineUnavailableError   the server is unreachable or died (after retries)
    │   │   └── EngineStartError     a local vLLM server did not start: its cause, in one line
    │   └── WeightSyncError          after a weight sync, vLLM's logprobs differ from the trainer's
    ├── SandboxError                 a sandbox failed to run code (not the code failing in it)
    │   └── SandboxUnavailableError  no sandbox can run here: no bwrap, no user namespaces, no e2b
    ├── RemoteEnvError               a served env (``envhub serve``) refused a request, or raised
    │   └── RemoteEnvUnavailableError  server unreachable, connection dropped or session gone
    │                                  (a ConnectionError: an infrastructure failure)
    ├── HubError                     the Hub refused or failed a push, pull or install
    │   ├── HubAuthError             no token, or a token the Hub rejects, for a private or own repo
    │   ├── HubNotFoundError         no such repo or version (private ones hide without a token)
    │   ├── VersionConflictError     a version is already published with other content
    │   └── PackageIntegrityError    a download mismatches its recorded hashes, or is no env package
    ├── CheckpointError              a checkpoint is missing, incomplete or corrupt; says what to do
    ├── MissingDependencyError       an optional extra is needed; says what to install
    ├── WorkerError                  a Ray rank or rollout worker failed; names it and its node
    │   └── WorkerDiedError          its process died (crash, OOM kill, lost node)
    ├── WorkerGroupClosedError       a worker group was shut down or failed; start a new one
    ├── PlacementError               the Ray cluster did not grant the resources asked for in time
    └── NoLearningSignalError        training steps in a row had nothing to learn from; says why

The last seven are raised only by the trainer (``envhub.trainer``); they live here so that the
tree is whole and importable without torch. Errors raised *inside user code* (an env's step, a
tool, a reward function) while rolling out are not propagated: they are caught at that boundary
and recorded on the trajectory as an ``ErrorRecord``, and the batch goes on.

Not in the tree, on purpose: ``CaseTimeout`` in ``envhub.rewards.code_harness`` is a
``BaseException`` that never leaves the sandbox (the harness runs there on the standard library
alone, so that a solution's ``except Exception`` cannot swallow its timer); a per-case timeout
reaches the host as a case result. A call with a ``timeout`` that expires on a
``WorkerGroup`` raises the built-in :class:`TimeoutError`.
"""

from __future__ import annotations


class EnvhubError(Exception):
    """Base class of every envhub error."""


class ConfigError(EnvhubError, ValueError):
    """Invalid arguments or configuration."""


class EnvNotFoundError(EnvhubError, KeyError):
    """No environment is registered under the requested name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class EnvLoadError(EnvhubError):
    """An environment exists but could not be loaded or constructed."""


class EnvCheckError(EnvhubError):
    """An environment violates the env contract (``check_env``) or pays a degenerate policy
    (``audit_env``)."""


class ToolDefinitionError(EnvhubError, TypeError):
    """A function cannot be turned into a tool."""


class ToolArgumentError(EnvhubError, ValueError):
    """The model's arguments do not fit the tool's signature."""


class ToolServerUnavailableError(EnvhubError, ConnectionError):
    """The server behind a tool (an MCP server) cannot be reached, or its connection was lost.

    Not the model's doing, so the executor does not answer it as a tool message: the step
    raises, and the rollout runner records an infrastructure failure (a ``ConnectionError``).
    """


class RewardDefinitionError(EnvhubError, TypeError):
    """A reward function's signature cannot be satisfied."""


class VerifierError(EnvhubError):
    """A task's verifier (a Harbor task's ``tests/test.sh``) ran but left no usable reward."""


class EngineError(EnvhubError):
    """An inference engine returned an error or an unusable answer."""


class EngineUnavailableError(EngineError):
    """The inference server could not be reached, even after retries."""


class EngineStartError(EngineUnavailableError):
    """A local vLLM server exited (or hung) while starting.

    Args:
        summary: ``cause — what to do``, one line, read from the server's log.
        log_path: The server's whole log.
    """

    def __init__(self, summary: str, log_path: str) -> None:
        super().__init__(summary, log_path)  # both in args: the error pickles (Ray) whole
        self.summary = summary
        self.log_path = log_path

    def __str__(self) -> str:
        return f"{self.summary} (vLLM's full log: {self.log_path})"


class EngineDiedError(EngineUnavailableError):
    """A local inference server died under a request: its owner may start a new one."""


class WeightSyncError(EngineError):
    """vLLM's weights do not match the trainer's after a sync."""


class SandboxError(EnvhubError):
    """The sandbox itself failed; code that fails inside a sandbox is a result, not an error."""


class SandboxUnavailableError(SandboxError):
    """No sandbox of the requested kind can run on this machine.

    The message says how to get one.
    """


class RemoteEnvError(EnvhubError):
    """A served env refused a request or raised while handling it.

    Attributes:
        remote_type: The server's name for the error: the exception class the env raised
            (``ValueError``), or a protocol error kind (``bad_request``, ``unauthorized``).
    """

    def __init__(self, message: str, *, remote_type: str | None = None) -> None:
        super().__init__(message)
        self.remote_type = remote_type


class RemoteEnvUnavailableError(RemoteEnvError, ConnectionError):
    """The server of a remote env cannot be reached, the connection dropped, or it no longer
    holds the session (expired, or closed with its connection). A ``ConnectionError``, so the
    rollout runner records it as an infrastructure failure."""


class CheckpointError(EnvhubError):
    """A checkpoint is unusable: missing, interrupted mid-save, corrupt, or from another model."""


class HubError(EnvhubError):
    """A Hub operation (push, pull, install, search) failed."""


class HubAuthError(HubError):
    """The Hub needs a token that was not given, or rejected the one given."""


class HubNotFoundError(HubError, EnvNotFoundError):
    """No such repo or version on the Hub (a private repo looks missing without its token)."""


class VersionConflictError(HubError):
    """The version is already published with different content; bump the version."""


class PackageIntegrityError(HubError):
    """Downloaded files do not match the hashes recorded at push time or in the lock file."""


class MissingDependencyError(EnvhubError, ImportError):
    """An optional dependency is missing."""

    @classmethod
    def for_extra(cls, package: str, extra: str) -> MissingDependencyError:
        """The error for a missing ``package``, telling the user to install ``envhub[extra]``."""
        return cls(f"{package} is not installed; run `pip install 'envhub[{extra}]'`")


class WorkerError(EnvhubError, RuntimeError):
    """A Ray worker failed: a trainer rank or a rollout worker.

    The message says which; the Ray error is chained.

    Attributes:
        worker: The rank, or the rollout worker's index.
        node: The worker's node address.
    """

    def __init__(self, message: str, *, worker: int, node: str) -> None:
        super().__init__(message)
        self.worker = worker
        self.node = node


class WorkerDiedError(WorkerError):
    """A Ray worker's process died (see :class:`WorkerError`)."""


class WorkerGroupClosedError(EnvhubError, RuntimeError):
    """The worker group was shut down, or ended by a failure; start a new one."""


class PlacementError(EnvhubError, RuntimeError):
    """The cluster did not grant the resources the job asked for in time."""


class NoLearningSignalError(EnvhubError):
    """``algorithm.max_empty_steps`` training steps in a row kept no sample with a non-zero
    advantage; the message says why (e.g. every group tied at reward 0)."""
