"""Issue 61's two measurements, each printed next to its goal:

1. ``envhub catalog`` for 200 env packages on the local Hub-API server (tests/hub/hub_server.py,
   the real ``huggingface_hub`` client): wall time (goal under 10 s on 2 cores) and the page's
   size. One package is pushed with its gates (so its card and manifest carry the check, the
   audit and the performance card) with a result on its leaderboard; the server then holds 199
   copies of that repo under other names, so every package is read as a real one is.
2. ``envhub install``'s guard for a package with 5 dependencies, all already satisfied (goal
   under 3 s): the environment's inspection (shadowing), the name check on pip's indexes and
   pip's dry run, each timed alone, offline (``--offline``: no index) and with the indexes pip
   is configured with here (the dry run and the name check ask them).

    .venv/bin/python bench/hub_catalog_guard.py [--packages 200]
"""

from __future__ import annotations

import argparse
import copy
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "hub"))

REPO = "alice/capital-cities"
DEPENDENCIES = ["packaging>=20", "pyyaml>=5", "tabulate>=0.8", "rich>=10"]
"""With the template's own (envhub), five requirements the venv this runs in satisfies."""


def measure(fn, runs: int = 3) -> str:
    """``"<wall> s (CPU <cpu> s)"``: medians over ``runs`` calls of ``fn``; CPU counts this
    process and its children (pip, the inspection), so it holds on a loaded machine."""
    times, cpus = [], []
    for _ in range(runs):
        cpu, started = _cpu(), time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
        cpus.append(_cpu() - cpu)
    return f"{statistics.median(times):.2f} s (CPU {statistics.median(cpus):.2f} s)"


def _cpu() -> float:
    usages = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usages)


def populate(server, tmp: Path, packages: int) -> None:
    """Push one checked package and a result of it, then copy its repo to ``packages`` in all."""
    from index_server import IndexServer

    from envhub.hub import push
    from envhub.hub.result_push import push_result
    from envhub.hub.results import build_result
    from envhub.scaffold import create_package

    package = create_package("capital-cities", directory=tmp / "src")
    index = IndexServer().start()  # the name check asks it, not PyPI
    os.environ["PIP_INDEX_URL"] = f"{index.url}/simple"
    try:
        commit = push(package, token="hf_alice", run_tests=False).commit
    finally:
        del os.environ["PIP_INDEX_URL"]
        index.stop()
    folder = eval_folder(tmp / "eval", package, commit)
    push_result(build_result(folder, repo_id=REPO, pushed_by="alice"), token="hf_alice")
    original = server.repos[("model", REPO)]
    for i in range(1, packages):
        repo = copy.deepcopy(original)
        repo.id = f"{REPO}-{i:03d}"
        server.repos[("model", repo.id)] = repo


def eval_folder(folder: Path, package: Path, commit: str) -> Path:
    """An eval of the package's env (4 tasks x 2 samples, its reference policy), as ``envhub
    eval`` saves it, pinned to ``commit``."""
    from test_results import eval_folder as play

    sys.path.insert(0, str(package))
    from capital_cities.env import solve

    return play(folder, package, "0.1.0", commit, solve)


def catalog_rows(tmp: Path) -> list[tuple[str, str, str]]:
    """The catalog's build time (median of 3) and its page's size."""
    from envhub.hub.catalog import write_catalog

    out = tmp / "catalog.html"
    seconds = measure(lambda: write_catalog(out))
    _, document = write_catalog(out)
    listed = len(document["packages"])
    return [
        (f"catalog of {listed} packages: build + write", seconds, "< 10 s"),
        ("catalog page size", f"{out.stat().st_size / 1000:.0f} kB", "-"),
    ]


def with_dependencies(tmp: Path) -> object:
    """A package with :data:`DEPENDENCIES`, pushed and pulled (what ``install`` guards)."""
    import re

    from envhub.hub import pull, push
    from envhub.scaffold import create_package

    package = create_package("guard-bench", directory=tmp / "src")
    pyproject = package / "pyproject.toml"
    text = pyproject.read_text()
    deps = ", ".join(f'"{d}"' for d in DEPENDENCIES)
    pyproject.write_text(re.sub(r"^dependencies = \[(.*)\]$", rf"dependencies = [\1, {deps}]",
                                text, flags=re.M))  # fmt: skip
    push(package, token="hf_alice", check=False)
    return pull("alice/guard-bench@0.1.0")


def guard_rows(tmp: Path) -> list[tuple[str, str, str]]:
    """The install guard for 5 satisfied dependencies, as ``install`` runs it (pip's dry run
    beside the inspection and the name check), offline and with the configured indexes; and
    its parts alone."""
    from functools import partial

    from envhub.hub import guard
    from envhub.hub.install import _guard
    from envhub.package import read_pyproject

    pulled, python = with_dependencies(tmp), sys.executable
    requirements = read_pyproject(pulled.folder)["project"]["dependencies"]
    modules = ["guard_bench"]
    inspect = measure(partial(guard.inspect, python, "guard-bench", modules))
    environment = guard.inspect(python, "guard-bench", modules)

    def names() -> None:
        indexes = guard.index.configured_indexes(python)
        guard.index_shadowing("alice/guard-bench", "guard-bench", modules, [], indexes)

    rows = [
        ("part: inspect the environment (shadowing)", inspect, ""),
        ("part: name check (pip config + indexes)", measure(names), ""),
    ]
    for label, offline in (("offline", True), ("configured indexes", False)):
        dry = measure(partial(guard.planned_changes, python, requirements, environment, offline))
        rows.append((f"part: pip dry run, {len(requirements)} satisfied, {label}", dry, ""))
    for label, offline in (("offline", True), ("configured indexes", False)):
        whole = measure(partial(_guard, pulled, python, "guard-bench", offline, False, True))
        rows.append((f"install's guard, {label}", whole, "< 3 s"))
    return rows


def main() -> None:
    """Run both measurements and print them beside their goals."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", type=int, default=200)
    args = parser.parse_args()
    from hub_server import HubServer

    tmp = Path(tempfile.mkdtemp(prefix="envhub-bench-"))
    server = HubServer({"alice": "hf_alice"}).start()
    os.environ.update(
        HF_ENDPOINT=server.url,
        HF_HOME=str(tmp / "hf"),
        ENVHUB_CACHE=str(tmp / "cache"),
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    os.chdir(tmp)
    try:
        populate(server, tmp, args.packages)
        rows = [*catalog_rows(tmp), *guard_rows(tmp)]
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    width = max(len(name) for name, _, _ in rows)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} CPUs, load average {load} (wall times grow with the load)")
    print(f"{'measure':<{width}}  {'value':>22}  goal")
    for name, value, goal in rows:
        print(f"{name:<{width}}  {value:>22}  {goal}")


if __name__ == "__main__":
    main()
