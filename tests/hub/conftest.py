"""Fixtures of the Hub tests: a local Hub-API server, a local package index and a package made
by ``envhub init``.

The real ``huggingface_hub`` client is pointed at the server through ``HF_ENDPOINT``; envhub's
cache, the client's cache and the working folder (where ``envhub.lock`` is written) are per test.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from envhub.scaffold import create_package

# pytest runs with --import-mode=importlib, which puts no test folder on sys.path.
sys.path.insert(0, str(Path(__file__).parent))
from hub_server import HubServer  # noqa: E402
from index_server import IndexServer  # noqa: E402

ALICE, BOB = "hf_alice_write_token", "hf_bob_write_token"


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> Iterator[IndexServer]:
    """pip's index-url, on 127.0.0.1 (no project unless a test adds it): what the name check
    asks, instead of PyPI; pip finds other packages on its extra indexes and find-links."""
    server = IndexServer().start()
    monkeypatch.setenv("PIP_INDEX_URL", f"{server.url}/simple")
    yield server
    server.stop()


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index: IndexServer) -> Iterator[HubServer]:
    server = HubServer({"alice": ALICE, "bob": BOB}).start()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("ENVHUB_CACHE", str(tmp_path / "envhub-cache"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    yield server
    server.stop()


@pytest.fixture
def package(tmp_path: Path, unload: list[str]) -> Path:
    """A fresh ``envhub init`` package, ``capital-cities``; its module is forgotten afterwards."""
    unload.append("capital_cities")
    return create_package("capital-cities", directory=tmp_path / "src")
