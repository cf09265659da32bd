"""``envhub serve path/file.py:Class``: an env written in a file is served like an installed one,
and reached by its env's name (the file's stem when the class has no ``name``)."""

from __future__ import annotations

from pathlib import Path

import envhub
from envhub.checks.checker import check_env
from tests.file_envs import write_env_file


def test_a_file_env_is_served_under_its_name(serve, tmp_path: Path) -> None:
    path = write_env_file(tmp_path)
    running = serve(f"{path}:LookupSum")
    with envhub.make(running.url(env="lookup_sum")) as remote:
        observation, _ = remote.reset(seed=0, options={"task_index": 1})
        assert observation[-1].content == "What do one plum and one fig cost together?"
        assert [t["function"]["name"] for t in remote.tool_schemas] == ["lookup", "add"]
    report = check_env(envhub.make(running.url(env="lookup_sum")), raise_on_failure=False)
    assert report.passed, str(report)
