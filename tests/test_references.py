"""Env references (``path/file.py:Class``, ``path/file.py``, ``module:Class``): each form, each
error, the stable name, and that ``envhub.make`` takes them. The env files are written into
``tmp_path`` as a user writes them: no pyproject, no README, no tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import envhub
from envhub import loader
from envhub.errors import EnvLoadError, EnvNotFoundError
from envhub.references import (
    EnvReference,
    display_name,
    load_reference,
    parse_reference,
    reference_for,
)
from tests.file_envs import write_env_file

TWO_ENVS = """
from envhub.testing import LetterEnv


class Short(LetterEnv):
    name = "short"


class Long(LetterEnv):
    pass


def not_an_env():
    return 1


class Plain:
    pass
"""


@pytest.fixture
def env_file(tmp_path: Path, unload: list[str]) -> Path:
    """``lookup_sum.py`` (one env, two tools and a reward, no name or version) in tmp_path."""
    return write_env_file(tmp_path)


def write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(source)
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "a/b/lookup.py:LookupSum",
            EnvReference("a/b/lookup.py:LookupSum", Path("a/b/lookup.py"), None, "LookupSum"),
        ),
        ("lookup.py", EnvReference("lookup.py", Path("lookup.py"), None, None)),
        (
            "my_envs.lookup:Env.Inner",
            EnvReference("my_envs.lookup:Env.Inner", None, "my_envs.lookup", "Env.Inner"),
        ),
        ("arithmetic", None),
        ("owner/name@0.1.0", None),
        ("owner/name@0.1.0:env", None),
        ("verifiers:wordle", None),
        ("ws://127.0.0.1:8765/calculator", None),
        ("openenv:http://127.0.0.1:8000", None),
    ],
)
def test_parse_tells_references_from_other_names(text: str, expected: EnvReference | None) -> None:
    assert parse_reference(text) == expected


def test_a_file_and_class_loads_the_class_named_after_the_file(env_file: Path) -> None:
    cls = load_reference(f"{env_file}:LookupSum")
    assert (cls.__name__, cls.name, cls.version) == ("LookupSum", "lookup_sum", "0.0.0")
    assert load_reference(str(env_file)) is cls  # the file's only env; imported once
    with envhub.make(f"{env_file}:LookupSum") as env:
        assert (type(env) is cls, env.name) == (True, "lookup_sum")
        assert [t["function"]["name"] for t in env.tool_schemas] == ["lookup", "add"]


def test_a_relative_path_is_read_from_the_current_folder(
    env_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(env_file.parent)
    assert load_reference("lookup_sum.py:LookupSum").name == "lookup_sum"


def test_a_class_with_its_own_name_keeps_it(tmp_path: Path) -> None:
    path = write(tmp_path, "letters.py", TWO_ENVS)
    assert load_reference(f"{path}:Short").name == "short"
    assert load_reference(f"{path}:Long").name == "letters"  # only LetterEnv's: the file's stem
    assert display_name(f"{path}:Short") == "short"


def test_a_changed_file_is_imported_again(env_file: Path) -> None:
    first = load_reference(str(env_file))
    env_file.write_text(
        env_file.read_text().replace("default_max_turns = 4", "default_max_turns = 12")
    )
    second = load_reference(str(env_file))
    assert (first.default_max_turns, second.default_max_turns) == (4, 12)


def test_a_module_and_class(unload: list[str]) -> None:
    cls = load_reference("envhub.testing:LetterEnv")
    from envhub.testing import LetterEnv

    assert cls is LetterEnv and loader.get_spec("envhub.testing:LetterEnv").load() is LetterEnv
    with envhub.make("envhub.envs.arithmetic:ArithmeticEnv", difficulty="tiny") as env:
        assert env.name == "arithmetic"


def test_a_file_reference_is_no_hub_reference(env_file: Path) -> None:
    assert not loader.is_hub_reference(f"{env_file}:LookupSum")
    assert loader.is_hub_reference("owner/name@0.1.0")


@pytest.mark.parametrize(
    ("reference", "error", "message"),
    [
        (
            "{tmp}/missing.py:Env",
            EnvNotFoundError,
            "env file {tmp}/missing.py (in '{tmp}/missing.py:Env') does not exist",
        ),
        (
            "{tmp}/folder.py",
            EnvNotFoundError,
            "env file {tmp}/folder.py (in '{tmp}/folder.py') is a folder",
        ),
        (
            "{tmp}/letters.py:Nope",
            EnvNotFoundError,
            "{tmp}/letters.py has no 'Nope' (in '{tmp}/letters.py:Nope'); the Env subclasses it "
            "defines: Short, Long",
        ),
        (
            "{tmp}/letters.py:not_an_env",
            EnvLoadError,
            "not_an_env in {tmp}/letters.py (in '{tmp}/letters.py:not_an_env') is a function, "
            "neither a subclass of envhub.Env nor an env instance",
        ),
        (
            "{tmp}/letters.py:Plain",
            EnvLoadError,
            "Plain in {tmp}/letters.py (in '{tmp}/letters.py:Plain') is a class Plain, neither "
            "a subclass of envhub.Env nor an env instance",
        ),
        (
            "{tmp}/letters.py",
            EnvLoadError,
            "{tmp}/letters.py defines 2 Env subclasses; name one: {tmp}/letters.py:Short, "
            "{tmp}/letters.py:Long",
        ),
        (
            "{tmp}/empty.py",
            EnvNotFoundError,
            "{tmp}/empty.py defines no subclass of envhub.Env and no env instance; write one, or "
            "name it: {tmp}/empty.py:Class",
        ),
        (
            "no_such_module_here:Env",
            EnvNotFoundError,
            "no module named 'no_such_module_here' (in 'no_such_module_here:Env'); is its folder "
            "the current one or on PYTHONPATH? A file is written path/to/file.py:Class",
        ),
    ],
    ids=[
        "missing-file",
        "folder",
        "no-class",
        "function",
        "plain-class",
        "ambiguous",
        "no-env",
        "no-module",
    ],
)
def test_each_error_names_its_cause(
    tmp_path: Path, reference: str, error: type[Exception], message: str
) -> None:
    write(tmp_path, "letters.py", TWO_ENVS)
    write(tmp_path, "empty.py", "X = 1\n")
    (tmp_path / "folder.py").mkdir()
    with pytest.raises(error) as raised:
        load_reference(reference.format(tmp=tmp_path))
    assert str(raised.value) == message.format(tmp=tmp_path)
    with pytest.raises(error):  # envhub.make says the same
        envhub.make(reference.format(tmp=tmp_path))


def test_an_error_in_the_users_file_shows_their_line(tmp_path: Path) -> None:
    path = write(
        tmp_path, "broken.py", "import json\n\nPRICES = json.loads('{}')\nTOTAL = PRICES['apple']\n"
    )
    with pytest.raises(EnvLoadError) as raised:
        load_reference(f"{path}:Env")
    assert str(raised.value) == (
        f"importing {path} (for '{path}:Env') raised KeyError: 'apple' "
        f"at {path}:4: TOTAL = PRICES['apple']"
    )
    assert "broken" not in " ".join(m for m in sys.modules if m.startswith("envhub_file_envs"))


def test_a_syntax_error_shows_its_place(tmp_path: Path) -> None:
    path = write(tmp_path, "typo.py", "class Env(\n")
    with pytest.raises(EnvLoadError) as raised:
        load_reference(str(path))
    assert str(raised.value).startswith(f"importing {path} (for '{path}') raised SyntaxError: ")
    assert str(raised.value).endswith(f" at {path}:1")


def test_an_error_in_a_users_module_shows_their_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unload: list[str]
) -> None:
    write(tmp_path, "shop_envs.py", "from envhub.testing import LetterEnv\n\n1 / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    unload.append("shop_envs")
    with pytest.raises(EnvLoadError) as raised:
        load_reference("shop_envs:LetterEnv")
    assert str(raised.value) == (
        "importing shop_envs (for 'shop_envs:LetterEnv') raised ZeroDivisionError: division by "
        f"zero at {tmp_path}/shop_envs.py:3: 1 / 0"
    )


def test_reference_for_finds_the_class_again(env_file: Path) -> None:
    from envhub.testing import LetterEnv

    cls = load_reference(str(env_file))
    assert reference_for(cls) == f"{env_file.resolve()}:LookupSum"
    assert reference_for(LetterEnv) == "envhub.testing:LetterEnv"

    class Local(LetterEnv):
        pass

    assert reference_for(Local) is None


INSTANCES = """
from envhub.testing import LetterEnv

