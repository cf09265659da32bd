"""What installing an env package would change in the environment it goes into, found before
pip installs anything.

- **Shadowing**: the package's distribution name must not be that of an installed distribution
  (an earlier install from the same Hub repo aside: that is an update), and none of its
  top-level modules may be importable there already (the standard library, an installed
  distribution's module, anything else on ``sys.path``).
- **Known names** (``envhub.hub.index``): neither its distribution name nor a top-level module
  may be the name of another project on the package indexes pip installs from.
- **Dependency changes**: pip's own resolver, in dry-run/report mode and with the index settings
  the install uses, resolves the package's declared dependencies against that environment. An
  installed distribution it would upgrade, downgrade or reinstall is a change; changes are
  refused unless allowed. New distributions and satisfied requirements change nothing.

What it does not see: dependencies only a build computes (``setup.py``, ``dynamic``
dependencies), and build requirements (pip installs those in an isolated build environment).
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass, field
from typing import Any

from envhub.errors import ConfigError, EnvLoadError
from envhub.hub import index
from envhub.hub.provenance import source_of_url

_INSPECT = """
import importlib.util, json, os, re, sys
from importlib import metadata
ask = json.loads(sys.argv[1])
sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
dists = {}
for d in metadata.distributions():
    if d.metadata["Name"]:
        dists.setdefault(norm(d.metadata["Name"]), [d.metadata["Name"], d.version])
own = dists.get(norm(ask["distribution"]))
url = ""
if own:
    url = json.loads(metadata.distribution(own[0]).read_text("direct_url.json") or "{}")
    url = url.get("url", "")
found, owners = {}, None
for module in ask["modules"]:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    stdlib = module in sys.stdlib_module_names
    if stdlib or spec is not None:
        owners = metadata.packages_distributions() if owners is None else owners
        where = spec and (spec.origin or ", ".join(spec.submodule_search_locations or []))
        found[module] = {"stdlib": stdlib, "owners": owners.get(module, []), "at": where or ""}
envs = metadata.entry_points(group="envhub.envs")
envs = {ep.name: ep.dist.name if ep.dist else "" for ep in envs}
print(json.dumps({"dists": dists, "own_url": url, "modules": found, "envs": envs}))
"""


def normal(name: str) -> str:
    """A distribution name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Environment:
    """What an interpreter's environment holds, as far as an install can change it."""

    distributions: dict[str, tuple[str, str]]
    """``{normalized name: (name, version)}`` of every installed distribution."""
    own_url: str
    """The ``direct_url.json`` URL of the installed distribution named like the package."""
    modules: dict[str, dict[str, Any]]
    """The package's top-level modules that are importable already: ``stdlib``, ``owners``
    (distributions providing it), ``at`` (where it is found)."""
    envs: dict[str, str] = field(default_factory=dict)
    """``{env name: distribution}`` of every installed env."""


