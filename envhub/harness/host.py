"""Run Python agent programs in a child process, beside the runner rather than under its GIL.

In the runner's process, every episode's program and its ``openai`` client share one
interpreter lock with the runner and the endpoint: at 64 concurrent episodes the clients' own
CPU (building requests, parsing replies: about half of a call's cost with the ``openai`` SDK,
``bench/harness_endpoint.py``) is served one call after another. A :class:`ProgramHost` is one
child process (started with ``spawn``: the runner's threads make ``fork`` unsafe) that runs
every program it is handed on its own event loop; a :class:`HostedProgram` sends it a program
and a launch and waits for the end. Only the start and the end of an episode cross the pipe:
the calls go from the child to the endpoint over HTTP, as from any program.

The program must pickle (a function defined at module level, not a lambda or a closure), and so
must what it returns. If the child dies, its episodes fail as ``crash`` (never a reward of 0),
and the next episode starts a new one; when the runner dies, the child sees its pipe close and
exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import pickle
import threading
from multiprocessing.connection import Connection
from typing import Any

from envhub.harness.mailbox import settle
from envhub.harness.programs import Launch, Program, ProgramError, ProgramResult


class ProgramHost:
    """The child process that runs this process's hosted programs (see the module doc)."""

    _shared: ProgramHost | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=serve, args=(child,), name="envhub-program-host", daemon=True
        )
        self._process.start()
        child.close()
        self._send_lock = threading.Lock()
        self._waiting: dict[int, asyncio.Future[ProgramResult]] = {}
        self._ids = itertools.count()
        self._reader = threading.Thread(
            target=self._read, name="envhub-program-host-reader", daemon=True
        )
        self._reader.start()

    @classmethod
    def shared(cls) -> ProgramHost:
        """This process's host, started on first use (and again if the last one died)."""
        with cls._lock:
            if cls._shared is None or not cls._shared.alive():
                cls._shared = cls()
            return cls._shared

    def alive(self) -> bool:
        """Whether the child process is running and its pipe open."""
        return self._process.is_alive() and self._reader.is_alive()

    async def run(self, program: Program, launch: Launch) -> ProgramResult:
        """Run ``program`` on ``launch`` in the child; cancelling this cancels it there.

        Raises:
            ProgramError: The program failed (its kind as in the parent), or the child died.
        """
        run_id = next(self._ids)
        ended: asyncio.Future[ProgramResult] = asyncio.get_running_loop().create_future()
        self._waiting[run_id] = ended
        try:
            # Pickled here, loaded by the child inside the run: a program the child cannot
            # import fails its own episode (``start``), not the host.
            self._send(("start", run_id, pickle.dumps((program, launch))))
            return await asyncio.shield(ended)
        except asyncio.CancelledError:
            self._send(("cancel", run_id))
            with contextlib.suppress(ProgramError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(ended), 10)  # until it has stopped
            raise
        finally:
            self._waiting.pop(run_id, None)

    def stop(self) -> None:
        """End the child (its programs are cancelled as it exits)."""
        with contextlib.suppress(OSError):
            self._conn.close()
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()

    def _send(self, message: tuple[Any, ...]) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except (OSError, ValueError) as e:
            raise ProgramError("crash", f"the program host is gone: {e}") from e

    def _read(self) -> None:
        """The reader thread: settle each run's future as its end arrives."""
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            future = self._waiting.get(message[1])
            if future is not None:
                settle(future, _outcome(message))
        self._process.join(timeout=5)
        code = self._process.exitcode
        for future in list(self._waiting.values()):
            settle(future, ProgramError("crash", f"the program host exited (status {code})"))


def _outcome(message: tuple[Any, ...]) -> ProgramResult | ProgramError:
    """A run's end as the child sent it."""
    if message[0] == "done":
        return ProgramResult(message[2], message[3])
    if message[0] == "cancelled":
        return ProgramError("crash", "the program was cancelled")
    return ProgramError(message[2], message[3])


def check_picklable(program: Program) -> None:
    """Raise a clear error now for a program the host could not be sent.

    Raises:
        TypeError: ``program`` (or what it holds) does not pickle.
    """
    try:
        pickle.dumps(program)
    except Exception as e:  # noqa: BLE001 - any pickling failure means the same to the user
        raise TypeError(
            f"{program.describe()} cannot run in the program host: it does not pickle ({e}). "
            "Define the function at module level (not a lambda or a closure), or run it in "
            "the runner's process (program_host='thread')"
        ) from e


# -- the child ----------------------------------------------------------------------------------


def serve(conn: Connection) -> None:
    """The child's main: run programs as the parent asks until its pipe closes."""
    from envhub.harness.endpoint import new_loop

    loop = new_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(_Host(conn).serve())
    finally:
        loop.close()


class _Host:
    """The child's side: a task per running program, each reporting its end on the pipe."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.tasks: dict[int, asyncio.Task[None]] = {}

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        closed = loop.create_future()
        loop.add_reader(self.conn.fileno(), self._readable, closed)
        await closed
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    def _readable(self, closed: asyncio.Future[None]) -> None:
        try:
            message = self.conn.recv()
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(self.conn.fileno())
            if not closed.done():
                closed.set_result(None)
            return
        if message[0] == "start":
            _, run_id, payload = message
            self.tasks[run_id] = asyncio.ensure_future(self._run(run_id, payload))
        elif message[0] == "cancel" and message[1] in self.tasks:
            self.tasks[message[1]].cancel()

    async def _run(self, run_id: int, payload: bytes) -> None:
        try:
            program, launch = _load(payload)
            result = await program.run(launch)
            reply: tuple[Any, ...] = ("done", run_id, result.output, result.exit_code)
        except asyncio.CancelledError:
            reply = ("cancelled", run_id)
        except ProgramError as e:
            reply = ("failed", run_id, e.kind, str(e))
        except Exception as e:  # noqa: BLE001 - a program's failure is reported, not raised
            reply = ("failed", run_id, "crash", f"{type(e).__name__}: {e}")
        finally:
            self.tasks.pop(run_id, None)
        try:
            self.conn.send(reply)
        except (OSError, ValueError):
            pass  # the parent is gone
        except Exception as e:  # noqa: BLE001 - e.g. a result that does not pickle
            why = f"its result could not be sent back ({type(e).__name__}: {e})"
            with contextlib.suppress(OSError, ValueError):
                self.conn.send(("failed", run_id, "crash", why))


def _load(payload: bytes) -> tuple[Program, Launch]:
    """A program and its launch, as the parent pickled them.

    Raises:
        ProgramError: They cannot be loaded here (``start``): e.g. the function's module is
            not importable in the child.
    """
    try:
        return pickle.loads(payload)
    except Exception as e:  # noqa: BLE001 - any failure to load means the program cannot start
        raise ProgramError(
            "start", f"the program host cannot load the program ({type(e).__name__}: {e})"
        ) from e


class HostedProgram:
    """A program run in the :class:`ProgramHost` instead of the runner's process."""

    def __init__(self, program: Program) -> None:
        check_picklable(program)
        self.program = program

    def describe(self) -> str:
        """The hosted program's line, and where it runs."""
        return f"{self.program.describe()} (in the program host)"

    async def run(self, launch: Launch) -> ProgramResult:
        """Run the program in the host (started on first use)."""
        return await ProgramHost.shared().run(self.program, launch)
