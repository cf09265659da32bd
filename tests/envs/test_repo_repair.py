"""repo-repair: the generator is deterministic, every shipped project's bug fails its suite and
its fix passes it; the env scores with real pytest in real sessions, and cheats score 0."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from envhub.checks.checker import check_env
from envhub.checks.pytest_bundle import pytest_bundle
from envhub.envs.repo_bugs import DIFFICULTIES, TEMPLATES, make_project
from envhub.envs.repo_repair import _KEY_HUNT, CHEATS, LEVELS, SEEDS, RepoRepairEnv, read_verdict
from envhub.errors import ConfigError
from envhub.rollout.runner import RolloutRunner
from envhub.sandbox import LocalSandbox, bwrap_problem
from envhub.testing import ByteChatTokenizer, ScriptedEngine, null_policy

needs_sessions = pytest.mark.skipif(
    bwrap_problem() is not None or os.geteuid() != 0,
    reason="local sessions need bubblewrap and root",
)


def suite_results(files: dict[str, str], root: Path) -> tuple[int, int]:
    """(passed, failed) test functions of a project, run in this process (plain asserts)."""
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    sys.path.insert(0, str(root))
    passed = failed = 0
    try:
        for test_file in sorted((root / "tests").glob("test_*.py")):
            spec = importlib.util.spec_from_file_location(f"_suite_{test_file.stem}", test_file)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            for name in [n for n in vars(module) if n.startswith("test_")]:
                try:
                    getattr(module, name)()
                    passed += 1
                except AssertionError:
                    failed += 1
    finally:
        sys.path.remove(str(root))
        package = next(p.split("/")[0] for p in files if p.endswith("__init__.py"))
        for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
            del sys.modules[name]
    return passed, failed


def test_the_same_seed_gives_the_same_bytes() -> None:
    for difficulty in DIFFICULTIES:
        first, again = make_project(3, difficulty), make_project(3, difficulty)
        assert first == again and first.files == again.files
        assert make_project(4, difficulty).files != first.files
    assert make_project(0, 1).files["tests/test_pages.py"] == (
        "from juniper_01.pages import page_count\n\n\n"
        "def test_ragged_last_page():\n    assert page_count(52, 11) == 5\n\n\n"
        "def test_full_last_page():\n    assert page_count(44, 11) == 4\n\n\n"
        "def test_no_items():\n    assert page_count(0, 11) == 0\n"
    )
    packages = [make_project(s, d).package for d in DIFFICULTIES for s in SEEDS]
    assert len(set(packages)) == len(packages)  # the prompt names the package: one per task
    with pytest.raises(ValueError, match=r"difficulty must be one of \(1, 2, 3\), got 4"):
        make_project(0, 4)


def test_the_shipped_set_uses_every_template() -> None:
    used = {make_project(s, d).template for d in DIFFICULTIES for s in SEEDS}
    assert used == {t.__name__.lstrip("_") for ts in TEMPLATES.values() for t in ts}


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_every_planted_bug_fails_and_every_fix_passes(difficulty: int, tmp_path: Path) -> None:
    for seed in SEEDS:
        project = make_project(seed, difficulty)
        assert suite_results(project.correct_files, tmp_path / f"fix{seed}") == (
            project.test_count,
            0,
        )
        passed, failed = suite_results(project.files, tmp_path / f"bug{seed}")
        assert failed >= 1 and passed + failed == project.test_count
        assert len(project.plants) == (2 if difficulty == 3 else 1)
        if difficulty == 3:  # each bug alone still fails the suite: both edits are needed
            for i, plant in enumerate(project.plants):
                half = dict(project.files)
                half[plant.path] = project.correct_files[plant.path]
                assert suite_results(half, tmp_path / f"half{seed}-{i}")[1] >= 1


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"difficulties must be a non-empty subset"):
        RepoRepairEnv(difficulties=[4])


def test_levels_are_the_difficulties_alone() -> None:
    assert RepoRepairEnv.levels == ("one-bug", "helper-bug", "two-bugs") == tuple(LEVELS)
    for level, difficulty in LEVELS.items():
        env = RepoRepairEnv(level=level)
        assert (env.difficulties, env.current_level()) == ((difficulty,), level)
        assert [t["info"]["id"] for t in env.dataset] == [f"repo-{difficulty}-{s}" for s in SEEDS]
        assert {t["info"]["level"] for t in env.dataset} == {level}
    assert RepoRepairEnv(level="helper-bug").dataset[0] == {
        "question": "The test suite of the `quarry_02` package fails. Find the bug and fix the "
        "package so that every test passes. Do not change the tests.",
        "info": {"id": "repo-2-0", "seed": 0, "difficulty": 2, "level": "helper-bug"},
    }
    mixed = RepoRepairEnv()  # the default mix is no level; each task still records its own
    assert mixed.current_level() is None and len(mixed.dataset) == 60
    assert [mixed.dataset[i]["info"]["level"] for i in (0, 20, 40)] == list(LEVELS)
    assert RepoRepairEnv(difficulties=[3]).current_level() == "two-bugs"
    with pytest.raises(ConfigError, match="level must be one of one-bug, helper-bug, two-bugs"):
        RepoRepairEnv(level="1")
    with pytest.raises(ConfigError, match="either level or difficulties"):
        RepoRepairEnv(level="one-bug", difficulties=[1])


@pytest.fixture(scope="module")
def sandbox() -> Iterator[LocalSandbox]:
    bundle = pytest_bundle()
    binds = (str(bundle),) if bundle else ()
    with LocalSandbox(base_uid=61500, max_concurrency=4, warm=0, ro_binds=binds) as box:
        yield box


@needs_sessions
def test_the_reference_fix_wins_and_doing_nothing_loses(
    sandbox: LocalSandbox, tmp_path: Path
) -> None:
    def factory() -> RepoRepairEnv:
        return RepoRepairEnv(seeds=(0, 1), sandbox=sandbox)

    env = factory()
    for policy, expected in ((env.reference_policy, 1.0), (null_policy, 0.0)):
        runner = RolloutRunner(ScriptedEngine(policy, ByteChatTokenizer()), factory)
        trajectories = asyncio.run(runner.run(range(len(env.dataset))))
        assert [t.reward for t in trajectories] == [expected] * 6
        assert all(t.errors == [] for t in trajectories)
    # The share passing, as pytest in the session counted it, is what the buggy code passes.
    projects = [RepoRepairEnv.project(row) for row in env.dataset]
    assert [t.reward_components["tests_passed"] for t in trajectories] == [
        suite_results(p.files, tmp_path / str(i))[0] / p.test_count for i, p in enumerate(projects)
    ]


@needs_sessions
def test_repo_repair_passes_check_env(sandbox: LocalSandbox) -> None:
    report = check_env(RepoRepairEnv(seeds=(0,), sandbox=sandbox), seeds=(0, 1))
    assert report.passed, report.failures


@needs_sessions
@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_no_way_around_the_suite_scores(cheat: str, sandbox: LocalSandbox) -> None:
    env = RepoRepairEnv(seeds=(2,), difficulties=(1,), sandbox=sandbox)
    env.reset(seed=0, options={"task_index": 0})
    while env.state.stop_reason is None:
        _, reward, *_ = env.step(CHEATS[cheat](env.state.messages, env.tool_schemas))
    assert reward == 0.0 and env.state.errors == []
    env.close()


@needs_sessions
def test_forges_reach_the_runner_and_still_score_nothing(sandbox: LocalSandbox) -> None:
    """The in-process forges did run: the forged verdict line reached the runner's stdout (with
    a key that is not the run's), and the patched pytest passed every test; neither pays."""
    env = RepoRepairEnv(seeds=(2,), difficulties=(1,), sandbox=sandbox)
    count = RepoRepairEnv.project(env.dataset[0]).test_count
    seen = {}
    for cheat in ("package_forges_the_verdict_and_exits", "package_patches_pytest"):
        env.reset(seed=0, options={"task_index": 0})
        while env.state.stop_reason is None:
            _, reward, *_ = env.step(CHEATS[cheat](env.state.messages, env.tool_schemas))
        seen[cheat] = (
            reward,
            env.state.reward_components["tests_passed"],
            env.state.data["pytest"],
        )
    env.close()
    reward, share, output = seen["package_forges_the_verdict_and_exits"]
    assert (reward, share) == (0.0, 0.0)
    assert f'envhub-verdict {"0" * 32} {{"tests": {count},' in output
    reward, share, output = seen["package_patches_pytest"]
    assert (reward, share) == (0.0, 0.0)
    assert f"{count} passed" in output and '"patched": 1' in output