def inspect(python: str, distribution: str, modules: list[str]) -> Environment:
    """Ask ``python`` (in a subprocess, so it sees that environment as it is now) what it holds.

    Raises:
        ConfigError: The interpreter cannot be run or inspected.
    """
    ask = json.dumps({"distribution": distribution, "modules": modules})
    done = subprocess.run(
        [python, "-c", _INSPECT, ask], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise ConfigError(
            f"cannot inspect the Python environment of {python}: {done.stderr.strip()[-300:]}"
        )
    data = json.loads(done.stdout)
    dists = {key: (name, version) for key, (name, version) in data["dists"].items()}
    return Environment(dists, data["own_url"], data["modules"], data["envs"])


def top_level_modules(manifest: dict[str, Any], pyproject: dict[str, Any]) -> list[str]:
    """The modules a package puts at the top of ``sys.path``: its env entry points' modules,
    setuptools' ``packages``/``py-modules``, and folders with an ``__init__.py`` at the top or
    under ``src/`` (``tests`` aside)."""
    modules = {target.split(":")[0].split(".")[0] for target in manifest["envs"].values()}
    setuptools = pyproject.get("tool", {}).get("setuptools", {})
    for key in ("packages", "py-modules"):
        if isinstance(setuptools.get(key), list):
            modules |= {str(name).split(".")[0] for name in setuptools[key]}
    for name in manifest.get("files", {}):
        parts = name.split("/")
        parts = parts[1:] if parts[0] == "src" else parts
        if len(parts) == 2 and parts[1] == "__init__.py" and parts[0] not in ("tests", "test"):
            modules.add(parts[0])
    return sorted(modules)


def _owner(repo_id: str) -> str:
    return re.sub(r"\W", "_", repo_id.split("/")[0])


def shadowing(
    repo_id: str, distribution: str, environment: Environment, *, folder: str | None = None
) -> list[str]:
    """What the package would shadow in ``environment``, one line each (empty: nothing).

    ``folder``: the package's own folder, when ``environment`` is its author's (at push): there,
    a distribution of the package's name installed from a local folder (``pip install -e .``)
    and modules found in ``folder`` are the package itself.
    """
    owner = _owner(repo_id)
    problems = []
    installed = environment.distributions.get(normal(distribution))
    source = source_of_url(environment.own_url)
    local = folder is not None and source is None and environment.own_url.startswith("file:")
    if installed is not None and not local and (source is None or source[0] != repo_id):
        origin = f", installed from {source[0]}" if source else ""
        problems.append(
            f"its distribution name {distribution!r} is that of the installed "
            f"{installed[0]} {installed[1]}{origin} (rename [project] name, "
            f"e.g. to {f'{owner}-{distribution}'!r})"
        )
    for module, found in sorted(environment.modules.items()):
        if [normal(d) for d in found["owners"]] == [normal(distribution)] and not found["stdlib"]:
            continue  # an earlier install of this package
        if folder is not None and f"{found['at']}/".startswith(f"{folder.rstrip('/')}/"):
            continue  # the package's own folder, on the path of its author's environment
        if found["stdlib"]:
            what = "the standard library's"
        elif found["owners"]:
            what = f"the installed {', '.join(found['owners'])}'s"
        else:
            what = f"the importable ({found['at']})"
        problems.append(
            f"its module {module!r} would shadow {what} {module!r} "
            f"(rename it, e.g. to {f'{owner}_{module}'!r})"
        )
    return problems


def own_urls(repo_id: str, pyproject: dict[str, Any]) -> list[str]:
    """The URLs that make a project on an index this package's: its ``[project.urls]`` and its
    Hub repo's page (on huggingface.co and on the endpoint in use)."""
    from envhub.hub.client import endpoint

    urls = pyproject.get("project", {}).get("urls", {})
    listed = [str(u) for u in urls.values()] if isinstance(urls, dict) else []
    return [*listed, f"https://huggingface.co/{repo_id}", f"{endpoint()}/{repo_id}"]


def index_shadowing(
    repo_id: str, distribution: str, modules: list[str], own: list[str], indexes: list[str]
) -> tuple[list[str], list[str]]:
    """What the package would shadow on the package ``indexes``, one line each, and one line
    for each index that could not be asked (those block nothing)."""
    owner = _owner(repo_id)
    names = [distribution, *(m for m in modules if normal(m) != normal(distribution))]
    looked = index.lookup(names, indexes)
    problems = []
    for name in names:
        project = looked.found.get(name)
        if project is None or index.is_own(project, own):
            continue
        about = f"{project.name} on {project.index}" + (
            f" ({project.summary!r})" if project.summary else ""
        )
        yours = (
            ", or, if that project is yours, add one of its URLs to [project.urls]"
            if project.urls
            else ""
        )
        if name == distribution:
            problems.append(
                f"its distribution name {name!r} is another project's: {about} "
                f"(rename [project] name, e.g. to {f'{owner}-{name}'!r}{yours})"
            )
        else:
            problems.append(
                f"its module {name!r} would shadow the distribution {about} "
                f"(rename it, e.g. to {f'{owner}_{name}'!r}{yours})"
            )
    notes = [
        f"the package index {url} could not be asked ({why}); whether "
        f"{', '.join(map(repr, names))} {'is' if len(names) == 1 else 'are'} taken there "
        "was not checked"
        for url, why in looked.unreachable.items()
    ]
    return problems, notes


@dataclass(frozen=True)
class Change:
    """An installed distribution that installing a package would replace."""

    name: str
    installed: str
    planned: str

    @property
    def kind(self) -> str:
        """``upgrade``, ``downgrade`` or ``reinstall``."""
        from packaging.version import InvalidVersion, Version

        try:
            old, new = Version(self.installed), Version(self.planned)
        except InvalidVersion:
            return "reinstall" if self.installed == self.planned else "replace"
        return "upgrade" if new > old else "downgrade" if new < old else "reinstall"

    def __str__(self) -> str:
        return f"{self.name}: {self.installed} -> {self.planned} ({self.kind})"


def pip_options(offline: bool) -> list[str]:
    """The options every pip call of an install shares (the dry run's and the install's)."""
    options = ["--no-input", "--disable-pip-version-check", "--quiet"]
    return [*options, "--no-index", "--no-build-isolation"] if offline else options


class DryRun:
    """pip's resolver for ``requirements`` in the environment of ``python`` (dry-run/report
    mode), started at once in the background so that it runs while the rest of the guard
    does; :meth:`changes` waits for it, :meth:`cancel` stops it."""

    def __init__(self, python: str, requirements: list[str], offline: bool) -> None:
        self.python, self.requirements = python, requirements
        command = [python, "-m", "pip", "install", "--dry-run", "--report", "-"]
        self.process = (
            subprocess.Popen(
                [*command, *pip_options(offline), *requirements],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            if requirements
            else None
        )

    def changes(self, environment: Environment) -> list[Change]:
        """The installed distributions (of ``environment``) pip would replace.

        Raises:
            EnvLoadError: pip cannot resolve the requirements (the install would fail so).
        """
        if self.process is None:
            return []
        stdout, stderr = self.process.communicate(timeout=900)
        if self.process.returncode != 0:
            raise EnvLoadError(
                f"pip cannot resolve the dependencies ({', '.join(self.requirements)}) in the "
                f"environment of {self.python}, nothing installed: {stderr.strip()[-800:]}"
            )
        changes = []
        for item in json.loads(stdout).get("install", []):
            name, version = item["metadata"]["name"], item["metadata"]["version"]
            installed = environment.distributions.get(normal(name))
            if installed is not None:
                changes.append(Change(installed[0], installed[1], version))
        return sorted(changes, key=lambda c: normal(c.name))

    def cancel(self) -> None:
        """Stop pip if it is still running (a refusal came first)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


def planned_changes(
    python: str, requirements: list[str], environment: Environment, offline: bool
) -> list[Change]:
    """The installed distributions pip would replace to satisfy ``requirements`` for ``python``
    (:class:`DryRun`, waited for).

    Raises:
        EnvLoadError: pip cannot resolve the requirements (the install would fail the same way).
    """
    return DryRun(python, requirements, offline).changes(environment)
