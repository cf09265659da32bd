"""What a ``RUN`` step would need, told from its text when a task loads.

:func:`check_run` refuses (:class:`~envhub.harbor.dockerfile.UnsupportedEnvironment`, naming the
Dockerfile's line) a step that can be told to need what a preparation session cannot give: an
``apt-get install`` of a package the host lacks, a ``pip install`` the sandbox's ``python3``
does not satisfy (:mod:`envhub.harbor.installs`), a download (``curl``/``wget`` of a URL,
``git clone`` of a remote), or an installer that fetches from the network (``npm install``,
``conda install``, ``cargo install``...), or a write outside the working folder and ``/tmp``
(``mkdir``, ``touch``, ``cp``, ``mv``, ``ln``, ``install``, ``tee`` of an absolute path, a
``>`` redirection). The step's text is split into simple commands
(``&&``, ``||``, ``;``, ``|``, subshells); words holding ``$`` or a command substitution cannot
be told and are left to the preparation, where the step fails or not.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from envhub.harbor.dockerfile import RunInstruction, UnsupportedEnvironment
from envhub.harbor.installs import (
    ADVICE,
    APT_TOOLS,
    PIP_TOOLS,
    apt_request,
    host_packages,
    missing_apt,
    pip_request,
)

INSTALLS_SCRIPT = Path(__file__).with_name("installs.py")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
_CONTROL = set("();|&")
_REDIRECT = set("<>&|")
_PREFIXES = {
    "sudo", "env", "exec", "command", "time", "nohup", "then", "do", "else", "if", "elif",
    "while", "until", "!", "{", "}",
}  # fmt: skip
_NETWORK_INSTALLERS = {
    "npm": {"install", "i", "ci", "add"}, "yarn": {"install", "add", ""}, "pnpm": {"install",
    "add", "i"}, "conda": {"install", "create"}, "mamba": {"install", "create"},
    "micromamba": {"install", "create"}, "cargo": {"install"}, "go": {"install", "get"},
    "gem": {"install"}, "pipx": {"install"}, "bundle": {"install"}, "composer": {"install"},
}  # fmt: skip
_LOCAL_HOSTS = ("://localhost", "://127.0.0.1", "://[::1]")
_WRITERS = {">", "mkdir", "touch", "cp", "mv", "ln", "install", "tee"}
_WRITABLE = ("/tmp/", "/dev/", "/sandbox/")


def check_run(step: RunInstruction, workdir: str) -> None:
    """Refuse ``step`` if its text shows it needs the network, a missing package, or writes
    outside the working folder ``workdir`` and ``/tmp``.

    Raises:
        UnsupportedEnvironment: What it needs, named with the step's line.
    """
    shell_form = len(step.argv) >= 2 and step.argv[-1] == step.text
    commands = simple_commands(step.text) if shell_form else [list(step.argv)]
    for words in commands:
        problem = _problem(words) or _writes_outside(words, workdir)
        if problem:
            raise UnsupportedEnvironment(f"{step.where}: RUN {_short(step.text)}: {problem}")


def _writes_outside(words: list[str], workdir: str) -> str | None:
    """Where a command that writes files (``mkdir``, ``cp``, ``> file``...) writes outside the
    working folder and ``/tmp`` (only those are writable here), or ``None``."""
    if not words or words[0] not in _WRITERS:
        return None
    paths = [w for w in words[1:] if not w.startswith("-")]
    if words[0] in ("cp", "mv", "ln", "install"):
        paths = paths[-1:]  # the destination
    writable = (workdir.rstrip("/") + "/", *_WRITABLE)
    for path in paths:
        if path.startswith("/") and "$" not in path and not (path + "/").startswith(writable):
            return (
                f"writes {path}, outside the working folder {workdir} and /tmp, the only "
                "folders a RUN step can write here (the host's system is read-only); write it "
                f"under {workdir}, or install it on this machine"
            )
    return None


def simple_commands(text: str) -> list[list[str]]:
    """The simple commands of a shell text, their leading ``NAME=value`` words dropped, each
    file an output redirection writes as a command ``[">", file]`` (empty when the text cannot
    be split, such as unbalanced quotes)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:
        return []
    commands: list[list[str]] = [[]]
    target: str | None = None  # after a redirection: "file" (written) or "skip"
    for token in tokens:
        if set(token) <= _CONTROL:
            commands.append([])
        elif set(token) <= _REDIRECT:  # `> file`, `2>&1`: neither is an argument
            if commands[-1] and commands[-1][-1].isdigit():
                commands[-1].pop()
            target = "file" if ">" in token and "&" not in token else "skip"
        elif target is not None:
            if target == "file":  # a command of its own: `>` writes the file
                commands.insert(-1, [">", token])
            target = None
        else:
            commands[-1].append(token)
    return [words for words in map(_command_words, commands) if words]


