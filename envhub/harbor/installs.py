"""Package installs of a Dockerfile's ``RUN`` steps, checked against what this machine has.

A ``RUN`` step cannot install anything here (no network, the system read-only), but most of
them install what the host already has. This module reads the common forms and says whether
they are satisfied:

- ``apt-get`` / ``apt`` ``install PKG...`` (``PKG=VERSION`` and ``PKG:ARCH`` too): each package
  installed on the host (``dpkg-query``), at that version when one is named; ``update``,
  ``upgrade``, ``clean``, ``autoclean``, ``autoremove``, ``remove`` and ``purge`` leave the
  host's packages as they are (no-ops);
- ``pip`` / ``pip3`` / ``python3 -m pip`` ``install REQ...`` (``-r FILE`` too; ``-U`` and
  ``--upgrade`` read as a plain install): each distribution importable by the sandbox's
  ``python3``, at a version meeting its specifiers (``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``,
  ``~=``, ``===``, ``==X.*``; release numbers compared, pre-release tags ignored); a URL, a
  path or a local project (``.``, ``-e``) and an install elsewhere (``--target``, ``--prefix``)
  are not.

Two uses. envhub imports it to refuse, when a task loads, an install it can tell is not
satisfied (:mod:`envhub.harbor.build_check`). And it runs as a script inside the session that
prepares a workspace (:mod:`envhub.harbor.build`), standing in for ``apt-get``, ``apt``,
``pip``, ``pip3`` and ``python3 -m pip`` on the ``PATH``: a satisfied install prints what it
found and exits 0; anything else exits 1 with what to do. So it uses the standard library only.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata

APT_TOOLS = ("apt-get", "apt", "aptitude")
PIP_TOOLS = ("pip", "pip3")
APT_NO_OPS = {
    "update", "upgrade", "dist-upgrade", "full-upgrade", "clean", "autoclean", "autoremove",
    "remove", "purge",
}  # fmt: skip
_APT_VALUED = {"-o", "-t", "-c", "-a", "--option", "--target-release", "--config-file"}
_PIP_VALUED = {
    "-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--trusted-host",
    "--cache-dir", "--timeout", "--retries", "--proxy", "--log", "--python-version",
    "--platform", "--implementation", "--abi", "--progress-bar", "--root-user-action", "--src",
    "--upgrade-strategy", "-c", "--constraint", "--no-binary", "--only-binary", "-C",
    "--config-settings", "--global-option", "--build-option", "--report", "--python",
}  # fmt: skip
_PIP_ELSEWHERE = {"-t", "--target", "--prefix", "--root", "-e", "--editable"}
_PIP_FILES = {"-r", "--requirement"}
_REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;]*?)\s*(;.*)?$")
_SPECIFIER = re.compile(r"^\s*(===|==|!=|~=|<=|>=|<|>)\s*([^\s,]+)\s*$")


# -- apt ------------------------------------------------------------------------------------


def apt_request(args: list[str]) -> tuple[str | None, list[str]]:
    """(subcommand, packages) of ``apt-get``'s arguments (options and their values left out)."""
    words, subcommand, packages = iter(args), None, []
    for word in words:
        if word in _APT_VALUED:
            next(words, None)
        elif word.startswith("-"):
            continue
        elif subcommand is None:
            subcommand = word
        else:
            packages.append(word)
    return subcommand, packages


def installed_packages(listing: str) -> dict[str, str]:
    """Installed package -> version, from ``dpkg-query -W -f '${Package}\\t${Version}\\t
    ${db:Status-Abbrev}\\n'``."""
    found = {}
    for line in listing.splitlines():
        name, _, rest = line.partition("\t")
        version, _, status = rest.partition("\t")
        if status.startswith("ii"):
            found[name] = version
    return found


def host_packages() -> dict[str, str]:
    """The host's installed packages (empty where there is no ``dpkg-query``)."""
    try:
        done = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${db:Status-Abbrev}\n"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    except OSError:
        return {}
    return installed_packages(done.stdout)


def missing_apt(packages: list[str], installed: dict[str, str]) -> list[str]:
    """Those of ``packages`` (``apt-get install`` words) the host lacks, each with why."""
    missing = []
    for word in packages:
        spec = word.split("/", 1)[0]
        name, _, version = spec.partition("=")
        name = name.split(":", 1)[0]
        have = installed.get(name)
        if have is None:
            missing.append(f"{name} (not installed on this machine)")
        elif version and not _apt_version_matches(have, version):
            missing.append(f"{name}={version} (this machine has {have})")
    return missing


def _apt_version_matches(have: str, wanted: str) -> bool:
    if wanted.endswith("*"):
        return have.startswith(wanted[:-1])
    return have == wanted


# -- pip ------------------------------------------------------------------------------------


