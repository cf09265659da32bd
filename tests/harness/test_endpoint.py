"""The recording endpoint itself: what it needs to start."""

from __future__ import annotations

import sys

import pytest

from envhub.errors import MissingDependencyError
from envhub.harness.endpoint import Endpoint


def test_a_missing_server_extra_fails_at_once_and_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if uninstalled: import raises
    with pytest.raises(MissingDependencyError, match=r"pip install 'envhub\[harness\]'"):
        Endpoint()