env = LetterEnv()
other = LetterEnv()
"""

ONE_INSTANCE = """
from envhub.testing import LetterEnv

env = LetterEnv()
env.marker = "b"
"""


def test_an_instance_makes_copies_of_itself_that_keep_its_type(tmp_path: Path) -> None:
    path = write(tmp_path, "one.py", ONE_INSTANCE)
    cls = load_reference(f"{path}:env")
    assert load_reference(str(path)) is cls  # the file's only env instance; made once
    from envhub.testing import LetterEnv

    template = sys.modules[cls.__module__].env
    with envhub.make(f"{path}:env") as first, envhub.make(str(path)) as second:
        assert first is not second and template not in (first, second)
        assert isinstance(first, LetterEnv) and type(first) is cls
        assert (first.name, first.marker, second.marker) == ("one", "b", "b")
        first.marker = "z"  # a copy of its own: the next episode's env is unchanged
        assert (second.marker, template.marker) == ("b", "b")
        assert first.dataset is second.dataset is template.dataset  # read-only rows: shared


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        (
            "{tmp}/two.py",
            "{tmp}/two.py defines 2 env instances; name one: {tmp}/two.py:env, {tmp}/two.py:other",
        ),
    ],
)
def test_several_instances_are_named_for_the_user(
    tmp_path: Path, reference: str, message: str
) -> None:
    write(tmp_path, "two.py", INSTANCES)
    with pytest.raises(EnvLoadError) as raised:
        load_reference(reference.format(tmp=tmp_path))
    assert str(raised.value) == message.format(tmp=tmp_path)


def test_an_instance_takes_no_arguments_and_one_that_cannot_be_copied_says_what_to_do(
    tmp_path: Path,
) -> None:
    path = write(
        tmp_path, "one.py", ONE_INSTANCE + "import threading\nenv.lock = threading.Lock()\n"
    )
    refused = (
        r"env is an env instance, made once by its file; it takes no arguments \(got max_turns\); "
        r"to pass some, name a class instead"
    )
    with pytest.raises(EnvLoadError, match=refused):
        envhub.make(f"{path}:env", max_turns=3)
    with pytest.raises(EnvLoadError, match=r"cannot copy the env instance env for an episode "
                       r"\(TypeError: cannot pickle '_thread.lock' object\); write a subclass of "
                       r"LetterEnv instead and name it"):  # fmt: skip
        envhub.make(f"{path}:env")
