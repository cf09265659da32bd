"""The verifier as published, offline: a task whose tests/test.sh has the common preamble
(apt-get install curl, the uv installer by curl | sh, uvx -p 3.13 -w pytest... -w
pytest-json-ctrf...) scores in a container episode without the network, without being edited;
what the toolchain cannot answer is refused with its line. The check of such a task (solution 1,
nothing 0, offline) is its row in tests/harbor/test_datasets.py's dataset, not repeated here."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path

import pytest

from envhub.harbor import UnsupportedEnvironment, load_task
from envhub.harbor.check import check_tasks
from envhub.harbor.env import HarborEnv
from envhub.harbor.toolchain import read_needs
from envhub.harbor.verifier import ctrf_components, run_verifier

STAND_IN = "localhost/envhub-base:bookworm"
PREAMBLE = textwrap.dedent("""
    #!/bin/bash
    apt-get update
    apt-get install -y curl

    curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh
    source $HOME/.local/bin/env

    uvx \\
      -p 3.13 \\
      -w pytest==8.4.1 \\
      -w pytest-json-ctrf==0.3.5 \\
      pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA

    if [ $? -eq 0 ]; then
      echo 1 > /logs/verifier/reward.txt
    else
      echo 0 > /logs/verifier/reward.txt
    fi
""").lstrip()
TEST_OUTPUTS = textwrap.dedent("""
    from pathlib import Path


    def test_count_file_exists():
        assert Path("/app/count.txt").exists()


    def test_count_is_right():
        assert Path("/app/count.txt").read_text().strip() == "6"
""")


def make_task(root: Path, name: str = "count-words", test_sh: str = PREAMBLE) -> Path:
    """A task in the published shape: an Ubuntu base, the preamble, pytest tests."""
    folder = root / name
    for sub in ("environment", "tests", "solution"):
        (folder / sub).mkdir(parents=True)
    (folder / "task.toml").write_text('version = "1.0"\n\n[verifier]\ntimeout_sec = 120.0\n')
    (folder / "instruction.md").write_text("Write the number of words of poem.txt to count.txt.\n")
    (folder / "environment/Dockerfile").write_text(
        "FROM ubuntu:24.04\nWORKDIR /app\nCOPY poem.txt /app/poem.txt\n"
    )
    (folder / "environment/poem.txt").write_text("roses are red\nviolets are blue\n")
    (folder / "tests/test.sh").write_text(test_sh)
    (folder / "tests/test_outputs.py").write_text(TEST_OUTPUTS)
    (folder / "solution/solve.sh").write_text("#!/bin/bash\nwc -w < poem.txt > count.txt\n")
    return folder


def test_the_preamble_is_read_for_what_it_fetches(tmp_path: Path) -> None:
    script = PREAMBLE + "uv add requests==2.32.4 'flask>=3' && uv run pytest\npip install rich\n"
    needs = read_needs({"test.sh": script.encode(), "x.py": b"curl http://a.b"}, tmp_path)
    assert needs.requirements == (
        "pytest==8.4.1", "pytest-json-ctrf==0.3.5", "requests==2.32.4", "flask>=3", "rich",
    )  # fmt: skip
    assert needs.apt_packages == ("curl",)
    assert needs.problems == ()
    assert needs.uses


def test_wheels_may_need_any_glibc_up_to_the_images() -> None:
    from envhub.harbor.toolchain import platforms

    assert platforms(19) == ["manylinux_2_19_x86_64", "manylinux_2_18_x86_64",
                             "manylinux_2_17_x86_64"]  # fmt: skip
    assert len(platforms(36)) == 20 and platforms(36)[0] == "manylinux_2_36_x86_64"


def test_redirections_name_files_not_packages() -> None:
    script = (
        b"python3 -m pip install -q pytest==9.0.3 2>/dev/null || true\n"
        b"apt-get install -y curl >/dev/null 2>&1\n"
        b"apt-get install -y jq > apt.log\n"
        b"uvx --from harbor-rewardkit==0.1 rewardkit &> out.txt\n"
    )
    needs = read_needs({"test.sh": script}, Path("/tests"))
    assert needs.requirements == ("pytest==9.0.3", "harbor-rewardkit==0.1")
    assert needs.apt_packages == ("curl", "jq")


def test_a_download_the_toolchain_cannot_answer_is_refused_at_load(tmp_path: Path) -> None:
    extra = "curl -fsSL https://example.com/data.tar.gz | tar xz\n"
    folder = make_task(tmp_path, test_sh=PREAMBLE + extra)
    with pytest.raises(UnsupportedEnvironment) as refused:
        load_task(folder, in_container=True)
    line = len(PREAMBLE.splitlines()) + 1
    assert str(refused.value).startswith(
        f"{folder / 'tests' / 'test.sh'} line {line}: {extra.strip()}: downloads "
        "https://example.com/data.tar.gz; the verifier runs without the network;"
    )


def test_ctrf_summaries_become_components() -> None:
    report = {"results": {"summary": {"tests": 4, "passed": 3, "failed": 1}, "tests": []}}
    assert ctrf_components(json.dumps(report)) == {"tests_passed": 0.75, "tests": 4.0}
    assert ctrf_components("{not json") == {} and ctrf_components(None) == {}


@pytest.fixture(scope="module")
def preamble_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_task(tmp_path_factory.mktemp("toolchain"))


@pytest.mark.usefixtures("require_podman")
def test_the_ctrf_report_gives_components(preamble_task: Path) -> None:
    with HarborEnv(preamble_task, sandbox="podman", image_map={"ubuntu:24.04": STAND_IN}) as env:
        verdict = asyncio.run(_verify_half_done(env))
    assert verdict.reward == 0.0
    assert verdict.components == {"tests_passed": 0.5, "tests": 2.0}


async def _verify_half_done(env: HarborEnv):
    (key,) = env.tasks
    row = {"info": {"id": key}}
    workspace = await env.prepare_workspace(row)
    async with env.session_for(env.sandbox, workspace, row) as session:
        await session.arun(["/bin/sh", "-c", "echo 7 > /app/count.txt"])
        network = await session.arun(["/bin/sh", "-c", "ls /sys/class/net"])
        assert network.stdout.split() == ["lo"]  # the verifier really runs offline
        task, layout = env.task_of(row), env.layout(row)
        return await run_verifier(session, task, {}, layout, env.toolchain_mount(row))


@pytest.mark.usefixtures("require_podman")
def test_an_apt_package_the_image_lacks_is_refused_at_check(tmp_path: Path) -> None:
    script = PREAMBLE.replace("apt-get install -y curl", "apt-get install -y curl jq")
    folder = make_task(tmp_path, test_sh=script)
    (folder / "environment/Dockerfile").unlink()
    (folder / "task.toml").write_text('[environment]\ndocker_image = "ubuntu:24.04"\n')
    (check,) = check_tasks(folder, sandbox="podman", image_map={"ubuntu:24.04": STAND_IN})
    assert not check.passed
    assert check.error == (
        f"UnsupportedEnvironment: {folder / 'tests'}: apt-get install jq: not in the task's "
        "image; the verifier runs without the network; make the image hold what the tests "
        "need (a RUN step in the task's Dockerfile), or run the task where its container has "
        "the network"
    )
