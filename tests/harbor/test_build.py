"""Harbor tasks whose Dockerfile has RUN steps: the steps run once per task in a real session
(no network, the system read-only), their files are what every episode and the tests start
from, package installs the host satisfies pass, and the rest is refused naming the line."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envhub.harbor import UnsupportedEnvironment, load_task
from envhub.harbor import build as builds
from envhub.harbor.build_check import simple_commands
from envhub.harbor.check import check_tasks
from envhub.harbor.dockerfile import sandbox_python_version
from envhub.harbor.env import HarborEnv
from envhub.harbor.installs import _meets, apt_request, host_packages, missing_apt, pip_request
from envhub.sandbox import LocalSandbox, bwrap_problem
from envhub.workspace_env import WORKSPACES, default_command_env

needs_sessions = pytest.mark.skipif(
    bwrap_problem() is not None or os.geteuid() != 0,
    reason="local sessions need bubblewrap and root",
)
IMAGE = f"python:{sandbox_python_version()}-slim"
TEST_SH = (
    "#!/bin/bash\nmkdir -p /logs/verifier\n"
    'if [ "$(cat /app/answer.txt 2>/dev/null)" = "$(cat /app/out/upper.txt)" ]; then\n'
    "  echo 1 > /logs/verifier/reward.txt\nelse\n  echo 0 > /logs/verifier/reward.txt\nfi\n"
)


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test prepares into its own cache; none sees another's prepared workspaces."""
    monkeypatch.setenv("ENVHUB_CACHE", str(tmp_path / "cache"))
    builds.PREPARED.clear()
    yield
    builds.PREPARED.clear()
    WORKSPACES.clear()


@pytest.fixture(scope="module")
def sandbox() -> Iterator[LocalSandbox]:
    with LocalSandbox(base_uid=61850, max_concurrency=2, warm=0) as box:
        yield box


def make_task(root: Path, dockerfile: str, files: dict[str, str] | None = None) -> Path:
    folder = root / "task"
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "task.toml").write_text('version = "1.0"\n\n[verifier]\ntimeout_sec = 30.0\n')
    (folder / "instruction.md").write_text("Copy out/upper.txt to answer.txt.\n")
    (folder / "environment/Dockerfile").write_text(f"FROM {IMAGE}\n{dockerfile}")
    for name, text in (files or {}).items():
        (folder / "environment" / name).write_text(text)
    (folder / "tests/test.sh").write_text(TEST_SH)
    return folder


def prepare(env: HarborEnv) -> Path:
    return asyncio.run(env.prepare_workspace(env.dataset[0])).path


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def play(env: HarborEnv, *turns: str) -> tuple[float, list[str]]:
    env.reset(options={"task_index": 0})
    for turn in turns:
        _, reward, terminated, truncated, _ = env.step(turn)
        if terminated or truncated:
            tools = [m.content or "" for m in env.state.messages if m.role == "tool"]
            return reward, tools
    raise AssertionError("the episode did not end")


def sandbox_pytest_version() -> str:
    """pytest's version as the sandbox's python3 sees it (the bundle on PYTHONPATH)."""
    done = subprocess.run(
        ["/usr/bin/python3", "-s", "-c", "import pytest; print(pytest.__version__)"],
        capture_output=True, text=True, check=True,
        env={"PATH": "/usr/bin:/bin", **default_command_env()},
    )  # fmt: skip
    return done.stdout.strip()


RUN_STEPS = """\
WORKDIR /app
ENV GREETING="hello from ENV"
ARG LETTERS=abc
COPY words.txt /app/words.txt
RUN mkdir -p out && tr a-z A-Z < words.txt > out/upper.txt && echo "$GREETING $LETTERS" > env.txt
RUN ["/bin/sh", "-c", "echo exec form > exec.txt"]
WORKDIR /app/sub
RUN pwd > where.txt && ls /app/out > listing.txt
SHELL ["/bin/bash", "-c"]
RUN echo "bash ${BASH_VERSINFO[0]}" > /app/shell.txt
COPY words.txt /app/words.txt
WORKDIR /app
"""


