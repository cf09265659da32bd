"""Harbor task folders as envs: envhub.make on a folder, rewards as the tests write them, the
solution check (envhub check), and verifier failures recorded, not crashed on."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import envhub
from envhub.checks.checker import check_env
from envhub.cli.app import app
from envhub.harbor import UnsupportedEnvironment
from envhub.harbor.check import check_tasks
from envhub.harbor.env import HarborEnv
from envhub.sandbox import LocalSandbox, bwrap_problem
from envhub.types import assistant
from envhub.workspace_env import WORKSPACE_PROMPT, workspace_prompt

pytestmark = pytest.mark.skipif(
    bwrap_problem() is not None or os.geteuid() != 0,
    reason="local sessions need bubblewrap and root",
)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harbor"


@pytest.fixture(scope="module")
def sandbox() -> Iterator[LocalSandbox]:
    with LocalSandbox(base_uid=61550, max_concurrency=4, warm=0) as box:
        yield box


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def play(env: HarborEnv, index: int, *turns: str) -> tuple[float, dict[str, Any]]:
    env.reset(options={"task_index": index})
    for turn in turns:
        _, reward, terminated, truncated, info = env.step(turn)
        if terminated or truncated:
            return reward, info
    raise AssertionError("the episode did not end")


def task_copy(tmp_path: Path, name: str = "hello-file") -> Path:
    return Path(shutil.copytree(EXAMPLES / name, tmp_path / name))


def test_make_on_a_folder_of_tasks_or_one_task(sandbox) -> None:
    env = envhub.make(str(EXAMPLES), sandbox=sandbox)
    assert isinstance(env, HarborEnv)
    assert [row["info"]["name"] for row in env.dataset] == [
        "fix-median",
        "hello-file",
        "log-summary",
        "tally-errors",
    ]
    one = envhub.make(str(EXAMPLES / "hello-file"), sandbox=sandbox)
    prompt, _ = one.reset(options={"task_index": 0})
    assert [m.content for m in prompt] == [
        workspace_prompt("/app"),
        "Create a file `/app/hello.txt` whose only line is `Hello, world!`.\n",
    ]
    assert workspace_prompt("/app").startswith(
        "You are working in a sandbox whose current folder is /app (the same folder as "
        "/sandbox), with tools to run shell commands (`bash`), view files and folders (`view`),"
    )
    own = HarborEnv(EXAMPLES / "hello-file", sandbox=sandbox, system_prompt="Be brief.")
    assert own.format_prompt(own.dataset[0])[0].content == (
        "Be brief.\n\nThe current folder is the task's working folder, /app: commands start "
        "there, and it is the same folder as /sandbox (/app/x is /sandbox/x)."
    )
    assert [t["function"]["name"] for t in one.tool_schemas] == [
        "bash",
        "view",
        "create",
        "str_replace",
    ]


def test_rewards_are_what_the_tests_write(sandbox) -> None:
    env = HarborEnv(EXAMPLES, sandbox=sandbox)
    hello = call("create", path="/sandbox/hello.txt", file_text="Hello, world!\n")
    assert play(env, 1, hello, "done")[0] == 1.0
    assert play(env, 1, call("create", path="hello.txt", file_text="hi\n"), "done")[0] == 0.0
    # fix-median: the share of even-length cases right (reward.txt): 0 for the bug, 3 of 4
    # for the mean of all values.
    assert play(env, 0, "nothing to do")[0] == 0.0
    mean = "def median(values):\n    return sum(values) / len(values)\n"
    assert play(env, 0, call("create", path="stats.py", file_text=mean), "done")[0] == 0.75
    # log-summary: reward.json, its other keys reported as components.
    summary = call("bash", command="printf 'errors: 16\\ntop: 10.0.0.9\\n' > summary.txt")
    reward, info = play(env, 2, summary, "done")
    assert reward == 0.5
    assert info["reward_components"] == {"verifier": 0.5, "errors_line": 1.0, "top_line": 0.0}


def test_the_tests_are_out_of_reach_during_the_episode(sandbox) -> None:
    """/tests, /solution and /logs are there, empty, as the task expects; the tests come in
    after the episode."""
    env = HarborEnv(EXAMPLES / "fix-median", sandbox=sandbox)
    env.reset(options={"task_index": 0})
    observation, *_ = env.step(call("bash", command="ls -A /app /tests /solution /logs"))
    assert observation[0].content == (
        "[exit 0]\n/app:\nstats.py\n\n/logs:\n\n/solution:\n\n/tests:"
    )
    env.close()


FORGE_IN_THE_BACKGROUND = (
    "(while true; do for d in /tmp/.harbor /sandbox/.harbor /; do mkdir -p $d/logs/verifier; "
    "echo 1 > $d/logs/verifier/reward.txt; done; sleep 0.01; done) >/dev/null 2>&1 & echo planted"
)
PLANT_AND_LOCK = (
    "mkdir -p /logs/verifier /tests/sub && echo 1 > /logs/verifier/reward.txt && "
    "echo 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh && touch /tests/.hidden && "
    "chmod 000 /tests/sub /logs/verifier /tests /logs && echo planted"
)


@pytest.mark.parametrize(
    "forge", [FORGE_IN_THE_BACKGROUND, PLANT_AND_LOCK], ids=["left-running", "planted-and-locked"]
)
def test_a_reward_the_model_forges_is_not_read(sandbox, forge: str) -> None:
    """What the model leaves running cannot write the reward, and what it plants or locks in
    the tests' folders is cleared before the tests run."""
    env = HarborEnv(EXAMPLES / "hello-file", sandbox=sandbox)
    reward, info = play(env, 0, call("bash", command=forge), "done")
    assert (reward, info["errors"]) == (0.0, [])