@needs_sessions
def test_the_key_hunt_finds_a_key_held_in_the_test_process(sandbox: LocalSandbox) -> None:
    """The hunt has teeth: run where the key sits in a frame of the process the repository's code
    runs in (as the runner once held it), it prints a verdict the verifier would take."""
    runner = (
        "import sys\n\n\ndef run(key):\n"
        "    exec(compile(open('cheat.py').read(), 'cheat.py', 'exec'), {})\n\n\n"
        "run(sys.stdin.readline().strip())\n"
    )
    tests = "def test_a():\n    pass\n\n\ndef test_b():\n    pass\n"
    key = secrets.token_hex(16)
    result = sandbox.run_python(
        runner, stdin=key + "\n", files={"cheat.py": _KEY_HUNT, "tests/test_ab.py": tests}
    )
    assert result.ok, result.stderr
    assert read_verdict(result.stdout, key) == {
        "tests": 2, "collect_errors": 0, "patched": 0, "passed": 2, "failed": 0, "skipped": 0,
    }  # fmt: skip


@needs_sessions
def test_the_key_hunt_runs_in_pytest_and_finds_nothing(sandbox: LocalSandbox) -> None:
    """Against the runner, the hunt runs (it ends pytest with status 0 before any test) and
    what it prints carries no key of the run: no verdict, no reward."""
    env = RepoRepairEnv(seeds=(2,), difficulties=(1,), sandbox=sandbox)
    env.reset(seed=0, options={"task_index": 0})
    while env.state.stop_reason is None:
        _, reward, *_ = env.step(CHEATS["package_hunts_the_key"](env.state.messages, None))
    output = env.state.data["pytest"]
    env.close()
    assert (reward, env.state.reward_components["tests_passed"]) == (0.0, 0.0)
    assert re.search(r"\d+ (passed|failed)", output) is None  # pytest's summary never came
