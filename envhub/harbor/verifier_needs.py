"""What a task's verifier scripts fetch, read from their text: the part of the verifier
toolchain (:mod:`envhub.harbor.toolchain`) that a task needs when it loads (it refuses a line
the toolchain cannot answer offline before any episode)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from envhub.harbor.dockerfile import UnsupportedEnvironment

ADVICE = (
    "the verifier runs without the network; make the image hold what the tests need "
    "(a RUN step in the task's Dockerfile), or run the task where its container has the network"
)
_TOOLS = frozenset({"uv", "uvx", "pip", "pip3", "apt-get", "apt", "curl", "wget"})
_URL = re.compile(r"https?://\S+")
_REDIRECTION = re.compile(r"\d*(>>?|<|>&|<&)|&>>?")
"""A redirection operator alone (its file is the next word)."""
_REDIRECTION_WITH_TARGET = re.compile(r"(\d*(>>?|<|>&|<&)|&>>?)\S")
"""A redirection with its file or descriptor in the same word (``2>/dev/null``, ``2>&1``)."""
_UV_INSTALLER = re.compile(r"astral\.sh/uv/(\S*/)?install\.sh")


@dataclass(frozen=True)
class ScriptNeeds:
    """What a verifier script fetches, read from its text."""

    requirements: tuple[str, ...] = ()
    """Python requirements it installs (``-w``, ``uv add``, ``pip install``...)."""
    apt_packages: tuple[str, ...] = ()
    """Debian packages it ``apt-get install``s."""
    problems: tuple[str, ...] = ()
    """Lines the toolchain cannot answer (``FILE line N: ...: why``)."""
    uses: bool = False
    """Whether it runs anything the toolchain answers (uv, uvx, pip, apt-get, curl, wget)."""


def read_needs(scripts: dict[str, bytes], where: Path) -> ScriptNeeds:
    """What the shell scripts of ``scripts`` (the tests' ``*.sh``) fetch; ``where``: the
    tests' folder, for the messages."""
    requirements: list[str] = []
    packages: list[str] = []
    problems: list[str] = []
    uses = False
    for name, data in sorted(scripts.items()):
        if not name.endswith(".sh"):
            continue
        text = data.decode("utf-8", "replace")
        for number, line in _logical_lines(text):
            words = _words(line)
            uses = uses or bool(_TOOLS.intersection(words))
            requirements += _requirements(words)
            packages += _apt_packages(words)
            problem = _line_problem(line, words)
            if problem:
                problems.append(f"{where / name} line {number}: {line.strip()[:120]}: {problem}")
    return ScriptNeeds(tuple(dict.fromkeys(requirements)), tuple(dict.fromkeys(packages)),
                       tuple(problems), uses)  # fmt: skip


def check_offline(needs: ScriptNeeds) -> None:
    """Refuse a verifier the toolchain cannot run offline.

    Raises:
        UnsupportedEnvironment: Its first problem line, and what to do.
    """
    if needs.problems:
        more = f" (and {len(needs.problems) - 1} more)" if len(needs.problems) > 1 else ""
        raise UnsupportedEnvironment(f"{needs.problems[0]}{more}; {ADVICE}")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """``(first line number, line)`` with backslash continuations joined, comments out."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = pending + raw
        pending = ""
        if line.strip() and not line.lstrip().startswith("#"):
            out.append((start, line))
    return out


def _words(line: str) -> list[str]:
    """The line's words, its redirections (``2>/dev/null``, ``>&2``, ``< in``) left out: they
    name files, not packages."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        words = line.split()
    kept: list[str] = []
    target = False
    for word in words:
        if target:  # the file of a redirection written apart (`> out.txt`)
            target = False
        elif _REDIRECTION.fullmatch(word):
            target = True
        elif not _REDIRECTION_WITH_TARGET.match(word):
            kept.append(word)
    return kept


def _requirements(words: list[str]) -> list[str]:
    """Requirements named by ``-w``/``--with``, ``--from`` (``uvx --from PKG``), ``uv add``,
    ``uv pip install``, ``pip install``."""
    found: list[str] = []
    for i, word in enumerate(words):
        if word in ("-w", "--with", "--from") and i + 1 < len(words):
            found += words[i + 1].split(",")
        elif word.startswith(("--with=", "--from=")):
            found += word.split("=", 1)[1].split(",")
    for verb in (("uv", "add"), ("pip", "install"), ("pip3", "install")):
        found += _after(words, verb)
    return [r for r in found if r and not r.startswith(("-", ".", "/")) and "://" not in r]


def _after(words: list[str], verb: tuple[str, str]) -> list[str]:
    """The positional words after ``verb`` (``uv add X Y``), up to a shell operator."""
    for i in range(len(words) - 1):
        if tuple(words[i : i + 2]) == verb:
            out = []
            skip = False
            for word in words[i + 2 :]:
                if word in ("&&", "||", ";", "|"):
                    break
                if skip:
                    skip = False
                elif word in ("-r", "-c", "--python", "-p", "--index-url", "-i", "--target"):
                    skip = True
                elif not word.startswith("-"):
                    out.append(word)
            return out
    return []


def _apt_packages(words: list[str]) -> list[str]:
    for verb in (("apt-get", "install"), ("apt", "install")):
        if any(tuple(words[i : i + 2]) == verb for i in range(len(words) - 1)):
            return [w.split("=")[0] for w in _after(words, verb)]
    return []


def _line_problem(line: str, words: list[str]) -> str | None:
    """Why the toolchain cannot answer ``line`` offline (``None``: it can)."""
    if words and words[0] in ("curl", "wget") or "curl " in line or "wget " in line:
        for url in _URL.findall(line):
            if not _UV_INSTALLER.search(url):
                return f"downloads {url.rstrip(';|&)')}"
    if "git" in words and "clone" in words:
        remote = next((w for w in words if "://" in w or w.startswith("git@")), None)
        if remote:
            return f"clones {remote}"
    return None
