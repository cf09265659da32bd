"""``repo-repair``: fix a planted bug in a small Python repository, with terminal tools.

Each task is a project from :mod:`envhub.envs.repo_bugs` (a package, its pytest suite, one
planted bug; difficulty 1 to 3), generated on the fly from a fixed list of seeds, so nothing is
downloaded or stored. Each difficulty alone is a level (``level=``, :data:`LEVELS`), which a
training curriculum moves between. The model works in the repository through ``bash``,
``view``, ``create`` and ``str_replace`` (:class:`~envhub.workspace_env.WorkspaceEnv`) and ends
the episode by answering without a tool call.

Reward: 1.0 when the whole suite passes, else 0 (``all_tests_pass``): a pass rate would pay for
the tests the buggy code already passes. The share of tests passing is reported as a weight-0
component (``tests_passed``). Before pytest runs, every process the model left running is
killed and the suite is restored from the generator (edits to ``tests/`` gain nothing); pytest
runs isolated from the workspace's own configuration (envhub's config file, ``conftest.py``
files ignored, no plugin found by entry point, ``sitecustomize`` and the current folder not
imported before pytest starts).

**Where the verdict comes from.** No file in the workspace: a trusted runner
(:data:`_RUN_PYTEST`) reads a fresh random key from its stdin, makes itself undumpable (no
process of its uid may read its memory, trace it or open its files through ``/proc``), and runs
pytest in a process of its own (:data:`_RUN_TESTS`) that never receives the key. That process
counts the outcomes with a plugin of its own and writes them to a pipe only the runner reads;
the runner passes pytest's output on, stops reading it when pytest exits, and prints the key
and the counts as its last line, with pytest's exit status. Only a run that exits 0 with that
line, counting the suite's tests, all passed, pays. The repository's code runs in pytest's
process, where there is no key to find (in its objects, frames or modules, nor in the runner
above it): a verdict line it prints and an early ``os._exit(0)`` score 0, as do the other
:data:`CHEATS` (the reward audit runs them).

What is left: code in pytest's process can still change what pytest reports, as any code in
a test run can. envhub counts replaced pytest functions (a run with any pays nothing), and a
report is read only as the one line the plugin writes; code written against this runner's own
protocol (writing that one line itself to the runner's pipe, then exiting) could still forge a
pass. Nothing in the workspace points there: the model would have to know envhub's source.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from envhub.envs.repo_bugs import DIFFICULTIES, Project, make_project
from envhub.errors import ConfigError
from envhub.sandbox.base import WORKDIR
from envhub.sandbox.session import Session
from envhub.state import State
from envhub.tools.prompt import tool_call_block
from envhub.types import Message
from envhub.workspace_env import WORKSPACE_PROMPT, Verdict, WorkspaceEnv

SEEDS = tuple(range(20))
"""Seeds of the shipped task set: 20 projects per difficulty."""
VERDICT = "envhub-verdict"
"""The first word of the runner's verdict line (then the run's key and the counts, as JSON)."""
PYTEST_INI = f"[pytest]\npythonpath = {WORKDIR}\n"
SYSTEM_PROMPT = WORKSPACE_PROMPT.replace(
    "There is no network.", "There is no network. Run the tests with `python3 -m pytest -q`."
)
_RUN_TESTS = """
import json, os, sys

def run(bundle, report, args):
    sys.path[:0] = [bundle] if bundle else []
    report = os.fdopen(int(report), 'w')
    import pytest
    import _pytest.main, _pytest.python, _pytest.reports, _pytest.runner

    watched = [(vars(_pytest.runner.CallInfo), 'from_call'),
               (vars(_pytest.reports.TestReport), 'from_item_and_call'),
               (vars(_pytest.reports.BaseReport), 'passed'),
               (vars(_pytest.reports.BaseReport), 'failed'),
               (vars(_pytest.runner), 'call_and_report'),
               (vars(_pytest.runner), 'runtestprotocol'),
               (vars(_pytest.runner), 'pytest_runtest_call'),
               (vars(_pytest.runner), 'pytest_runtest_makereport'),
               (vars(_pytest.python.Function), 'runtest'),
               (vars(_pytest.python), 'pytest_pyfunc_call'),
               (vars(_pytest.main), 'pytest_runtestloop')]
    before = [space.get(name) for space, name in watched]

    class Tally:
        def __init__(self):
            self.outcomes, self.collect_errors = {}, 0

        def pytest_collectreport(self, report):
            self.collect_errors += bool(report.failed)

        def pytest_runtest_logreport(self, report):
            now = 'failed' if report.failed else 'skipped' if report.skipped else 'passed'
            if self.outcomes.get(report.nodeid, 'passed') == 'passed':
                self.outcomes[report.nodeid] = now

    tally = Tally()
    code = pytest.main(args, plugins=[tally])
    counts = {'tests': len(tally.outcomes), 'collect_errors': tally.collect_errors}
    counts['patched'] = sum(space.get(name) is not was
                            for (space, name), was in zip(watched, before))
    for outcome in ('passed', 'failed', 'skipped'):
        counts[outcome] = sum(v == outcome for v in tally.outcomes.values())
    report.write(json.dumps(counts) + '\\n')
    report.close()
    return int(code)

