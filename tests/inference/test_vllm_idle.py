"""The vLLM plugin that shortens vLLM's idle spin (``envhub.inference.vllm_idle``)."""

from __future__ import annotations

import logging
import os

import pytest

from envhub.inference import vllm_idle
from envhub.inference.vllm_server import cpu_defaults

shm_broadcast = pytest.importorskip("vllm.distributed.device_communicators.shm_broadcast")


@pytest.fixture
def spin_default():
    init = shm_broadcast.SpinCondition.__init__
    saved = init.__defaults__
    yield lambda: init.__defaults__[0]
    init.__defaults__ = saved


def test_the_setting_becomes_the_spins_default(spin_default, monkeypatch):
    monkeypatch.setenv(vllm_idle.ENV, "0.01")
    vllm_idle.register()
    assert spin_default() == 0.01


def test_unset_or_malformed_leaves_vllm_as_it_is(spin_default, monkeypatch, caplog):
    monkeypatch.delenv(vllm_idle.ENV, raising=False)
    vllm_idle.register()
    assert spin_default() == 1

    monkeypatch.setenv(vllm_idle.ENV, "soon")
    with caplog.at_level(logging.WARNING):
        vllm_idle.register()
    assert spin_default() == 1
    assert "ENVHUB_VLLM_BUSY_LOOP_S='soon' is not a number of seconds" in caplog.text


def test_servers_envhub_starts_on_small_machines_get_the_short_spin():
    small = len(os.sched_getaffinity(0)) <= 8
    assert cpu_defaults().get(vllm_idle.ENV) == ("0.01" if small else None)