@needs_sessions
def test_what_run_steps_make_is_in_every_episode_and_seen_by_the_tests(
    tmp_path: Path, sandbox: LocalSandbox
) -> None:
    folder = make_task(tmp_path, RUN_STEPS, {"words.txt": "tiny words\n"})
    env = HarborEnv(folder, sandbox=sandbox)
    look = "cat out/upper.txt env.txt exec.txt sub/where.txt sub/listing.txt shell.txt"
    reward, outputs = play(env, call("bash", command=look), "done")
    assert reward == 0.0  # the tests read the RUN's file: no answer.txt yet
    bash = subprocess.run(["bash", "-c", "echo ${BASH_VERSINFO[0]}"], capture_output=True)
    assert outputs[0].splitlines() == [
        "[exit 0]",
        "TINY WORDS",
        "hello from ENV abc",
        "exec form",
        "/sandbox/sub",  # WORKDIR /app/sub, mapped
        "upper.txt",
        f"bash {bash.stdout.decode().strip()}",
    ]
    reward, _ = play(env, call("bash", command="cp out/upper.txt answer.txt"), "done")
    assert reward == 1.0
    workspace = env.workspace_for(env.dataset[0]).path
    assert sorted(p.name for p in workspace.iterdir()) == [
        "env.txt", "exec.txt", "out", "shell.txt", "sub", "words.txt",
    ]  # fmt: skip
    assert workspace.parent == builds.prepared_root()
    assert all(p.stat().st_uid == os.geteuid() for p in workspace.rglob("*"))


@needs_sessions
def test_a_failing_step_is_refused_naming_its_line(tmp_path: Path, sandbox: LocalSandbox) -> None:
    folder = make_task(tmp_path, "WORKDIR /app\nRUN echo preparing && exit 1\n")
    env = HarborEnv(folder, sandbox=sandbox)  # loads: the failure shows when it runs
    with pytest.raises(UnsupportedEnvironment) as error:
        prepare(env)
    assert str(error.value).startswith(
        f"{folder / 'environment/Dockerfile'}:3: RUN echo preparing && exit 1: failed while "
        "preparing the workspace (exit 1); its output ended with:\npreparing\nA Dockerfile's "
        "RUN steps run here in envhub's sandbox, without network and with the host's system "
        "read-only: install it on this machine, or vendor the files"
    )
    assert not builds.prepared_root().exists()  # nothing kept
    [checked] = check_tasks(folder, sandbox=sandbox)  # envhub check reports it, not crashes
    assert not checked.passed and "Dockerfile:3: RUN echo preparing" in checked.error


@needs_sessions
def test_no_network_inside_a_run_step(tmp_path: Path, sandbox: LocalSandbox) -> None:
    connect = "import socket; socket.create_connection(('1.1.1.1', 53), timeout=5)"
    folder = make_task(tmp_path, f'WORKDIR /app\nRUN python3 -c "{connect}"\n')
    with pytest.raises(UnsupportedEnvironment) as error:
        prepare(HarborEnv(folder, sandbox=sandbox))
    message = str(error.value)
    assert f'Dockerfile:3: RUN python3 -c "{connect}": failed while preparing' in message
    assert "(exit 1); its output ended with:" in message and "Network is unreachable" in message


def test_a_download_is_refused_when_the_task_loads(tmp_path: Path) -> None:
    folder = make_task(tmp_path, "RUN curl -fsSL https://example.com/install.sh | sh\n")
    with pytest.raises(
        UnsupportedEnvironment,
        match=r"Dockerfile:2: RUN curl -fsSL https://example.com/install.sh \| sh: downloads "
        r"https://example.com/install.sh, and there is no network here",
    ):
        load_task(folder)
    (folder / "environment/Dockerfile").write_text(f"FROM {IMAGE}\nRUN npm install\n")
    with pytest.raises(UnsupportedEnvironment, match=r"Dockerfile:2: RUN npm install: runs npm"):
        load_task(folder)


APT = "RUN apt-get update && apt-get install -y --no-install-recommends {} \\\n" \
      "    && rm -rf /var/lib/apt/lists/*\n"  # fmt: skip


@needs_sessions
@pytest.mark.skipif(not host_packages(), reason="no dpkg on this machine")
def test_an_apt_install_of_what_the_host_has_passes(tmp_path: Path, sandbox: LocalSandbox) -> None:
    folder = make_task(
        tmp_path, "WORKDIR /app\n" + APT.format("coreutils grep") + "RUN echo ok > ok.txt\n"
    )
    workspace = prepare(HarborEnv(folder, sandbox=sandbox))
    assert (workspace / "ok.txt").read_text() == "ok\n"


