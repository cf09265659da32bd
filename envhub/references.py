"""Env references: an env class named by where its code is, not by a registered name.

Three forms, taken everywhere an env name is (``envhub.make``, ``check``, ``eval``, ``train``,
``serve``):

- ``path/to/file.py:Class``: the class ``Class`` of that Python file;
- ``path/to/file.py``: the one :class:`~envhub.env.Env` subclass the file defines (with several,
  the error lists them), or, when it defines none, its one module-level env instance;
- ``module:Class``: the class of an importable module (``my_envs.lookup:LookupEnv``).

``Class`` may also name an env *instance* (``env = HarnessEnv(agent, tasks)``): each env made
from it is a deep copy of that instance (episodes run side by side, so they never share one;
its task rows, which nothing writes, are shared), of a class made for it that keeps its type's
attributes; it takes no arguments.

A file is imported once per process (again when it changes on disk), as a module of its own
whose folder is put on ``sys.path`` first, as ``python file.py`` would. Errors name the cause:
no such file or module, no such class (with the ones there are), a class that is no ``Env``,
or the exception the user's code raised, with the line of that code where it was raised.

An env loaded this way gets a stable name: the class's own ``name``, or, when it only inherits
envhub's default, the file's stem (``lookup_sum.py`` -> ``lookup_sum``).
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from envhub.errors import EnvLoadError, EnvNotFoundError

_IDENTIFIER = r"[A-Za-z_]\w*"
_DOTTED = rf"{_IDENTIFIER}(?:\.{_IDENTIFIER})*"
_MODULE_FORM = re.compile(rf"({_DOTTED}):({_DOTTED})")
_FILE_FORM = re.compile(rf"(.+\.py)(?::({_DOTTED}))?")
FILE_MODULES = "envhub_file_envs"
"""Package-like prefix of the modules that env files are imported as."""

_loaded_files: dict[Path, tuple[tuple[int, int], ModuleType]] = {}


@dataclass(frozen=True)
class EnvReference:
    """A parsed env reference (see the module docstring)."""

    text: str
    """The reference as written."""
    path: Path | None = None
    """The file, for the file forms."""
    module: str | None = None
    """The module, for ``module:Class``."""
    attr: str | None = None
    """The class's (dotted) name; ``None``: the file's only Env subclass."""

    @property
    def stem(self) -> str:
        """The file's stem, or the module's last part: the name of an env without its own."""
        if self.path is not None:
            return self.path.stem
        return str(self.module).rpartition(".")[2]


def parse_reference(text: str) -> EnvReference | None:
    """``text`` as an env reference, or ``None`` when it has none of the three forms (a
    registered name, a Hub reference, an adapted ``verifiers:NAME``, a URL, a task folder)."""
    if "://" in text:
        return None
    file_form = _FILE_FORM.fullmatch(text)
    if file_form:
        return EnvReference(text, path=Path(file_form[1]), attr=file_form[2])
    module_form = _MODULE_FORM.fullmatch(text)
    if module_form and not _is_adapted(text):
        return EnvReference(text, module=module_form[1], attr=module_form[2])
    return None


def _is_adapted(text: str) -> bool:
    from envhub.adapters import split_adapted

    return split_adapted(text) is not None


def load_reference(text: str | EnvReference) -> type:
    """The env class a reference names, imported (a file once, until it changes).

    Raises:
        EnvNotFoundError: No such file or module, or no such class in it.
        EnvLoadError: The user's code raised while importing (the message shows where), the
            attribute is no ``Env`` subclass, or a file alone defines none or several.
    """
    ref = parse_reference(text) if isinstance(text, str) else text
    if ref is None:
        raise EnvNotFoundError(f"{text!r} is no env reference (path/file.py:Class, module:Class)")
    module = _import_file(ref) if ref.path is not None else _import_module(ref)
    cls = _find_class(ref, module)
    _give_stable_name(cls, ref)
    return cls


def _import_file(ref: EnvReference) -> ModuleType:
    path = ref.path.expanduser().resolve() if ref.path else Path()
    if not path.is_file():
        where = "is a folder" if path.is_dir() else "does not exist"
        raise EnvNotFoundError(f"env file {ref.path} (in {ref.text!r}) {where}")
    stat = path.stat()
    version = (stat.st_mtime_ns, stat.st_size)
    cached = _loaded_files.get(path)
    if cached is not None and cached[0] == version:
        return cached[1]
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"{FILE_MODULES}.{_safe(path.stem)}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a .py file always has one
    module = importlib.util.module_from_spec(spec)
    if str(path.parent) not in sys.path:  # its sibling modules import as under `python file.py`
        sys.path.insert(0, str(path.parent))
    sys.modules[name] = module  # dataclasses and pickle look classes up by their module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        sys.modules.pop(name, None)
        raise _user_code_error(ref, path, e) from e
    _loaded_files[path] = (version, module)
    return module


def _safe(stem: str) -> str:
    return re.sub(r"\W", "_", stem) or "env"


def _import_module(ref: EnvReference) -> ModuleType:
    name = str(ref.module)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
            raise EnvNotFoundError(
                f"no module named {e.name!r} (in {ref.text!r}); is its folder the current one "
                "or on PYTHONPATH? A file is written path/to/file.py:Class"
            ) from None
        raise _user_code_error(ref, None, e) from e
    except BaseException as e:
        raise _user_code_error(ref, None, e) from e


def _user_code_error(ref: EnvReference, path: Path | None, error: BaseException) -> EnvLoadError:
    """The error raised while importing the user's code, where it was raised in that code."""
    where = _user_frame(error, path)
    return EnvLoadError(
        f"importing {ref.path or ref.module} (for {ref.text!r}) raised "
        f"{type(error).__name__}: {error}{where}"
    )


