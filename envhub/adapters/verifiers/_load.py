"""Importing verifiers' classic API, and its signal handlers off the main thread."""

from __future__ import annotations

import inspect
import signal
import threading
from typing import Any

from envhub.errors import MissingDependencyError


def _vf() -> Any:
    """``import verifiers as vf`` (the classic API), or say what to install."""
    try:
        import verifiers as vf

        vf.Environment  # noqa: B018 -- the classic API loads on first touch: fail here if absent
    except ImportError as e:
        raise MissingDependencyError.for_extra("verifiers", "verifiers") from e
    except AttributeError as e:
        raise MissingDependencyError(
            f"the installed verifiers ({getattr(vf, '__version__', '?')}) lacks its classic "
            f"environment API ({e}); run `pip install 'envhub[verifiers]'`"
        ) from e
    _allow_off_main_thread(vf)
    return vf


def _allow_off_main_thread(vf: Any) -> None:
    """verifiers' ``Environment.__init__`` installs SIGINT/SIGTERM handlers, which Python allows
    only on the main thread, and envhub makes envs in worker threads (the runner's pool). This
    gives verifiers' environment module a ``signal`` that installs handlers on the main thread
    and skips them elsewhere (its ``atexit`` teardown still runs). Scoped to that one module,
    idempotent; ``test_verifiers_still_installs_signal_handlers`` notices an upstream change."""
    module = inspect.getmodule(vf.Environment)
    if getattr(module, "signal", None) is signal:
        module.signal = _MainThreadSignals()


class _MainThreadSignals:
    """The ``signal`` module, except that ``signal()`` off the main thread does nothing."""

    def __getattr__(self, name: str) -> Any:
        return getattr(signal, name)

    def signal(self, signalnum: int, handler: Any) -> Any:
        """``signal.signal`` on the main thread; elsewhere the current handler, unchanged."""
        if threading.current_thread() is threading.main_thread():
            return signal.signal(signalnum, handler)
        return signal.getsignal(signalnum)


MODEL = "envhub"
"""The model name verifiers records on its state; envhub's runner knows the real sampler."""