PASS_EVERYTHING = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n"
    "    outcome.get_result().outcome = 'passed'\n"
)
LOAD_THE_PLUGIN = "import os\n\nos.environ['PYTEST_ADDOPTS'] = '-p forge_plugin'\n"
USER_SITE = ".local/lib/python3.{minor}/site-packages"


@pytest.fixture
def pytest_task(tmp_path: Path) -> Path:
    """A task whose test.sh runs pytest on /tests (pytest from envhub's bundle when the
    system's python3 has none)."""
    folder = tmp_path / "answer"
    (folder / "tests").mkdir(parents=True)
    (folder / "task.toml").write_text('version = "1.0"\n')
    (folder / "instruction.md").write_text("Write /app/answer.txt holding 42.\n")
    (folder / "tests/test_answer.py").write_text(
        "from pathlib import Path\n\n\ndef test_answer():\n"
        "    assert Path('/app/answer.txt').read_text().strip() == '42'\n"
    )
    (folder / "tests/test.sh").write_text(
        "cd /app\npython3 -m pytest -q /tests/test_answer.py "
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    )
    return folder


@pytest.fixture(scope="module")
def bundled() -> Iterator[LocalSandbox]:
    from envhub.checks.pytest_bundle import pytest_bundle

    bundle = pytest_bundle()
    binds = (str(bundle),) if bundle else ()
    with LocalSandbox(base_uid=61560, max_concurrency=2, warm=0, ro_binds=binds) as box:
        yield box


def test_the_file_tools_take_the_tasks_own_paths(pytest_task: Path, bundled) -> None:
    """/app/answer.txt (the task's working folder) and /sandbox/answer.txt are one file to the
    file tools; commands start in /app; the verifier reads what the tools wrote."""
    env = HarborEnv(pytest_task, sandbox=bundled)
    env.reset(options={"task_index": 0})
    turns = [
        call("create", path="/app/answer.txt", file_text="41\n"),
        call("view", path="/sandbox/answer.txt"),
        call("str_replace", path="/app/answer.txt", old_str="41", new_str="42"),
        call("bash", command="pwd && cat answer.txt /sandbox/answer.txt"),
    ]
    assert [env.step(turn)[0][0].content for turn in turns] == [
        "Wrote /app/answer.txt (1 lines, 3 bytes).",
        "     1\t41",
        "Edited /app/answer.txt at line 1. The lines around the edit now read:\n     1\t42",
        "[exit 0]\n/app\n42\n42",
    ]
    _, reward, terminated, _, info = env.step("Done.")
    assert (reward, terminated, info["errors"]) == (1.0, True, [])


