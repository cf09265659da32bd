"""Harbor tasks in their own images (the container back end): a task that the bubblewrap path
refuses (an Ubuntu base, a RUN apt-get that needs the network) builds on a stand-in named in
every result, its solution scores 1 and nothing scores 0, a model's episode works in /app with
the image's own variables, and the Dockerfile is read only for its image and working folder."""

from __future__ import annotations

import asyncio
import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from envhub.harbor import UnsupportedEnvironment, load_task
from envhub.harbor.check import check_tasks
from envhub.harbor.dockerfile import container_environment, map_images
from envhub.harbor.env import HarborEnv
from envhub.types import assistant

STAND_IN = "localhost/envhub-base:bookworm"
DOCKERFILE = textwrap.dedent("""
    FROM --platform=linux/amd64 ubuntu:24.04
    RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends jq >/dev/null
    ENV GREETING=hello
    WORKDIR /app
    COPY prices.json /app/prices.json
""")
TEST_SH = textwrap.dedent("""
    #!/bin/bash
    mkdir -p /logs/verifier
    want=$(jq '[.[]] | add' /app/prices.json)
    if [ "$(cat /app/total.txt 2>/dev/null)" = "$GREETING $want" ]; then
      echo 1 > /logs/verifier/reward.txt
    else
      echo 0 > /logs/verifier/reward.txt
    fi
""").lstrip()
SOLVE_SH = "#!/bin/bash\necho \"$GREETING $(jq '[.[]] | add' prices.json)\" > total.txt\n"


def make_task(root: Path) -> Path:
    folder = root / "sum-prices"
    for sub in ("environment", "tests", "solution"):
        (folder / sub).mkdir(parents=True)
    (folder / "task.toml").write_text('version = "1.0"\n\n[verifier]\ntimeout_sec = 60.0\n')
    (folder / "instruction.md").write_text(
        "Write $GREETING, a space and the sum of prices.json's values to total.txt.\n"
    )
    (folder / "environment/Dockerfile").write_text(DOCKERFILE)
    (folder / "environment/prices.json").write_text('{"tea": 3, "cake": 4}\n')
    (folder / "tests/test.sh").write_text(TEST_SH)
    (folder / "solution/solve.sh").write_text(SOLVE_SH)
    return folder


def test_the_image_map_replaces_from_lines_as_docker_names_them() -> None:
    text = "FROM docker.io/library/ubuntu:24.04 AS base\nRUN true\nFROM python:3.12-slim\n"
    mapped, used = map_images(text, {"ubuntu:24.04": STAND_IN, "alpine:3": "x"})
    assert mapped == f"FROM {STAND_IN} AS base\nRUN true\nFROM python:3.12-slim\n"
    assert used == {"docker.io/library/ubuntu:24.04": STAND_IN}


def test_the_image_map_reaches_copy_from_an_image_not_a_stage() -> None:
    text = (
        "FROM python:3.12-slim AS build\nCOPY --from=ghcr.io/astral-sh/uv:0.8.15 /uv /bin/\n"
        "COPY --chown=1 --from=build /a /b\n"
    )
    mapped, used = map_images(
        text, {"python:3.12-slim": STAND_IN, "ghcr.io/astral-sh/uv:0.8.15": "uv:local"}
    )
    assert mapped == (
        f"FROM {STAND_IN} AS build\nCOPY --from=uv:local /uv /bin/\n"
        "COPY --chown=1 --from=build /a /b\n"
    )
    assert used == {"python:3.12-slim": STAND_IN, "ghcr.io/astral-sh/uv:0.8.15": "uv:local"}


def test_a_container_reads_only_the_last_stages_image_and_folder(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "FROM golang:1.22 AS build\nWORKDIR /src\nRUN go build ./...\n"
        "FROM ubuntu:24.04\nARG HOME_DIR=/srv\nWORKDIR $HOME_DIR\nWORKDIR app\n"
        "COPY --from=build /src/bin /usr/local/bin/\nRUN curl -fsSL https://x | sh\n"
    )
    environment = container_environment(dockerfile, None)
    assert (environment.image, environment.workdir) == ("ubuntu:24.04", "/srv/app")
    assert container_environment(dockerfile, "/work").workdir == "/work"  # task.toml's first


def test_the_bubblewrap_path_refuses_what_a_container_builds(tmp_path: Path) -> None:
    folder = make_task(tmp_path)
    with pytest.raises(UnsupportedEnvironment, match="sandbox=container"):
        load_task(folder)
    task = load_task(folder, in_container=True)
    assert (task.image, task.workdir, task.files, task.build) == ("ubuntu:24.04", "/app", {}, None)


def test_a_task_checks_in_its_image_on_a_stand_in(require_podman: None, tmp_path: Path) -> None:
    folder = make_task(tmp_path)
    (check,) = check_tasks(folder, sandbox="podman", image_map={"ubuntu:24.04": STAND_IN})
    assert (check.solved, check.unsolved, check.error) == (1.0, 0.0, "")
    assert check.image.startswith("localhost/envhub-build:")
    assert check.image.endswith(
        f"(from environment/Dockerfile; stand-in {STAND_IN} for ubuntu:24.04)"
    )