def _command_words(words: list[str]) -> list[str]:
    """A simple command's words from its command name on: variable assignments, shell
    keywords and wrappers (``sudo``, ``env``...) before it dropped."""
    index = 0
    while index < len(words) and (
        words[index] in _PREFIXES or ("=" in words[index] and words[index][0].isalpha())
    ):
        index += 1
    return words[index:]


def _problem(words: list[str]) -> str | None:
    """Why the simple command ``words`` cannot run here, or ``None`` (or not known)."""
    if not words or any("$" in w or "`" in w for w in words[:2]):
        return None
    tool, args = os.path.basename(words[0]), words[1:]
    if tool in APT_TOOLS:
        return _apt_problem(tool, args)
    pip_args = _pip_args(tool, args)
    if pip_args is not None:
        return _pip_problem(pip_args)
    if tool in ("curl", "wget"):
        url = next((w for w in args if "://" in w and not w.startswith(_LOCAL_HOSTS)), None)
        return f"downloads {url}, and there is no network here. {ADVICE}" if url else None
    if tool == "git" and args[:1] and args[0] in ("clone", "fetch", "pull", "submodule"):
        remote = next((w for w in args[1:] if "://" in w or w.startswith("git@")), None)
        return f"fetches {remote}, and there is no network here. {ADVICE}" if remote else None
    subcommands = _NETWORK_INSTALLERS.get(tool)
    first = next((w for w in args if not w.startswith("-")), "")
    if subcommands is not None and first in subcommands:
        return f"runs {tool} {first}, which fetches from the network, and there is none here."
    return None


def _apt_problem(tool: str, args: list[str]) -> str | None:
    subcommand, packages = apt_request(args)
    if subcommand != "install" or any("$" in p for p in packages):
        return None
    missing = missing_apt(packages, _host_packages())
    if not missing:
        return None
    names = [m.split(" ", 1)[0] for m in missing]
    return (
        f"{tool} install needs {', '.join(missing)}, and a RUN step cannot install packages "
        f"here (no network, the system read-only); install them on this machine "
        f"(apt-get install {' '.join(names)}) and load the task again"
    )


def _pip_args(tool: str, args: list[str]) -> list[str] | None:
    """The arguments after ``pip``, for ``pip``, ``pip3``, ``pip3.11``, ``python3 -m pip``,
    ``uv pip``; ``None`` for any other command."""
    if tool in PIP_TOOLS or (tool.startswith("pip3.") and tool[5:].isdigit()):
        return args
    if tool.startswith("python") and args[:2] == ["-m", "pip"]:
        return args[2:]
    if tool == "uv" and args[:1] == ["pip"]:
        return args[1:]
    return None


def _pip_problem(args: list[str]) -> str | None:
    subcommand = next((w for w in args if not w.startswith("-")), None)
    if subcommand != "install" or any("$" in w for w in args):
        return None
    rest = list(args)
    rest.remove("install")
    if any(w in ("-r", "--requirement") or w.startswith("--requirement=") for w in rest):
        return None  # the file may come from a copy or an earlier step: told at preparation
    requirements, problems = pip_request(rest)
    missing = problems + missing_in_sandbox(tuple(requirements))
    if not missing:
        return None
    return (
        f"pip install needs {'; '.join(missing)}, and a RUN step cannot install it here "
        f"(no network, the system read-only); install it for this machine's python3 "
        f"({shutil.which('python3', path=SYSTEM_PATH) or 'python3'} -m pip install ...), or "
        "vendor it in the task's environment/ folder and put it on PYTHONPATH"
    )


@functools.lru_cache(maxsize=256)
def missing_in_sandbox(requirements: tuple[str, ...]) -> list[str]:
    """The requirements the sandbox's ``python3`` (with the pytest bundle, as sessions run it)
    does not meet, each with why."""
    if not requirements:
        return []
    from envhub.workspace_env import default_command_env

    python = shutil.which("python3", path=SYSTEM_PATH)
    if python is None:
        return [f"{r} (there is no python3 on this machine)" for r in requirements]
    done = subprocess.run(
        [python, "-s", str(INSTALLS_SCRIPT), "check-pip", *requirements],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": SYSTEM_PATH, "LANG": "C.UTF-8", **default_command_env()},
    )
    if done.returncode != 0:
        return [f"{' '.join(requirements)} (could not ask python3: {done.stderr.strip()[-200:]})"]
    return [line for line in done.stdout.splitlines() if line.strip()]


@functools.lru_cache(maxsize=1)
def _host_packages() -> dict[str, str]:
    return host_packages()


def _short(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