@pytest.mark.skipif(not host_packages(), reason="no dpkg on this machine")
def test_an_apt_install_of_what_the_host_lacks_is_refused(tmp_path: Path) -> None:
    folder = make_task(tmp_path, APT.format("coreutils envhub-absent-package"))
    with pytest.raises(UnsupportedEnvironment) as error:
        load_task(folder)
    assert str(error.value).startswith(
        f"{folder / 'environment/Dockerfile'}:2: RUN apt-get update && apt-get install -y "
        "--no-install-recommends coreutils envhub-absent-package && rm -rf "
        "/var/lib/apt/lists/*: apt-get install needs envhub-absent-package (not installed on "
        "this machine), and a RUN step cannot install packages here (no network, the system "
        "read-only); install them on this machine (apt-get install envhub-absent-package)"
    )


@needs_sessions
@pytest.mark.skipif(not host_packages(), reason="no dpkg on this machine")
def test_an_install_that_cannot_be_told_on_load_is_refused_when_it_runs(
    tmp_path: Path, sandbox: LocalSandbox
) -> None:
    folder = make_task(tmp_path, "RUN name=envhub-absent-package; apt-get install -y $name\n")
    with pytest.raises(UnsupportedEnvironment) as error:
        prepare(HarborEnv(folder, sandbox=sandbox))
    assert (
        "Dockerfile:2: RUN name=envhub-absent-package; apt-get install -y $name: failed while "
        "preparing the workspace (exit 1); its output ended with:\nenvhub: apt-get install "
        "needs envhub-absent-package (not installed on this machine)."
    ) in str(error.value)


@needs_sessions
def test_a_pip_install_the_sandbox_python_satisfies_passes(
    tmp_path: Path, sandbox: LocalSandbox
) -> None:
    version = sandbox_pytest_version()
    steps = (
        f"RUN pip install --no-cache-dir pytest=={version}\n"
        "RUN python3 -m pip install -U 'pytest>=1.0' && pip3 install pytest\n"
        "WORKDIR /app\nCOPY requirements.txt requirements.txt\n"
        "RUN pip install -r requirements.txt && echo ok > ok.txt\n"
    )
    folder = make_task(tmp_path, steps, {"requirements.txt": f"pytest~={version}  # tests\n"})
    box = LocalSandbox(base_uid=61860, max_concurrency=1, warm=0, ro_binds=bundle_binds())
    with box:
        workspace = prepare(HarborEnv(folder, sandbox=box))
    assert sorted(p.name for p in workspace.iterdir()) == ["ok.txt", "requirements.txt"]


def bundle_binds() -> tuple[str, ...]:
    from envhub.checks.pytest_bundle import pytest_bundle

    bundle = pytest_bundle()
    return (str(bundle),) if bundle else ()


def test_a_pip_install_the_sandbox_python_lacks_is_refused(tmp_path: Path) -> None:
    version = sandbox_pytest_version()
    for requirement, why in (
        ("pytest==0.0.1", f"pytest==0.0.1 (the sandbox's python3 has pytest {version})"),
        ("envhub-absent-dist", "envhub-absent-dist (not installed for the sandbox's python3)"),
    ):
        folder = make_task(tmp_path / requirement, f"RUN pip install {requirement}\n")
        with pytest.raises(UnsupportedEnvironment) as error:
            load_task(folder)
        assert str(error.value).startswith(
            f"{folder / 'environment/Dockerfile'}:2: RUN pip install {requirement}: pip install "
            f"needs {why}, and a RUN step cannot install it here"
        )


@needs_sessions
def test_a_pip_install_from_a_file_that_is_not_satisfied_fails_when_it_runs(
    tmp_path: Path, sandbox: LocalSandbox
) -> None:
    steps = "WORKDIR /app\nCOPY requirements.txt .\nRUN pip install -r requirements.txt\n"
    folder = make_task(tmp_path, steps, {"requirements.txt": "envhub-absent-dist>=2\n"})
    with pytest.raises(UnsupportedEnvironment) as error:
        prepare(HarborEnv(folder, sandbox=sandbox))
    assert (
        "Dockerfile:4: RUN pip install -r requirements.txt: failed while preparing the "
        "workspace (exit 1); its output ended with:\nenvhub: pip install: envhub-absent-dist "
        "(not installed for the sandbox's python3)."
    ) in str(error.value)