def test_an_image_that_does_not_build_is_reported_once(
    require_podman: None, tmp_path: Path
) -> None:
    from envhub.harbor.env import UNCAPPED_FILE_MB

    folder = make_task(tmp_path)
    dockerfile = folder / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "RUN echo no such tool && false\n")
    (check,) = check_tasks(folder, sandbox="podman", image_map={"ubuntu:24.04": STAND_IN})
    assert (check.solved, check.unsolved, check.passed) == (None, None, False)
    assert check.error.startswith("SandboxError: ") and check.error.count("SandboxError") == 1
    env = HarborEnv(folder, sandbox="podman")
    try:  # in the task's own container no file size is capped, as in Harbor's
        assert env.limits_for(env.dataset[0]).file_size_mb == UNCAPPED_FILE_MB
    finally:
        env.close()


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_an_episode_works_in_the_tasks_image(require_podman: None, tmp_path: Path) -> None:
    folder = make_task(tmp_path)
    env = HarborEnv(folder, sandbox="podman", image_map={"ubuntu:24.04": STAND_IN})

    async def episode() -> tuple[list[str], float]:
        prompt, _ = await env.areset(options={"task_index": 0})
        seen = []
        for command in ("pwd; echo $GREETING; which jq", SOLVE_SH.split("\n", 1)[1]):
            observation, *_ = await env.astep(_call("bash", command=command))
            seen.append(str(observation[0].content))
        _, reward, terminated, _, _ = await env.astep("done")
        assert terminated
        return [str(prompt[0].content), *seen], reward

    try:
        (system_prompt, probe, _), reward = asyncio.run(episode())
    finally:
        env.close()
    assert "/app" in system_prompt
    assert "/app\nhello\n/usr/bin/jq" in probe
    assert reward == 1.0


def test_a_trajectory_names_the_image_it_ran_in(require_podman: None, tmp_path: Path) -> None:
    from envhub.rollout.runner import RolloutRunner
    from envhub.testing import ByteChatTokenizer, ScriptedEngine

    folder = make_task(tmp_path)
    solve = _call("bash", command=SOLVE_SH.split("\n", 1)[1])

    def policy(messages: list[Any], tools: Any) -> str:
        return solve if not any(m.role == "tool" for m in messages) else "done"

    engine = ScriptedEngine(policy, ByteChatTokenizer())
    runner = RolloutRunner(
        engine, lambda: HarborEnv(folder, sandbox="podman", image_map={"ubuntu:24.04": STAND_IN})
    )
    (trajectory,) = asyncio.run(runner.run([0]))
    assert trajectory.reward == 1.0 and trajectory.info["task"] == "sum-prices"
    assert trajectory.info["image"].endswith(f"stand-in {STAND_IN} for ubuntu:24.04)")


def test_image_map_patterns_come_after_exact_names() -> None:
    from envhub.harbor.dockerfile import mapped_image

    image_map = {"python:3.12-slim": "exact", "python:*": "any-python", "*": "anything"}
    assert mapped_image(image_map, "docker.io/library/python:3.12-slim") == "exact"
    assert mapped_image(image_map, "python:3.11-slim-bookworm") == "any-python"
    assert mapped_image(image_map, "python") == "any-python"  # python:latest
    assert mapped_image(image_map, "ubuntu:24.04") == "anything"
    assert mapped_image({"python:*": "x"}, "ghcr.io/astral-sh/uv:0.8.15") is None
    text = "FROM python:3.12 AS build\nFROM build\nCOPY --from=build /a /b\n"
    assert map_images(text, {"*": "s"}) == (  # stages keep their names
        "FROM s AS build\nFROM build\nCOPY --from=build /a /b\n", {"python:3.12": "s"},
    )  # fmt: skip


PYTHON_TASK = textwrap.dedent("""
    FROM python:3.12-slim
    WORKDIR /app
    RUN python -m pip --version | cut -d' ' -f1 > /opt/pip.txt
""")
PYTHON_TEST = textwrap.dedent("""
    #!/bin/bash
    ok=$( [ "$(cat /opt/pip.txt)" = pip ] && [ "$(cat /app/out.txt 2>/dev/null)" = ok ] && echo 1 || echo 0)
    echo $ok > /logs/verifier/reward.txt
""").lstrip()  # noqa: E501 - a shell line


def test_python_images_build_on_the_python_stand_in(require_podman: None, tmp_path: Path) -> None:
    from envhub.harbor.images import PYTHON_STAND_IN
    from envhub.sandbox.container_engine import ContainerEngine

    if not ContainerEngine("podman").image_exists(PYTHON_STAND_IN):
        missing = f"no image {PYTHON_STAND_IN}: run `bash scripts/container_base.sh`"
        if os.environ.get("ENVHUB_REQUIRE_CONTAINERS") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    folder = make_task(tmp_path)
    (folder / "environment/Dockerfile").write_text(PYTHON_TASK)
    (folder / "tests/test.sh").write_text(PYTHON_TEST)
    (folder / "solution/solve.sh").write_text("#!/bin/bash\npython -c 'print(\"ok\")' > out.txt\n")
    with HarborEnv(folder, sandbox="podman") as env:  # no image map: the default one
        prompt, _ = env.reset(options={"task_index": 0})
        for _ in range(3):  # write the solution, run solve.sh, answer
            reply = env.reference_policy(prompt, env.tool_schemas)
            observation, reward, terminated, *_ = env.step(reply)
            prompt = [*prompt, assistant(reply), *observation]
        assert (terminated, reward) == (True, 1.0)
        assert env.image_description(env.dataset[0]).endswith(
            f"(from environment/Dockerfile; stand-in {PYTHON_STAND_IN} for python:3.12-slim)"
        )