def test_the_workspace_cannot_configure_the_tests(pytest_task: Path, bundled) -> None:
    """pytest configuration and plugins planted where the tests would find them (the
    workspace, /tmp, the model's home) change nothing: Harbor keeps /tests out of /app."""
    import sys

    user_site = USER_SITE.format(minor=sys.version_info.minor)
    env = HarborEnv(pytest_task, sandbox=bundled)
    answer = call("create", path="answer.txt", file_text="42\n")
    assert play(env, 0, answer, "done")[0] == 1.0
    assert play(env, 0, "done")[0] == 0.0
    plants = [
        call("create", path="pytest.ini", file_text="[pytest]\n"),
        call("create", path="conftest.py", file_text=PASS_EVERYTHING),
        call("bash", command="cp pytest.ini conftest.py /tmp/ && mkdir -p /tmp/.harbor/tests"),
        call("bash", command="cp conftest.py /tmp/.harbor/conftest.py && touch /tmp/setup.py"),
        call("bash", command="cp pytest.ini conftest.py /tests/ && cp conftest.py /logs/"),
        call("bash", command=f"mkdir -p ~/{user_site} && ls -d ~/{user_site}"),
        call("create", path=f"{user_site}/forge_plugin.py", file_text=PASS_EVERYTHING),
        *[
            call("create", path=f"{user_site}/{name}.py", file_text=LOAD_THE_PLUGIN)
            for name in ("usercustomize", "sitecustomize")
        ],
    ]
    reward, info = play(env, 0, *plants, "done")
    assert (reward, info["errors"]) == (0.0, [])
    env.close()


COUNT_LINES = {
    "task.toml": (
        'version = "1.0"\n\n[task]\nname = "envhub/count-lines"\n\n[verifier]\n'
        'timeout_sec = 60.0\n\n[agent]\ntimeout_sec = 120.0\n\n[environment]\nworkdir = "/app"\n'
    ),
    "instruction.md": "Write the number of lines of `/app/data.txt` to `/app/count.txt`.\n",
    "environment/Dockerfile": "FROM debian:12\nWORKDIR /app\nCOPY data.txt /app/data.txt\n",
    "environment/data.txt": "a\nb\nc\n",
    "tests/test.sh": (
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        '[ "$(pwd)" = /app ] && python3 -m pytest -q /tests/test_outputs.py '
        "&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    ),
    "tests/test_outputs.py": (
        "from pathlib import Path\n\n\ndef test_count():\n"
        "    lines = Path('/app/data.txt').read_text().splitlines()\n"
        "    assert Path('/app/count.txt').read_text().strip() == str(len(lines))\n"
    ),
    "solution/solve.sh": "#!/bin/bash\npython3 /solution/count.py /app/data.txt > /app/count.txt\n",
    "solution/count.py": "import sys\n\nprint(len(open(sys.argv[1]).read().splitlines()))\n",
}
"""A task as published Harbor tasks are written: its own paths everywhere, /tests read by
pytest, a solution that reads /solution, a working folder in task.toml and the Dockerfile."""


@pytest.fixture
def count_lines(tmp_path: Path) -> Path:
    from envhub.harbor.dockerfile import host_images

    if "debian:12" not in host_images():
        pytest.skip("the host is not Debian 12")
    folder = tmp_path / "count-lines"
    for name, text in COUNT_LINES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def play_reference(env: HarborEnv, index: int) -> tuple[float, list[str]]:
    """The reward of the env's reference policy on a task, and the replies it got."""
    messages, _ = env.reset(options={"task_index": index})
    replies: list[str] = []
    while True:
        turn = env.reference_policy(messages, env.tool_schemas)
        observation, reward, terminated, truncated, _ = env.step(turn)
        messages = [*messages, assistant(turn), *observation]
        replies += [m.content or "" for m in observation]
        if terminated or truncated:
            return reward, replies


def test_a_published_style_task_passes_envhub_check(count_lines: Path, bundled) -> None:
    checks = check_tasks(count_lines, sandbox=bundled)
    assert [(c.name, c.solved, c.unsolved, c.passed, c.error) for c in checks] == [
        ("envhub/count-lines", 1.0, 0.0, True, "")
    ]
    result = CliRunner().invoke(app, ["check", str(count_lines)])
    assert result.exit_code == 0, result.output
    assert "│ envhub/count-lines │ 1             │ 0       │ ok     │" in result.output


def test_a_published_style_task_runs_at_its_own_paths(count_lines: Path, bundled) -> None:
    env = HarborEnv(count_lines, sandbox=bundled)
    prompt, _ = env.reset(options={"task_index": 0})
    assert prompt[-1].content == COUNT_LINES["instruction.md"]  # as written: /app is there
    count = call("bash", command="wc -l < /app/data.txt > /app/count.txt && cat count.txt && pwd")
    observation, *_ = env.step(count)
    assert observation[0].content == "[exit 0]\n3\n/app"
    _, reward, terminated, _, info = env.step("Done.")
    assert (reward, terminated, info["errors"]) == (1.0, True, [])
    assert play(env, 0, "Done.")[0] == 0.0
    # The reference policy writes solution/ to /solution, then runs solve.sh (in /app, where
    # the model's commands start).
    assert play_reference(env, 0) == (1.0, ["[exit 0]\n(no output)", "[exit 0]\n(no output)"])
    env.close()


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("echo hi\n", r"tests/test.sh wrote no reward \(exit 0\): it must write /logs/verifier/"),
        ("echo abc > /logs/verifier/reward.txt\n", r"wrote reward.txt, but it holds 'abc'"),
        (
            "echo 2 > /logs/verifier/reward.txt\n",
            r"wrote reward.txt with reward 2.0, not in \[0, 1\]",
        ),
        (
            "echo '[1]' > /logs/verifier/reward.json\n",
            r"wrote reward.json, but it is not a JSON object",
        ),
        (": > /logs/verifier/reward.txt\n", r"wrote reward.txt, but it is empty"),
    ],
)
def test_a_verifier_without_a_usable_reward_is_recorded(
    tmp_path: Path, sandbox, script: str, message: str
) -> None:
    folder = task_copy(tmp_path)
    (folder / "tests/test.sh").write_text("mkdir -p /logs/verifier\n" + script)
    reward, info = play(HarborEnv(folder, sandbox=sandbox), 0, "done")
    assert reward == 0.0
    (error,) = info["errors"]
    assert (error.stage, error.type) == ("reward:verifier", "VerifierError")
    assert error.message.startswith(str(folder / "tests/test.sh"))
    assert __import__("re").search(message, error.message)