def _user_frame(error: BaseException, path: Path | None) -> str:
    """`` at FILE:LINE: CODE`` for the last frame in the user's file (any frame but envhub's
    and importlib's for a module), or the syntax error's own place."""
    if isinstance(error, SyntaxError) and error.filename:
        return f" at {error.filename}:{error.lineno}"
    frames = traceback.extract_tb(error.__traceback__)
    if path is not None:
        mine = [f for f in frames if Path(f.filename).resolve() == path]
    else:
        envhub_root = str(Path(__file__).resolve().parent)
        mine = [
            f
            for f in frames
            if not f.filename.startswith(envhub_root) and "importlib" not in f.filename
        ]
    if not mine:
        return ""
    frame = mine[-1]
    code = f": {frame.line.strip()}" if frame.line else ""
    return f" at {frame.filename}:{frame.lineno}{code}"


def _find_class(ref: EnvReference, module: ModuleType) -> type:
    where = ref.path or ref.module
    if ref.attr is None:
        return _only_env_class(ref, module)
    obj: Any = module
    for part in ref.attr.split("."):
        if not hasattr(obj, part):
            defined = ", ".join(_env_classes(module)) or "none"
            raise EnvNotFoundError(
                f"{where} has no {ref.attr!r} (in {ref.text!r}); the Env subclasses it defines: "
                f"{defined}"
            )
        obj = getattr(obj, part)
    if _is_env_instance(obj):
        return _instance_class(obj, module, ref.attr)
    if not _is_env_class(obj):
        kind = f"class {obj.__name__}" if inspect.isclass(obj) else type(obj).__name__
        raise EnvLoadError(
            f"{ref.attr} in {where} (in {ref.text!r}) is a {kind}, neither a subclass of "
            "envhub.Env nor an env instance"
        )
    return obj


def _only_env_class(ref: EnvReference, module: ModuleType) -> type:
    found = _env_classes(module)
    if len(found) == 1:
        return next(iter(found.values()))
    instances = _env_instances(module)
    if not found and len(instances) == 1:
        name, instance = next(iter(instances.items()))
        return _instance_class(instance, module, name)
    if not found and instances:
        choices = ", ".join(f"{ref.path}:{name}" for name in instances)
        raise EnvLoadError(
            f"{ref.path} defines {len(instances)} env instances; name one: {choices}"
        )
    if not found:
        raise EnvNotFoundError(
            f"{ref.path} defines no subclass of envhub.Env and no env instance; write one, or "
            f"name it: {ref.path}:Class"
        )
    choices = ", ".join(f"{ref.path}:{name}" for name in found)
    raise EnvLoadError(f"{ref.path} defines {len(found)} Env subclasses; name one: {choices}")


