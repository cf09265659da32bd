"""Harbor registry files: a JSON file naming datasets of task folders, made as one env.

    envhub.make("registry.json")                  # its only dataset
    envhub.make("registry.json:my-tasks@1.0")     # one of several: NAME@VERSION, or NAME

The format is Harbor's: a JSON list of datasets, each ``{"name", "version", "description",
"tasks": [{"name", "path", "git_url", "git_commit_id"}, ...]}`` (other keys, such as
``metrics``, are not read). A task's ``path`` is resolved against the registry file's folder.
A task with a ``git_url`` is refused, with the commands that clone it: envhub fetches nothing
when it runs. The tasks keep their own names (``[task] name``, else their folder's).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envhub.errors import ConfigError, EnvLoadError, EnvNotFoundError
from envhub.harbor.task import is_task_folder


@dataclass(frozen=True)
class Dataset:
    """One dataset of a registry file, its tasks' folders found."""

    name: str
    version: str
    description: str
    folders: tuple[Path, ...]
    """Its tasks' folders, in the file's order."""

    @property
    def label(self) -> str:
        """``NAME@VERSION``, as a reference selects it."""
        return f"{self.name}@{self.version}"


def split_reference(reference: str) -> tuple[Path, str | None] | None:
    """``(file, selector)`` when ``reference`` names a registry file (an existing ``.json``
    file, with ``:NAME`` or ``:NAME@VERSION`` after it or not); else ``None``."""
    path = Path(reference)
    if path.suffix == ".json" and path.is_file():
        return path, None
    head, sep, selector = reference.rpartition(":")
    if sep and head.endswith(".json") and Path(head).is_file() and selector:
        return Path(head), selector
    return None


def read_dataset(reference: str) -> Dataset:
    """The dataset ``reference`` (``FILE``, ``FILE:NAME`` or ``FILE:NAME@VERSION``) selects.

    Raises:
        EnvLoadError: The file is no registry (the message says what is wrong), a task's path
            is no task folder, or a task is in a git repository (the message says how to
            clone it).
        ConfigError: No selector and the file has several datasets (the message lists them),
            or ``NAME`` alone matches several versions.
        EnvNotFoundError: No dataset of that name and version (the message lists those it has).
    """
    split = split_reference(reference)
    if split is None:
        raise EnvLoadError(f"{reference} is no registry file (FILE.json[:NAME[@VERSION]])")
    file, selector = split
    entry = _select(file, _read(file), selector)
    return _dataset(file, entry)


def _read(file: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise EnvLoadError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(data, list) or not data:
        raise EnvLoadError(f"{file} is no Harbor registry: it must be a JSON list of datasets")
    for i, entry in enumerate(data):
        if not isinstance(entry, dict) or not isinstance(entry.get("tasks"), list):
            raise EnvLoadError(f"{file}: dataset {i} must be an object with a list of tasks")
        for key in ("name", "version"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise EnvLoadError(f"{file}: dataset {i} has no {key} (a string)")
    return data


def _select(file: Path, data: list[dict[str, Any]], selector: str | None) -> dict[str, Any]:
    labels = [f"{d['name']}@{d['version']}" for d in data]
    if selector is None:
        if len(data) == 1:
            return data[0]
        raise ConfigError(f"{file} holds {len(data)} datasets; choose one: "
                          + ", ".join(f"{file}:{label}" for label in labels))  # fmt: skip
    name, _, version = selector.partition("@")
    found = [d for d in data if d["name"] == name and version in ("", d["version"])]
    if len(found) == 1:
        return found[0]
    if found:
        raise ConfigError(f"{file} has {len(found)} versions of {name}; choose one: "
                          + ", ".join(f"{file}:{name}@{d['version']}" for d in found))  # fmt: skip
    close = difflib.get_close_matches(selector, labels, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise EnvNotFoundError(f"{file} has no dataset {selector} (it has {', '.join(labels)}){hint}")


def _dataset(file: Path, entry: dict[str, Any]) -> Dataset:
    label = f"{entry['name']}@{entry['version']}"
    tasks = entry["tasks"]
    for i, task in enumerate(tasks):
        if not isinstance(task, dict) or not isinstance(task.get("path"), str):
            raise EnvLoadError(f"{file}: task {i} of {label} must be an object with a path")
    _refuse_git(file, label, [t for t in tasks if t.get("git_url")])
    folders = []
    for task in tasks:
        folder = file.parent / task["path"]
        if not is_task_folder(folder):
            raise EnvLoadError(f"{file}: task {task.get('name') or task['path']} of {label} is "
                               f"at {folder}, which is no task folder")  # fmt: skip
        folders.append(folder)
    if not folders:
        raise EnvLoadError(f"{file}: dataset {label} has no tasks")
    return Dataset(entry["name"], entry["version"], str(entry.get("description") or ""),
                   tuple(folders))  # fmt: skip


def _refuse_git(file: Path, label: str, remote: list[dict[str, Any]]) -> None:
    """Tasks in git repositories: refused, with the commands that fetch the first one."""
    if not remote:
        return
    first = remote[0]
    url, commit, path = first["git_url"], first.get("git_commit_id"), first["path"]
    checkout = f" && git -C tasks checkout {commit}" if commit else ""
    more = f" (and {len(remote) - 1} more)" if len(remote) > 1 else ""
    raise EnvLoadError(
        f"{file}: task {first.get('name') or path} of {label} is in a git repository "
        f"({url}){more}, and envhub fetches nothing when it runs. Clone it first: "
        f"`git clone {url} tasks{checkout}`, then name its folder (tasks/{path}), or write a "
        "registry file whose task paths point into the clone, without git_url"
    )