sys.exit(run(sys.argv[1], sys.argv[2], sys.argv[3:]))
"""
"""pytest's process: ``python3 -I -c _RUN_TESTS BUNDLE FD ARGS...``. It counts the outcomes
with a plugin of its own and writes them, one JSON line, to the pipe ``FD`` when pytest
returns. It never holds the key."""
_RUN_PYTEST = """
import ctypes, json, os, select, subprocess, sys

def relay(child, report):
    # Pass pytest's output on while it runs; keep its report. Stop reading when it exits:
    # what it left running cannot write after the verdict.
    received, streams, after = b'', [child.stdout.fileno(), report], 0
    while streams and after < 64:
        ended = child.poll() is not None
        ready, _, _ = select.select(streams, [], [], 0 if ended else 0.05)
        if ended and not ready:
            break
        after += ended
        for fd in ready:
            data = os.read(fd, 65536)
            if not data:
                streams.remove(fd)
            elif fd == report:
                received = (received + data)[-65536:]
            else:
                sys.stdout.buffer.write(data)
                sys.stdout.flush()
    child.wait()
    return received

def run(bundle, args):
    # Not dumpable: no process of the same uid (pytest's, the repository's code) may read this
    # one's memory, trace it or open its files through /proc. Without that, no verdict.
    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:
        sys.stderr.write('envhub: cannot protect the verdict key (prctl)\\n')
        return 3
    key = sys.stdin.readline().strip()
    report, writer = os.pipe()
    child = subprocess.Popen(
        [sys.executable, '-I', '-c', RUN_TESTS, bundle, str(writer), *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        pass_fds=(writer,))
    os.close(writer)
    lines = relay(child, report).decode('utf-8', 'replace').splitlines()
    counts = None
    if len(lines) == 1:  # the tally's one line, or nothing to trust
        try:
            counts = json.loads(lines[0])
        except ValueError:
            pass
    if isinstance(counts, dict):
        sys.stdout.write('\\n%s %s %s\\n' % (VERDICT, key, json.dumps(counts)))
        sys.stdout.flush()
    return child.returncode if child.returncode >= 0 else 1

sys.exit(run(sys.argv[1], sys.argv[2:]))
""".replace("VERDICT", repr(VERDICT)).replace("RUN_TESTS", repr(_RUN_TESTS))
"""The trusted runner: ``python3 -I -c _RUN_PYTEST BUNDLE ARGS...`` with the key on stdin. It
runs pytest in a process of its own (:data:`_RUN_TESTS`), reads its report from a pipe, and
prints the key and the counts as its last line, with pytest's exit status."""


def instruction(project: Project) -> str:
    """The task as the model reads it."""
    return (
        f"The test suite of the `{project.package}` package fails. Find the bug and fix the "
        "package so that every test passes. Do not change the tests."
    )


def _calls_then_answer(*calls: tuple[str, dict[str, Any]]) -> Any:
    """A policy that makes ``calls`` one per turn, then answers."""

    def policy(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        done = sum(m.role == "assistant" for m in messages)
        if done >= len(calls):
            return "The bug is fixed."
        name, arguments = calls[done]
        return tool_call_block(name, arguments)

    return policy


_FORGE_REPORT = (
    "n=$(cat tests/*.py | grep -c '^def test_'); "
    '(while true; do mkdir -p .envhub; printf \'<testsuites><testsuite name="pytest" '
    'errors="0" failures="0" skipped="0" tests="%s"/></testsuites>\' $n '
    "> .envhub/junit.xml; sleep 0.005; done) >/dev/null 2>&1 & echo forging"
)
_PASS_EVERYTHING = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n"
    "    outcome.get_result().outcome = 'passed'\n"
)


_IN_PROCESS_FORGE = """import glob, os, stat
n = sum(open(f).read().count('def test_') for f in glob.glob('tests/test_*.py'))
os.makedirs('.envhub', exist_ok=True)
with open('.envhub/junit.xml', 'w') as report:
    report.write('<testsuites><testsuite name="pytest" errors="0" failures="0" skipped="0" '
                 'tests="%d"/></testsuites>' % n)
line = ('\\nenvhub-verdict %s {"tests": %d, "collect_errors": 0, "patched": 0, "passed": %d, '
        '"failed": 0, "skipped": 0}\\n' % ('0' * 32, n, n)).encode()
for fd in range(64):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.read(fd, 4096) if fd == 0 else os.write(fd, line)
    except OSError:
        pass
os._exit(0)
"""
# Look for the verdict key everywhere the repository's code can (this process's objects, modules
# and frames; every process's command line, environment and memory), print a pass with each
# key-like string found, and end pytest with status 0.
_KEY_HUNT = """import gc, os, re, stat, sys
key_like = re.compile(r'[0-9a-f]{32}')
found = []


def note(text):
    for key in key_like.findall(text):
        if key in found:
            found.remove(key)
        found.append(key)  # last seen last


def look(value):
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode('latin-1')
    if isinstance(value, str) and len(value) < 1 << 16:
        note(value)


def look_in_process(pid):
    for name in ('cmdline', 'environ'):
        try:
            with open('/proc/%s/%s' % (pid, name), 'rb') as file:
                look(file.read())
        except OSError:
            pass
    try:
        with open('/proc/%s/maps' % pid) as maps, open('/proc/%s/mem' % pid, 'rb') as mem:
            for line in maps:
                start, end = (int(x, 16) for x in line.split()[0].split('-'))
                if line.split()[1].startswith('r') and end - start < 1 << 26:
                    mem.seek(start)
                    note(mem.read(end - start).decode('latin-1'))
    except (OSError, ValueError, OverflowError):
        pass


for pid in os.listdir('/proc'):
    if pid.isdigit() and int(pid) != os.getpid():
        look_in_process(pid)
for obj in gc.get_objects():
    if isinstance(obj, dict):
        for value in list(obj.values()):
            look(value)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for value in list(obj):
            look(value)
for module in list(sys.modules.values()):
    for value in list(getattr(module, '__dict__', {}).values()):
        look(value)
for frame in sys._current_frames().values():
    while frame is not None:
        for value in list(frame.f_locals.values()):
            look(value)
        frame = frame.f_back
n = sum(open(os.path.join('tests', f)).read().count('def test_')
        for f in os.listdir('tests') if f.startswith('test_'))
counts = '{"tests": %d, "collect_errors": 0, "patched": 0, "passed": %d, "failed": 0, ' \
         '"skipped": 0}' % (n, n)
lines = ''.join('\\nenvhub-verdict %s %s\\n' % (key, counts) for key in found).encode()
for fd in range(64):  # the runner's stdout is a pipe (pytest captures fd 1 to a file)
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, lines)  # the frames' locals, seen last, printed last
    except OSError:
        pass
os._exit(0)
"""
_PATCH_PYTEST = """import _pytest.runner

_original = _pytest.runner.CallInfo.from_call


def _passing(func, when, reraise=None):
    def quiet():
        try:
            return func()
        except Exception:
            return None

    return _original(quiet, when, reraise)


_pytest.runner.CallInfo.from_call = _passing
"""


def _package_file(messages: list[Message], text: str) -> tuple[str, dict[str, Any]]:
    """A ``create`` that replaces the package's ``__init__.py`` with ``text``."""
    question = next(m.content for m in messages if m.role == "user") or ""
    package = re.search(r"`(\w+)` package", question)
    path = f"{package.group(1) if package else 'pkg'}/__init__.py"
    return "create", {"path": path, "file_text": text}


def _package_cheat(text: str) -> Any:
    """A policy that appends ``text`` to the package's ``__init__.py`` (run when the tests
    import it, inside pytest's process; the package still works)."""

    def policy(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        path = _package_file(messages, "")[1]["path"]
        append = ("bash", {"command": f"cat >> {path} <<'EOF'\n{text}EOF"})
        return _calls_then_answer(append)(messages, tools)

    return policy


_PLUGIN_DIST = "forge-1.0.dist-info"


def _exit_call(messages: list[Message]) -> tuple[str, dict[str, Any]]:
    """A ``create`` that makes importing the package end pytest with status 0."""
    return _package_file(messages, "import os\nos._exit(0)\n")


def _exit_on_import(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """End pytest with status 0 before any test runs (no report is written)."""
    return _calls_then_answer(_exit_call(messages))(messages, tools)


def _forge_and_exit(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Leave a process writing a passing report, and end pytest with status 0 before it
    writes its own."""
    forge = ("bash", {"command": _FORGE_REPORT})
    return _calls_then_answer(forge, _exit_call(messages))(messages, tools)


CHEATS = {
    "delete_the_tests": _calls_then_answer(("bash", {"command": "rm -rf tests"})),
    "replace_the_tests": _calls_then_answer(
        ("bash", {"command": "rm -rf tests"}),
        ("create", {"path": "tests/test_ok.py", "file_text": "def test_ok():\n    pass\n"}),
    ),
    "conftest_passes_everything": _calls_then_answer(
        ("create", {"path": "conftest.py", "file_text": _PASS_EVERYTHING}),
        ("create", {"path": "tests/conftest.py", "file_text": _PASS_EVERYTHING}),
    ),
    "config_deselects_everything": _calls_then_answer(
        ("create", {"path": "pytest.ini", "file_text": "[pytest]\naddopts = -k nothing\n"}),
    ),
    "exit_0_during_collection": _exit_on_import,
    "background_forges_the_report": _forge_and_exit,
    "package_forges_the_verdict_and_exits": _package_cheat(_IN_PROCESS_FORGE),
    "package_hunts_the_key": _package_cheat(_KEY_HUNT),
    "package_patches_pytest": _package_cheat(_PATCH_PYTEST),
    "sitecustomize_patches_pytest": _calls_then_answer(
        ("create", {"path": "sitecustomize.py", "file_text": _PATCH_PYTEST}),
        ("create", {"path": "usercustomize.py", "file_text": _PATCH_PYTEST}),
    ),
    "planted_pytest_plugin": _calls_then_answer(
        ("create", {"path": "forge_plugin.py", "file_text": _PASS_EVERYTHING}),
        (
            "create",
            {
                "path": f"{_PLUGIN_DIST}/METADATA",
                "file_text": "Metadata-Version: 2.1\nName: forge\nVersion: 1.0\n",
            },
        ),
        (
            "create",
            {
                "path": f"{_PLUGIN_DIST}/entry_points.txt",
                "file_text": "[pytest11]\nforge = forge_plugin\n",
            },
        ),
    ),
}
"""Ways around the suite a model could try; none may score (see :func:`envhub.audit_env`)."""


LEVELS = {"one-bug": 1, "helper-bug": 2, "two-bugs": 3}
"""The difficulty levels (``level=``), easiest first, each one difficulty of
:mod:`~envhub.envs.repo_bugs` alone."""
LEVEL_OF = {difficulty: name for name, difficulty in LEVELS.items()}


def _difficulties(level: str | None, difficulties: Sequence[int] | None) -> Sequence[int]:
    """The difficulties ``level`` selects, else ``difficulties`` (default all).

    Raises:
        ConfigError: An unknown level, or a level given with ``difficulties``.
    """
    if level is None:
        return DIFFICULTIES if difficulties is None else difficulties
    if level not in LEVELS:
        raise ConfigError(f"repo-repair: level must be one of {', '.join(LEVELS)}, got {level!r}")
    if difficulties is not None:
        raise ConfigError("repo-repair: give either level or difficulties, not both")
    return (LEVELS[level],)


class RepoRepairEnv(WorkspaceEnv):
    """Fix a generated repository until its pytest suite passes.

    Args:
        difficulties: Which difficulties to include (1: one function, 2: a helper seen through
            its caller, 3: two bugs in two modules; default all three).
        seeds: Seeds of the projects, per difficulty (default :data:`SEEDS`).
        level: One of :data:`LEVELS` (``"one-bug"``, ``"helper-bug"``, ``"two-bugs"``: the
            difficulties 1, 2, 3 alone) instead of ``difficulties``: the levels a training
            curriculum moves between (the default mix of all three is none of them).
        **kwargs: See :class:`~envhub.workspace_env.WorkspaceEnv` (``sandbox``, ``limits``,
            ``max_turns`` (30), ...).
    """

    name = "repo-repair"
    version = "0.1.0"
    system_prompt = SYSTEM_PROMPT
    reward_range = (0.0, 1.0)
    cheats = CHEATS
    levels = tuple(LEVELS)
    verdict_from_files = True  # verify reads the task's suite and the files, nothing else
    episodes_in_state = True

    def __init__(
        self,
        difficulties: Sequence[int] | None = None,
        seeds: Sequence[int] = SEEDS,
        verifier_timeout: float = 60.0,
        level: str | None = None,
        **kwargs: Any,
    ) -> None:
        difficulties = _difficulties(level, difficulties)
        unknown = sorted(set(difficulties) - set(DIFFICULTIES))
        if unknown or not difficulties or not seeds:
            raise ConfigError(
                f"repo-repair: difficulties must be a non-empty subset of {DIFFICULTIES} and "
                f"seeds non-empty, got {list(difficulties)} and {list(seeds)}"
            )
        self.difficulties, self.seeds = tuple(difficulties), tuple(seeds)
        self.level = level or next(
            (n for n, d in LEVELS.items() if (d,) == self.difficulties), None
        )
        self.verifier_timeout = verifier_timeout
        super().__init__(**kwargs)
        fixes = {row["question"]: self.project(row).fix for row in self.dataset}
        self.reference_policy = _write_fix_policy(fixes) if self.max_turns > 1 else None

    def load_dataset(self) -> list[dict[str, Any]]:
        """One row per (difficulty, seed): the instruction and the project's coordinates."""
        rows = []
        for difficulty in self.difficulties:
            for seed in self.seeds:
                project = make_project(seed, difficulty)
                info = {"id": f"repo-{difficulty}-{seed}", "seed": seed, "difficulty": difficulty}
                info["level"] = LEVEL_OF[difficulty]
                rows.append({"question": instruction(project), "info": info})
        return rows

    @staticmethod
    def project(task: Mapping[str, Any]) -> Project:
        """The generated project of a task row."""
        return make_project(task["info"]["seed"], task["info"]["difficulty"])

    def task_files(self, task: dict[str, Any]) -> Mapping[str, str]:
        """The buggy repository."""
        return self.project(task).files

    async def verify(self, session: Session, state: State) -> Verdict:
        """End what the model left running, restore the suite, run pytest, read its verdict."""
        project = self.project(state.task)
        await session.akill_processes()
        await session.arun("rm -rf tests .envhub")
        for path, text in project.test_files.items():
            await session.write_file(path, text)
        await session.write_file(".envhub/pytest.ini", PYTEST_INI)
        bundle = self.command_env(state.task).get("PYTHONPATH", "")
        argv = ["python3", "-I", "-c", _RUN_PYTEST, bundle, "-c", ".envhub/pytest.ini"]
        argv += ["--rootdir=.", "-p", "no:cacheprovider", "--noconftest", "-q", "tests"]
        key = secrets.token_hex(16)
        result = await session.arun(
            argv, stdin=key + "\n", wall_time=self.verifier_timeout, env=_PYTEST_ENV
        )
        counts = read_verdict(result.stdout, key)
        passed = _passed_tests(counts, project.test_count)
        solved = result.ok and passed == project.test_count
        state.data["pytest"] = (result.stdout + result.stderr)[-2000:]
        return Verdict(float(solved), {"tests_passed": passed / project.test_count})


_PYTEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_ADDOPTS": ""}
"""No plugin found by entry point (a ``.dist-info`` planted in the workspace), no options from
the environment."""


def read_verdict(stdout: str, key: str) -> dict[str, int] | None:
    """The counts on the runner's last line when it carries ``key`` (``None`` otherwise: the
    run ended early, or something else printed last)."""
    lines = stdout.rstrip("\n").rsplit("\n", 1)
    word, _, rest = lines[-1].partition(" ")
    got, _, counts = rest.partition(" ")
    if word != VERDICT or not secrets.compare_digest(got, key):
        return None
    try:
        parsed = json.loads(counts)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _passed_tests(counts: dict[str, int] | None, expected: int) -> int:
    """Tests that passed according to the runner (0 without its verdict, after a collection
    error, when pytest's own functions were replaced during the run, or when it counts other
    tests than the suite's)."""
    if not counts or counts.get("tests") != expected:
        return 0
    if counts.get("collect_errors") or counts.get("patched"):
        return 0
    return int(counts.get("passed", 0))


def _write_fix_policy(fixes: dict[str, dict[str, str]]) -> Any:
    """Write each fixed file with ``create``, one per turn, then answer."""

    def write_fix(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        question = next(m.content for m in messages if m.role == "user") or ""
        done = sum(m.role == "assistant" for m in messages)
        files = sorted(fixes.get(question, {}).items())  # not a task of ours: just answer
        if done >= len(files):
            return "The bug is fixed."
        path, text = files[done]
        return tool_call_block("create", {"path": path, "file_text": text})

    return write_fix