def file_env_classes(path: str | Path) -> dict[str, type]:
    """The concrete Env subclasses the file at ``path`` defines, by their references
    (``path:Class``); the file is imported as :func:`load_reference` imports it.

    Raises:
        EnvNotFoundError: No such file.
        EnvLoadError: The file's code raised (the message shows where).
    """
    ref = EnvReference(str(path), path=Path(path))
    module = _import_file(ref)
    classes = _env_classes(module)
    for cls in classes.values():
        _give_stable_name(cls, ref)
    return {f"{path}:{name}": cls for name, cls in classes.items()}


def _env_classes(module: ModuleType) -> dict[str, type]:
    """The concrete Env subclasses ``module`` defines itself (not the ones it imports)."""
    return {
        name: obj
        for name, obj in vars(module).items()
        if _is_env_class(obj) and obj.__module__ == module.__name__ and not inspect.isabstract(obj)
    }


def _is_env_class(obj: Any) -> bool:
    from envhub.env import Env

    return inspect.isclass(obj) and issubclass(obj, Env)


def _is_env_instance(obj: Any) -> bool:
    from envhub.env import Env

    return isinstance(obj, Env)


def _env_instances(module: ModuleType) -> dict[str, Any]:
    """The env instances ``module`` holds at its top level, by name."""
    return {name: obj for name, obj in vars(module).items() if _is_env_instance(obj)}


_instance_classes: dict[int, type] = {}
"""The class made for each instance (by ``id``; the instance lives in its cached module)."""


def _instance_class(template: Any, module: ModuleType, attr: str) -> type:
    """A class whose every construction is a deep copy of ``template`` (an env instance at
    ``module.attr``): ``file.py:env`` then works wherever ``file.py:Class`` does."""
    made = _instance_classes.get(id(template))
    if made is not None and made.__template__ is template:  # type: ignore[attr-defined]
        return made
    base = type(template)

    def __new__(cls: type, **kwargs: Any) -> Any:  # noqa: N807 - the class's constructor
        if kwargs:
            raise TypeError(
                f"{attr} is an env instance, made once by its file; it takes no arguments "
                f"(got {', '.join(kwargs)}); to pass some, name a class instead"
            )
        # The task rows are read, never written: shared, not copied (20k rows: 23 ms a copy).
        dataset = getattr(template, "dataset", None)
        shared = {} if dataset is None else {id(dataset): dataset}
        try:
            env = copy.deepcopy(template, shared)
        except Exception as e:
            raise TypeError(
                f"cannot copy the env instance {attr} for an episode ({type(e).__name__}: {e}); "
                f"write a subclass of {base.__name__} instead and name it"
            ) from e
        env.__class__ = cls
        return env

    def __init__(self: Any) -> None:  # noqa: N807 - the copy is already made
        """Made by ``__new__``, as a copy of the file's instance."""

    made = type(
        base.__name__,
        (base,),
        {
            "__new__": __new__,
            "__init__": __init__,
            "__module__": module.__name__,
            "__qualname__": attr,
            "__doc__": base.__doc__,
            "__template__": template,
        },
    )
    _instance_classes[id(template)] = made
    return made


def _give_stable_name(cls: type, ref: EnvReference) -> None:
    """An env class that only inherits envhub's default ``name`` is named after its file."""
    if cls.__module__.split(".")[0] == "envhub":
        return
    owner = next(c for c in cls.__mro__ if "name" in vars(c))
    if owner.__module__.split(".")[0] == "envhub":
        cls.name = ref.stem


def display_name(name: str) -> str:
    """The name to show and to name run folders by: a reference's env name (its class's
    ``name``, or the file's stem when it cannot be loaded), else ``name`` itself."""
    ref = parse_reference(name)
    if ref is None:
        return name
    try:
        return str(load_reference(ref).name)
    except Exception:  # the run fails on the reference soon after, with the cause
        return ref.stem


def reference_for(cls: type) -> str | None:
    """A reference that loads ``cls`` again in another process (``module:Class``, or
    ``file.py:Class`` for a class from a file or ``__main__``); ``None`` for a class defined in
    a function, which no reference reaches."""
    qualname = cls.__qualname__
    if "<locals>" in qualname:
        return None
    module = sys.modules.get(cls.__module__)
    source = getattr(module, "__file__", None)
    if cls.__module__.startswith(FILE_MODULES + ".") or cls.__module__ == "__main__":
        return f"{Path(source).resolve()}:{qualname}" if source else None
    return f"{cls.__module__}:{qualname}"
