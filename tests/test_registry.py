"""Finding and making envs by name, in-process registration, gymnasium ids."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium
import pytest

import envhub
from envhub import loader, registry
from envhub.env import SingleTurnEnv
from envhub.envs.calculator import CalculatorEnv
from envhub.errors import EnvLoadError, EnvNotFoundError


class Tiny(SingleTurnEnv):
    name = "tiny"

    def __init__(self, size: int = 2, *, label: str = "x") -> None:
        super().__init__([{"question": f"{label}{i}", "answer": str(i)} for i in range(size)])


@pytest.fixture
def clean_registry() -> Iterator[None]:
    before = dict(registry._registered)
    yield
    for name in set(registry._registered) - set(before):
        gymnasium.registry.pop(f"envhub/{name}", None)
    registry._registered.clear()
    registry._registered.update(before)


def test_make_builds_a_builtin_env_with_arguments() -> None:
    env = envhub.make("calculator", num_tasks=3, max_turns=2)
    assert isinstance(env, CalculatorEnv)
    assert (len(env.dataset), env.max_turns) == (3, 2)
    assert "calculator" in envhub.list_envs()


def test_unknown_names_suggest_the_nearest() -> None:
    with pytest.raises(EnvNotFoundError) as info:
        envhub.make("calcultor")
    message = str(info.value)
    assert message.startswith(
        "no env named 'calcultor'. Did you mean 'calculator', 'calculator-agent'? "
        "Run `envhub list` to see all "
    )
    assert message.endswith(" envs.")
    with pytest.raises(EnvNotFoundError) as info:
        envhub.make("zzzzzzzz")
    assert "Did you mean" not in str(info.value)


# Hub references (owner/name@rev) are resolved by envhub.hub: see tests/hub/test_make.py.


def test_the_registry_imports_nothing_from_the_hub() -> None:
    """The loader sits above both; ``envhub.hub`` imports the registry, never the other way."""
    imported: list[str] = []  # at any depth; `from envhub import hub` and `from . import hub` too
    for node in ast.walk(ast.parse(Path(registry.__file__).read_text())):
        if isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = ".".join(["envhub"] * bool(node.level) + [node.module or ""]).strip(".")
            imported += [module, *(f"{module}.{alias.name}" for alias in node.names)]
    assert "envhub.errors" in imported  # the walk sees the imports
    assert [m for m in imported if m == "envhub.hub" or m.startswith("envhub.hub.")] == []


def test_make_is_the_loader_and_the_registry_is_local_only() -> None:
    assert envhub.make is loader.make
    count = len(registry.list_envs())
    with pytest.raises(EnvNotFoundError) as info:
        registry.make("someone/mystery-env@v1")  # no Hub lookup: an unknown local name
    assert str(info.value) == (
        f"no env named 'someone/mystery-env@v1'. Run `envhub list` to see all {count} envs."
    )


def test_get_spec_of_a_hub_reference_says_to_install_it() -> None:
    installed = ", ".join(sorted(registry.list_envs()))
    with pytest.raises(EnvNotFoundError) as info:
        loader.get_spec("someone/mystery-env@v1")
    assert str(info.value) == (
        "'someone/mystery-env@v1' looks like a Hub reference (owner/name[@version]); no installed "
        "env has that name. Install the package first, then use its env name. "
        f"Installed: {installed}"
    )
    assert loader.get_spec("calculator") is registry.get_spec("calculator")
    with pytest.raises(EnvNotFoundError, match=r"^no env named 'calcultor'. Did you mean 'calc"):
        loader.get_spec("calcultor")


def test_make_of_a_local_env_leaves_the_hub_client_unloaded() -> None:
    result = _python(
        "import sys, envhub\n"
        "envhub.make('arithmetic')\n"
        "print(sorted(m for m in ('huggingface_hub', 'envhub.hub') if m in sys.modules))"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]"]


def test_unknown_arguments_list_the_accepted_ones(clean_registry: None) -> None:
    envhub.register("tiny", Tiny)
    with pytest.raises(EnvLoadError) as info:
        envhub.make("tiny", sise=3)
    assert str(info.value) == "env 'tiny' does not accept 'sise'; it accepts: size, label"


def test_unknown_arguments_to_an_env_that_forwards_kwargs_list_the_whole_chain() -> None:
    with pytest.raises(EnvLoadError) as info:
        envhub.make("calculator", num_task=3)
    assert str(info.value) == (
        "env 'calculator' failed to construct: "
        "TypeError: TaskEnv.__init__() got an unexpected keyword argument 'num_task'; "
        "it accepts: num_tasks, task_seed, tool_call_reward, demonstration, level, tools, "
        "tool_parser, tool_timeout, dataset, rubric, system_prompt, max_turns, max_tokens"
    )


def test_register_override_and_gymnasium_ids(clean_registry: None) -> None:
    envhub.register("tiny", Tiny)
    assert envhub.make("tiny", size=3).dataset[2] == {"question": "x2", "answer": "2"}
    with pytest.raises(
        EnvLoadError,
        match=r"^an env named 'tiny' is already registered; pass override=True to replace it$",
    ):
        envhub.register("tiny", Tiny)
    envhub.register("tiny", lambda: Tiny(5, label="y"), override=True)
    assert len(envhub.make("tiny").dataset) == 5
    env = gymnasium.make("envhub/tiny")
    assert isinstance(env.unwrapped, Tiny) and len(env.unwrapped.dataset) == 5
    with pytest.raises(EnvLoadError, match="already registered"):
        envhub.register("calculator", Tiny)


def test_a_name_gymnasium_cannot_parse_still_works_with_make(clean_registry: None) -> None:
    envhub.register("team/odd name", Tiny)  # must not raise: entry points are registered on import
    assert isinstance(envhub.make("team/odd name"), Tiny)
    assert "envhub/team/odd name" not in gymnasium.registry


def test_string_targets_load_lazily_and_broken_ones_say_why(clean_registry: None) -> None:
    envhub.register("calc-alias", "envhub.envs.calculator:CalculatorEnv")
    assert isinstance(envhub.make("calc-alias", num_tasks=2), CalculatorEnv)
    envhub.register("broken", "envhub.envs.no_such_module:Env")
    with pytest.raises(EnvLoadError) as info:
        envhub.make("broken")
    assert str(info.value) == (
        "cannot load env 'broken' from envhub.envs.no_such_module:Env: "
        "ModuleNotFoundError: No module named 'envhub.envs.no_such_module'"
    )


def test_a_constructor_that_raises_is_a_load_error(clean_registry: None) -> None:
    def factory(**kwargs: Any) -> Tiny:
        raise RuntimeError("missing data file")

    envhub.register("fails", factory)
    with pytest.raises(
        EnvLoadError, match=r"^env 'fails' failed to construct: RuntimeError: missing data file$"
    ):
        envhub.make("fails")


def test_not_found_is_a_key_error_with_a_readable_message() -> None:
    error = EnvNotFoundError("no env named 'x'")
    assert isinstance(error, KeyError) and str(error) == "no env named 'x'"


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_gymnasium_make_works_after_import_envhub() -> None:
    result = _python(
        "import gymnasium, envhub\n"
        "env = gymnasium.make('envhub/calculator', num_tasks=2)\n"
        "print(type(env.unwrapped).__name__, len(env.unwrapped.dataset))"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["CalculatorEnv", "2"]


def test_gymnasium_make_works_when_gymnasium_is_imported_after_envhub() -> None:
    result = _python(
        "import envhub, sys\n"
        "assert 'gymnasium' not in sys.modules  # import envhub stays light\n"
        "import gymnasium\n"
        "print(type(gymnasium.make('envhub/calculator').unwrapped).__name__)"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["CalculatorEnv"]
