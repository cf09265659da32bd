"""Compare `pip check` with the deliberate exclusions listed in scripts/pip_check_allowed.toml.

Run by scripts/install.sh at its end and by tests/test_pip_check.py. Prints each problem pip
reports that the file does not list, and each listed exclusion whose package is installed but
which pip no longer reports (a fixed conflict: drop it from the file); exits 1 on either.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ALLOWED_FILE = Path(__file__).with_name("pip_check_allowed.toml")

_MISSING = re.compile(r"^(?P<package>\S+) \S+ requires (?P<requirement>[A-Za-z0-9._-]+)")
_CONFLICT = re.compile(r"^(?P<package>\S+) \S+ has requirement (?P<requirement>[A-Za-z0-9._-]+)")
_PLATFORM = re.compile(r"^(?P<package>\S+) \S+ is not supported on this platform")


class Problem(NamedTuple):
    """One line of `pip check`, without versions: which package, what kind, which requirement."""

    package: str
    problem: str  # "missing", "conflict" or "platform"
    requirement: str = ""

    def __str__(self) -> str:
        if self.problem == "platform":
            return f"{self.package}: its wheel's tag is not this platform's"
        verb = "needs" if self.problem == "missing" else "conflicts on"
        return f"{self.package} {verb} {self.requirement} ({self.problem})"


def normalize(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_line(line: str) -> Problem:
    """The :class:`Problem` one `pip check` line reports.

    Raises:
        ValueError: The line is none of pip's three forms.
    """
    for kind, pattern in (("missing", _MISSING), ("conflict", _CONFLICT), ("platform", _PLATFORM)):
        match = pattern.match(line.strip())
        if match:
            found = match.groupdict()
            return Problem(
                normalize(found["package"]), kind, normalize(found.get("requirement") or "")
            )
    raise ValueError(f"unrecognised `pip check` line: {line!r}")


def pip_check(python: str = sys.executable, env: dict[str, str] | None = None) -> list[Problem]:
    """The problems `pip check` reports for the environment of ``python`` (run with ``env``)."""
    result = subprocess.run(
        [python, "-m", "pip", "check"], capture_output=True, text=True, check=False, env=env
    )
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    if result.returncode == 0:
        return []
    return [parse_line(line) for line in lines]


def load_allowed(path: Path = ALLOWED_FILE) -> dict[Problem, str]:
    """The listed exclusions and their reasons.

    Raises:
        ValueError: An entry lacks a field, names an unknown problem, or has no reason.
    """
    entries = tomllib.loads(path.read_text())["allowed"]
    allowed: dict[Problem, str] = {}
    for index, entry in enumerate(entries):
        where = f"{path.name}: allowed[{index}]"
        kind = entry.get("problem")
        if kind not in ("missing", "conflict", "platform"):
            raise ValueError(
                f"{where}: problem must be missing, conflict or platform, not {kind!r}"
            )
        if not entry.get("package") or not str(entry.get("reason", "")).strip():
            raise ValueError(f"{where}: every entry needs a package and a reason")
        if (kind == "platform") != ("requirement" not in entry):
            raise ValueError(f"{where}: give a requirement for missing/conflict entries only")
        key = Problem(normalize(entry["package"]), kind, normalize(entry.get("requirement", "")))
        if key in allowed:
            raise ValueError(f"{where}: {key} is listed twice")
        allowed[key] = entry["reason"]
    return allowed


def installed(package: str) -> bool:
    """Whether a distribution of that name is installed here."""
    try:
        importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def compare(
    reported: list[Problem], allowed: dict[Problem, str]
) -> tuple[list[Problem], list[Problem]]:
    """(problems reported but not listed, listed problems of installed packages not reported)."""
    unlisted = [problem for problem in reported if problem not in allowed]
    gone = [p for p in allowed if p not in reported and installed(p.package)]
    return unlisted, gone


def main() -> int:
    """Print the comparison; 1 when `pip check` and the file disagree."""
    allowed = load_allowed()
    reported = pip_check()
    unlisted, gone = compare(reported, allowed)
    for problem in unlisted:
        print(f"pip check: NEW {problem}: fix it, or list it with its reason in {ALLOWED_FILE}")
    for problem in gone:
        print(f"pip check: {problem} is fixed: drop it from {ALLOWED_FILE}")
    if unlisted or gone:
        return 1
    print(
        f"pip check: {len(reported)} unmet requirements, all deliberate "
        f"(reasons in {ALLOWED_FILE.relative_to(ALLOWED_FILE.parent.parent)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