@needs_sessions
def test_the_steps_run_once_per_task(
    tmp_path: Path, sandbox: LocalSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[str] = []
    real = builds.run_steps

    async def counted(build: builds.Build, *args: Any) -> bytes:
        runs.append(build.key)
        return await real(build, *args)

    monkeypatch.setattr(builds, "run_steps", counted)
    folder = make_task(tmp_path, "WORKDIR /app\nRUN date +%s%N > stamp.txt\n")
    env = HarborEnv(folder, sandbox=sandbox)

    async def three_at_once() -> list[Path]:
        row = env.dataset[0]
        done = await asyncio.gather(*(env.prepare_workspace(row) for _ in range(3)))
        return [w.path for w in done]

    assert len(set(asyncio.run(three_at_once()))) == 1 and len(runs) == 1
    stamps = [play(env, call("bash", command="cat stamp.txt"), "done")[1][0] for _ in range(3)]
    assert len(set(stamps)) == 1 and len(runs) == 1
    builds.PREPARED.clear()  # as in another process (envhub check, then eval): the disk cache
    WORKSPACES.clear()
    again = HarborEnv(folder, sandbox=sandbox)
    play(again, "done")
    assert len(runs) == 1
    (folder / "environment/Dockerfile").write_text(
        f"FROM {IMAGE}\nWORKDIR /app\nRUN date +%s%N > stamp.txt && echo changed\n"
    )
    changed = HarborEnv(folder, sandbox=sandbox)
    play(changed, "done")
    assert len(runs) == 2 and runs[0] != runs[1]


def test_steps_are_read_in_order_with_what_is_in_force() -> None:
    folder = Path(__file__).resolve().parents[2] / "examples/harbor/tally-errors"
    task = load_task(folder)
    assert task.build is not None
    kinds = [type(step).__name__ for step in task.build.steps]
    assert kinds == ["RunStep", "CopyStep", "RunStep"]
    first, copy, second = task.build.steps
    assert (first.cwd, second.cwd) == ("/sandbox", "/sandbox")
    assert first.argv[:2] == ("/bin/sh", "-c")
    assert second.env == {"RECORDS": "400"}  # the ARG; the ENV comes after the step
    assert task.env == {"PYTHONDONTWRITEBYTECODE": "1"}  # ARGs are not kept for the episode
    assert list(copy.files) == ["generate.py"]
    assert task.build.timeout == 60.0
    assert len(task.build.key) == 32 and task.build.key == load_task(folder).build.key


@pytest.mark.parametrize(
    ("dockerfile", "message"),
    [
        ("WORKDIR /opt\nRUN true\nWORKDIR /app\n", r":3: a RUN step in /opt, outside the working"),
        ("RUN --mount=type=secret,id=x true\n", r":2: .* needs a RUN --mount=type=secret,id=x"),
        ("RUN <<EOF\n", r":2: .* needs a RUN with a here-document"),
        (
            "WORKDIR /app\nRUN mkdir -p /app/a /tmp/b && cp tool /usr/local/bin/\n",
            r":3: RUN mkdir .*: writes /usr/local/bin/, outside the working folder /app and /tmp",
        ),
        (
            "WORKDIR /app\nRUN echo ok > /app/ok 2>/dev/null && echo x >> /etc/profile\n",
            r":3: RUN echo .*: writes /etc/profile, outside the working folder /app and /tmp",
        ),
    ],
)
def test_steps_that_cannot_run_here_are_refused_on_load(
    tmp_path: Path, dockerfile: str, message: str
) -> None:
    folder = make_task(tmp_path, dockerfile)
    with pytest.raises(UnsupportedEnvironment, match=message):
        load_task(folder)


def test_env_values_expand_and_steps_map_into_the_sandbox(tmp_path: Path) -> None:
    """ENV values stay as written (a session shows /app); a step runs in the preparation
    session, whose working folder is /sandbox."""
    dockerfile = (
        "ARG TOOL=/app/bin\nWORKDIR /app\nENV PATH=/app/bin:$PATH DATA=${TOOL}/data\n"
        "RUN echo /app/x /apple > /app/out.txt\n"
    )
    task = load_task(make_task(tmp_path, dockerfile))
    assert task.env == {"PATH": "/app/bin:/usr/local/bin:/usr/bin:/bin", "DATA": "/app/bin/data"}
    step = task.build.steps[-1]  # type: ignore[union-attr]
    assert step.argv[-1] == "echo /sandbox/x /apple > /sandbox/out.txt"


@needs_sessions
def test_the_example_passes_envhub_check(sandbox: LocalSandbox) -> None:
    folder = Path(__file__).resolve().parents[2] / "examples/harbor/tally-errors"
    [checked] = check_tasks(folder, sandbox=sandbox)
    assert checked.passed and (checked.solved, checked.unsolved) == (1.0, 0.0), checked.error
    copy = shutil.copytree(folder, Path(os.environ["ENVHUB_CACHE"]).parent / "copy")
    assert load_task(copy).build.key == load_task(folder).build.key  # by content, not path


def test_a_step_is_split_into_its_simple_commands() -> None:
    text = (
        "DEBIAN_FRONTEND=noninteractive apt-get install -y a b 2>/dev/null && "
        "(cd x; sudo pip install 'c>=1') | tee log; if true; then echo 'a && b' > f; fi"
    )
    assert simple_commands(text) == [
        [">", "/dev/null"],
        ["apt-get", "install", "-y", "a", "b"],
        ["cd", "x"],
        ["pip", "install", "c>=1"],
        ["tee", "log"],
        ["true"],
        [">", "f"],
        ["echo", "a && b"],
        ["fi"],
    ]
    assert simple_commands("make 2>&1 | tee /tmp/log") == [["make"], ["tee", "/tmp/log"]]
    assert simple_commands("echo 'unbalanced") == []


def test_install_requests_are_read_and_checked() -> None:
    assert apt_request(["-y", "-o", "Dpkg::Options::=--force-confold", "install", "a=1.2*"]) == (
        "install",
        ["a=1.2*"],
    )
    installed = {"a": "1.2.3-1", "b": "2.0"}
    assert missing_apt(["a=1.2*", "b:amd64", "b/bookworm", "a=1.3"], installed) == [
        "a=1.3 (this machine has 1.2.3-1)"
    ]
    assert missing_apt(["c"], installed) == ["c (not installed on this machine)"]
    requirements, problems = pip_request(
        ["--no-cache-dir", "-i", "https://pypi.org/simple", "x==1", ".", "-t", "/opt", "y"]
    )
    assert requirements == ["x==1", "y"]
    assert problems == [
        ". is a path or a URL, not a distribution",
        "-t /opt installs outside the sandbox's python3",
    ]
    meets = [
        ("8.3.4", "==8.3.4"), ("8.3.4", "==8.3.*"), ("8.3.4", ">=8"), ("8.3.4", "~=8.3"),
        ("8.3.4", "<9"), ("8.3.4", "!=8.2.0"), ("2.1.0rc1", ">=2.1"),
    ]  # fmt: skip
    fails = [("8.3.4", "==8.3"), ("8.3.4", "~=8.2.1"), ("8.3.4", "<8.3.4"), ("8.3.4", "!=8.3.*")]
    assert all(_meets(have, spec) for have, spec in meets)
    assert not any(_meets(have, spec) for have, spec in fails)


@needs_sessions
def test_links_stay_in_the_workspace_or_point_into_the_system(
    tmp_path: Path, sandbox: LocalSandbox
) -> None:
    links = "ln -s /usr/bin/env env && mkdir d && ln -s ../env d/up && ln -s /sandbox/env here"
    folder = make_task(tmp_path, f"WORKDIR /app\nRUN {links}\n")
    workspace = prepare(HarborEnv(folder, sandbox=sandbox))
    assert [os.readlink(workspace / n) for n in ("env", "d/up", "here")] == [
        "/usr/bin/env", "../env", "/sandbox/env",
    ]  # fmt: skip
    for target in ("/etc/passwd", "../../../etc/passwd", "/usr/../etc/passwd"):
        escape = make_task(tmp_path / target.replace("/", "_"), f"RUN ln -s {target} leak\n")
        with pytest.raises(UnsupportedEnvironment) as error:
            prepare(HarborEnv(escape, sandbox=sandbox))
        assert str(error.value).startswith(
            f"a RUN step left a link leak -> {target} in the working folder; links must stay "
            "in it or point into /usr/, /bin/"
        )