def test_the_verifier_timeout_comes_from_task_toml(tmp_path: Path, sandbox) -> None:
    folder = task_copy(tmp_path)
    toml = (folder / "task.toml").read_text().replace("timeout_sec = 30.0", "timeout_sec = 0.5")
    (folder / "task.toml").write_text(toml)
    (folder / "tests/test.sh").write_text("sleep 5; echo 1 > /logs/verifier/reward.txt\n")
    reward, info = play(HarborEnv(folder, sandbox=sandbox), 0, "done")
    assert reward == 0.0
    assert "wrote no reward (timeout after" in info["errors"][0].message


def test_solutions_pass_and_doing_nothing_fails(tmp_path: Path, sandbox) -> None:
    checks = check_tasks(EXAMPLES, sandbox=sandbox)
    assert [(c.name, c.solved, c.unsolved, c.passed) for c in checks] == [
        ("fix-median", 1.0, 0.0, True),
        ("hello-file", 1.0, 0.0, True),
        ("log-summary", 1.0, 0.0, True),
        ("tally-errors", 1.0, 0.0, True),
    ]
    broken = task_copy(tmp_path)
    (broken / "solution/solve.sh").write_text("echo 'Hello!' > /app/hello.txt\n")
    (check,) = check_tasks(broken, sandbox=sandbox)
    assert (check.solved, check.unsolved, check.passed) == (0.0, 0.0, False)
    assert check.error.startswith("with its solution: reward 0; the tests' output ended with: ")


def test_a_failed_run_without_the_solution_still_checks_the_solution(
    tmp_path: Path, sandbox
) -> None:
    folder = task_copy(tmp_path)
    (folder / "tests/test.sh").write_text(
        "mkdir -p /logs/verifier\n[ -f /app/hello.txt ] && echo 1 > /logs/verifier/reward.txt\n"
    )  # nothing done: no reward file at all
    (check,) = check_tasks(folder, sandbox=sandbox)
    assert (check.solved, check.unsolved, check.passed) == (1.0, None, False)
    assert check.error.startswith("VerifierError: ") and "wrote no reward" in check.error


def test_envhub_check_on_a_task_folder(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["check", str(EXAMPLES / "hello-file")])
    assert result.exit_code == 0, result.output
    assert "│ hello-file │ 1             │ 0       │ ok     │" in result.output
    no_solution = task_copy(tmp_path)
    shutil.rmtree(no_solution / "solution")
    result = CliRunner().invoke(app, ["check", str(no_solution)])
    assert result.exit_code == 1
    assert f"hello-file: {no_solution}/solution/solve.sh is missing\n" in result.output


def test_the_examples_pass_check_env(sandbox) -> None:
    report = check_env(HarborEnv(EXAMPLES, sandbox=sandbox), seeds=(0, 1))
    assert report.passed, report.failures