def pip_request(args: list[str], cwd: str = ".") -> tuple[list[str], list[str]]:
    """(requirements, problems) of ``pip install``'s arguments: the requirement strings (those
    of ``-r`` files read from ``cwd``), and what cannot be done here (a path, a URL, an install
    elsewhere, a missing requirements file)."""
    words, requirements, problems = iter(args), [], []
    for word in words:
        option, _, value = word.partition("=")
        if option in _PIP_FILES:
            path = value or next(words, "")
            requirements += _read_requirements(os.path.join(cwd, path), problems)
        elif option in _PIP_ELSEWHERE:
            target = value or next(words, "")
            problems.append(f"{option} {target} installs outside the sandbox's python3")
        elif option in _PIP_VALUED:
            if not value:
                next(words, None)
        elif word.startswith("-"):
            continue
        elif _REQUIREMENT.match(word) and "://" not in word and " @ " not in word:
            requirements.append(word)
        else:
            problems.append(f"{word} is a path or a URL, not a distribution")
    return requirements, problems


def _read_requirements(path: str, problems: list[str]) -> list[str]:
    try:
        with open(path, encoding="utf-8") as file:
            lines = [line.split(" #", 1)[0].strip() for line in file]
    except OSError as e:
        problems.append(f"cannot read {path}: {e.strerror}")
        return []
    words = []
    for line in lines:
        if line and not line.startswith("#"):
            words += line.split() if line.startswith("-") else [line]
    requirements, more = pip_request(words, os.path.dirname(path))
    problems += more
    return requirements


def missing_pip(requirements: list[str]) -> list[str]:
    """Those of ``requirements`` this Python's distributions do not meet, each with why."""
    missing = []
    for requirement in requirements:
        match = _REQUIREMENT.match(requirement)
        if match is None:
            missing.append(f"{requirement} (not a requirement envhub can read)")
            continue
        name, specifiers = match.group(1), match.group(3)
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(f"{name} (not installed for the sandbox's python3)")
            continue
        if not all(_meets(have, s) for s in specifiers.split(",") if s.strip()):
            missing.append(f"{requirement} (the sandbox's python3 has {name} {have})")
    return missing


def _release(version: str) -> tuple[int, ...]:
    """The release numbers of a version (``2.1.0rc1`` -> ``(2, 1, 0)``)."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()


def _padded(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    size = max(len(a), len(b))
    return a + (0,) * (size - len(a)), b + (0,) * (size - len(b))


def _meets(have: str, specifier: str) -> bool:
    match = _SPECIFIER.match(specifier)
    if match is None:
        return False
    op, wanted = match.groups()
    if op == "===":
        return have == wanted
    if wanted.endswith(".*") and op in ("==", "!="):
        prefix = _release(wanted[:-2])
        same = _release(have)[: len(prefix)] == prefix
        return same if op == "==" else not same
    mine, theirs = _padded(_release(have), _release(wanted))
    if op == "~=":
        head = _release(wanted)[:-1]
        return mine >= theirs and _release(have)[: len(head)] == head
    return {
        "==": mine == theirs, "!=": mine != theirs, "<": mine < theirs,
        "<=": mine <= theirs, ">": mine > theirs, ">=": mine >= theirs,
    }[op]  # fmt: skip


# -- as a script in the preparation session -------------------------------------------------

ADVICE = (
    "A Dockerfile's RUN steps run here in envhub's sandbox, without network and with the "
    "host's system read-only: install it on this machine, or vendor the files in the task's "
    "environment/ folder and COPY them."
)


def apt_main(tool: str, args: list[str], listing: str) -> int:
    """``apt-get`` in the preparation session: satisfied installs and no-ops exit 0."""
    subcommand, packages = apt_request(args)
    if subcommand in APT_NO_OPS:
        print(f"envhub: {tool} {subcommand}: skipped (the host's packages stay as they are)")
        return 0
    if subcommand != "install":
        print(f"envhub: {tool} {subcommand or ''} cannot run here. {ADVICE}", file=sys.stderr)
        return 1
    missing = missing_apt(packages, installed_packages(listing))
    if missing:
        print(f"envhub: {tool} install needs {', '.join(missing)}. {ADVICE}", file=sys.stderr)
        return 1
    print(f"envhub: {tool} install: {' '.join(packages)} already installed on this machine")
    return 0


def pip_main(args: list[str]) -> int:
    """``pip`` in the preparation session: ``install`` is checked; other subcommands run."""
    subcommand = next((w for w in args if not w.startswith("-")), None)
    if subcommand != "install":
        os.execv(sys.executable, [sys.executable, "-m", "pip", *args])
    rest = list(args)
    rest.remove("install")
    requirements, problems = pip_request(rest, os.getcwd())
    problems += missing_pip(requirements)
    if problems:
        print(f"envhub: pip install: {'; '.join(problems)}. {ADVICE}", file=sys.stderr)
        return 1
    print(f"envhub: pip install: {' '.join(requirements)} already installed for python3")
    return 0


def main(argv: list[str]) -> int:
    """``installs.py TOOL ARGS...`` (``TOOL``: apt-get, apt, pip, or ``check-pip REQ...`` to
    print the requirements not met, one a line)."""
    tool, args = argv[1], argv[2:]
    if tool == "check-pip":
        print("\n".join(missing_pip(args)))
        return 0
    if tool in APT_TOOLS:
        listing_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dpkg.txt")
        with open(listing_file, encoding="utf-8") as file:
            return apt_main(tool, args, file.read())
    return pip_main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
