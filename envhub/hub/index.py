"""Whether a name is another project's on the package indexes pip installs from.

A Hub package named like a distribution on the index (PyPI, or the index pip is configured
with) shadows it: whoever installs both gets one of them, and a dependency on the index's is
satisfied by the Hub's. The indexes are pip's own settings (``index-url``, default PyPI's, and
``extra-index-url``, read with ``pip config list``); each is asked through its simple API
(PEP 503: ``<index>/<name>/``, 404 when there is no such project) and, for a project found, its
JSON API (``/pypi/<name>/json`` beside ``/simple``) for the project's URLs.

A project is this package's own when one of its URLs (home page, project URLs) is one of the
package's ``[project.urls]`` or its Hub repo's page: an env also published on PyPI under its
own name is not refused. An index that cannot be reached, or answers with an error, is reported
in one line and blocks nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

PYPI = "https://pypi.org/simple"
TIMEOUT = 5.0
"""Seconds one index request may take before that index counts as unreachable."""


def normal(name: str) -> str:
    """A distribution name as indexes and pip compare it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Project:
    """A project an index holds."""

    name: str
    index: str
    """The index URL it was found on."""
    summary: str = ""
    urls: tuple[str, ...] | None = None
    """Its home page and project URLs; ``None`` when the index does not say (no JSON API)."""


@dataclass(frozen=True)
class Lookup:
    """What the indexes said about some names."""

    found: dict[str, Project]
    """``{name asked: the project}`` for the names an index holds."""
    unreachable: dict[str, str]
    """``{index: why}`` of the indexes that could not be asked."""


def configured_indexes(python: str) -> list[str]:
    """The index URLs pip of ``python`` installs from (none when it is set to ``no-index``)."""
    done = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
    )
    settings = _pip_settings(done.stdout if done.returncode == 0 else "")
    if settings.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        return []
    main = settings.get("index-url") or PYPI
    return [main, *[u for u in settings.get("extra-index-url", "").split() if u != main]]


def _pip_settings(listing: str) -> dict[str, str]:
    """``pip config list``'s lines as pip applies them to ``pip install``: the ``global``
    section, then ``install``'s, then the environment's (``:env:``), each overriding."""
    by_section: dict[str, dict[str, str]] = {}
    for line in listing.splitlines():
        key, sep, value = line.partition("=")
        section, _, option = key.rpartition(".")
        if sep and option:
            by_section.setdefault(section, {})[option] = value.strip().strip("'\"")
    settings: dict[str, str] = {}
    for section in ("global", "install", ":env:"):
        settings.update(by_section.get(section, {}))
    return settings


def lookup(names: list[str], indexes: list[str], timeout: float = TIMEOUT) -> Lookup:
    """Ask every index about every name (concurrently); the first index holding a name wins."""
    asks = [(name, index) for name in dict.fromkeys(names) for index in indexes]
    if not asks:
        return Lookup({}, {})
    with ThreadPoolExecutor(max_workers=min(8, len(asks))) as pool:
        answers = list(pool.map(lambda ask: _ask(*ask, timeout), asks))
    found: dict[str, Project] = {}
    unreachable: dict[str, str] = {}
    for (name, index), answer in zip(asks, answers, strict=True):
        if isinstance(answer, Project):
            found.setdefault(name, answer)
        elif isinstance(answer, str):
            unreachable.setdefault(index, answer)
    return Lookup(found, unreachable)


def _ask(name: str, index: str, timeout: float) -> Project | str | None:
    """The project ``name`` on ``index``, ``None`` when it holds none, or why it cannot say."""
    parts = urlsplit(index)
    if parts.scheme == "file":
        root = Path(url2pathname(parts.path))
        if not root.is_dir():
            return f"no folder {root}"
        return Project(name, index) if (root / normal(name)).is_dir() else None
    try:
        _get(f"{index.rstrip('/')}/{normal(name)}/", timeout)
    except urllib.error.HTTPError as e:
        return None if e.code == 404 else f"HTTP {e.code}"
    except (OSError, ValueError) as e:
        return _reason(e)
    return _described(name, index, timeout)


def _described(name: str, index: str, timeout: float) -> Project:
    """The project with what the index's JSON API says of it (name, summary, URLs)."""
    base, _, simple = index.rstrip("/").rpartition("/")
    if simple != "simple":
        return Project(name, index)
    try:
        info = json.loads(_get(f"{base}/pypi/{normal(name)}/json", timeout))["info"]
    except (OSError, ValueError, KeyError, TypeError):
        return Project(name, index)
    urls = [info.get("home_page") or "", *(info.get("project_urls") or {}).values()]
    return Project(
        str(info.get("name") or name),
        index,
        str(info.get("summary") or ""),
        tuple(u for u in urls if u),
    )


def _get(url: str, timeout: float) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "envhub"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return bytes(answer.read())


def _reason(error: Exception) -> str:
    reason: Any = getattr(error, "reason", None) or error
    return str(reason).strip() or type(error).__name__


def same_url(a: str, b: str) -> bool:
    """True when two project URLs name the same page (scheme, ``www.``, case, a trailing
    ``/`` or ``.git`` aside)."""
    return _url_key(a) == _url_key(b)


def _url_key(url: str) -> str:
    parts = urlsplit(url.strip().lower())
    host = parts.netloc.removeprefix("www.")
    path = parts.path.rstrip("/").removesuffix(".git")
    return f"{host}{path}"


def is_own(project: Project, own_urls: list[str]) -> bool:
    """True when one of ``project``'s URLs is one of ``own_urls`` (see the module docstring)."""
    return any(same_url(u, own) for u in project.urls or () for own in own_urls if own)