def test_the_same_tasks_score_the_same_on_e2b() -> None:
    """Through the real e2b SDK against the local envd of tests/sandbox (each command a local
    sandbox run; the limits stay within that run's own)."""
    pytest.importorskip("e2b")
    from envhub.sandbox import Limits
    from envhub.sandbox.e2b import E2BSandbox

    spec = importlib.util.spec_from_file_location(
        "envd_local", Path(__file__).parents[1] / "sandbox" / "envd_local.py"
    )
    envd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(envd)
    with envd.local_envd_process(base_uid=61650) as url:
        box = E2BSandbox(debug=True, sandbox_url=url, http_version="1.1")
        # disk_mb 16: a Harbor session's files may be as large as its disk, and each command
        # here is a local run whose own hard file-size limit is 16 MiB
        limits = Limits(wall_time=10, processes=16, disk_mb=16)
        env = HarborEnv(EXAMPLES, sandbox=box, limits=limits)
        hello = call("bash", command="echo Hello, world! > hello.txt")
        assert play(env, 1, hello, "done")[0] == 1.0
        assert play(env, 1, "done")[0] == 0.0
        mean = "def median(values):\n    return sum(values) / len(values)\n"
        assert play(env, 0, call("create", path="stats.py", file_text=mean), "done")[0] == 0.75
        # e2b sessions show no /app or /tests: the paths are mapped into /sandbox instead, and
        # the model's folder is /sandbox alone.
        assert [m.content for m in env.format_prompt(env.dataset[1])] == [
            WORKSPACE_PROMPT,
            "Create a file `/sandbox/hello.txt` whose only line is `Hello, world!`.\n",
        ]
        env.reset(options={"task_index": 1})
        hello_at_app = call("create", path="/app/hello.txt", file_text="Hello, world!\n")
        assert env.step(hello_at_app)[0][0].content == (
            "Error: create raised EditError: '/app/hello.txt' is outside the workspace; files "
            "are edited under /sandbox (use bash to read other files)"
        )
        assert env.step("done")[1] == 0.0
        assert play_reference(env, 1)[0] == 1.0
        checks = check_tasks(EXAMPLES / "hello-file", sandbox=box, limits=env.limits)
        assert [(c.solved, c.unsolved, c.passed) for c in checks] == [(1.0, 0.0, True)]
        env.close()
        box.close()


def test_unsupported_tasks_are_refused_or_left_out(tmp_path: Path, sandbox) -> None:
    shutil.copytree(EXAMPLES, tmp_path / "tasks")
    (tmp_path / "tasks/hello-file/environment").mkdir()
    (tmp_path / "tasks/hello-file/environment/Dockerfile").write_text("FROM node:20\n")
    with pytest.raises(
        UnsupportedEnvironment, match=r"'node:20' cannot be built here.*skip_unsupported=True"
    ):
        HarborEnv(tmp_path / "tasks", sandbox=sandbox)
    env = HarborEnv(tmp_path / "tasks", sandbox=sandbox, skip_unsupported=True)
    assert [row["info"]["name"] for row in env.dataset] == [
        "fix-median",
        "log-summary",
        "tally-errors",
    ]


def test_only_folders_with_task_files_are_made_as_tasks(tmp_path: Path, monkeypatch) -> None:
    from envhub.loader import is_task_path

    (tmp_path / "calculator" / "tests").mkdir(parents=True)  # a folder named like an env
    (tmp_path / "notes").mkdir()
    monkeypatch.chdir(tmp_path)
    assert not is_task_path("calculator") and not is_task_path("notes")
    assert type(envhub.make("calculator")).__name__ == "CalculatorEnv"
    assert is_task_path(str(EXAMPLES)) and is_task_path(str(EXAMPLES / "hello-file"))


def test_executable_files_stay_executable(tmp_path: Path, sandbox) -> None:
    folder = task_copy(tmp_path)
    (folder / "environment").mkdir()
    (folder / "environment/Dockerfile").write_text("FROM debian:12\nWORKDIR /app\nCOPY bin/ bin/\n")
    (folder / "environment/bin").mkdir()
    (folder / "environment/bin/greet").write_text("#!/bin/sh\necho Hello, world!\n")
    (folder / "environment/bin/greet").chmod(0o755)
    (folder / "tests/check.sh").write_text('[ "$(cat /app/hello.txt)" = "Hello, world!" ]\n')
    (folder / "tests/test.sh").write_text(
        "/tests/check.sh && r=1 || r=0; echo $r > /logs/verifier/reward.txt\n"
    )
    env = HarborEnv(folder, sandbox=sandbox)
    reward, _ = play(env, 0, call("bash", command="./bin/greet > hello.txt"), "done")
    assert reward == 1.0
