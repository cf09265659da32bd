"""Each SDK default is written once (``envhub.defaults``) and read wherever it applies: the
trainer's config, the rollout runner, ``envhub.evaluate``, the CLI's options (episode timeouts
were 600 s in training and 900 s in evaluation; the default model was typed in four places)."""

from __future__ import annotations

import inspect
import socket

from envhub import defaults
from envhub.evaluation import evaluate
from envhub.rollout.runner import RolloutRunner


def _default(function: object, name: str) -> object:
    return inspect.signature(function).parameters[name].default


def test_the_timeouts_are_the_same_everywhere() -> None:
    from envhub.cli.eval import eval_command
    from envhub.trainer.config import RolloutConfig

    expected = (defaults.STEP_TIMEOUT_S, defaults.EPISODE_TIMEOUT_S)
    rollout = RolloutConfig()
    assert (rollout.step_timeout, rollout.episode_timeout) == expected
    for function in (RolloutRunner.__init__, evaluate):
        assert (
            _default(function, "step_timeout"),
            _default(function, "episode_timeout"),
        ) == expected
    options = [_default(eval_command, n) for n in ("step_timeout", "episode_timeout")]
    assert tuple(o.default for o in options) == expected  # typer's OptionInfo


def test_the_default_model_is_one_name() -> None:
    from envhub.cli.serve_model import DEFAULT_MODEL
    from envhub.inference.vllm_failures import SMALL_MODEL
    from envhub.trainer.config import ModelConfig
    from envhub.trainer.models import _ALIASES

    assert ModelConfig().name == SMALL_MODEL == defaults.DEFAULT_MODEL
    assert DEFAULT_MODEL == _ALIASES[defaults.DEFAULT_MODEL] == defaults.SMOLLM2_ID


def test_a_free_port_can_be_bound() -> None:
    port = defaults.free_port()
    with socket.socket() as sock:
        sock.bind((defaults.LOOPBACK, port))
        assert sock.getsockname()[1] == port
