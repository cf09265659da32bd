"""Where a Harbor task's paths are in a session: shown at their own place by the local backend,
mapped into /sandbox by a backend that shows no other folder (e2b)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from envhub.harbor.layout import Layout, layout_for
from envhub.sandbox import LocalSandbox, bwrap_problem
from envhub.sandbox.e2b import E2BSandbox
from envhub.sandbox.session import SessionPaths

needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason="needs bubblewrap")


@pytest.fixture(scope="module")
def local() -> Iterator[LocalSandbox]:
    with LocalSandbox(base_uid=61570, max_concurrency=1, warm=0) as box:
        yield box


@needs_bwrap
def test_the_local_backend_shows_the_tasks_paths(local: LocalSandbox) -> None:
    assert layout_for("/app", local) == Layout(
        workdir="/app",
        tests="/tests",
        logs="/logs/verifier",
        solution="/solution",
        fresh=("/tests", "/logs"),
        paths=SessionPaths(workdir=("/app",), folders=("/tests", "/solution", "/logs")),
        mapping={},
    )


@needs_bwrap
@pytest.mark.parametrize("workdir", ["/usr/src/app", "/tmp/app", "/tests/app", "/logs"])
def test_a_working_folder_the_session_cannot_show_is_mapped_alone(
    local: LocalSandbox, workdir: str
) -> None:
    layout = layout_for(workdir, local)
    assert (layout.workdir, layout.tests, layout.mapping) == (
        "/sandbox",
        "/tests",
        {workdir: "/sandbox"},
    )
    assert layout.paths == SessionPaths(folders=("/tests", "/solution", "/logs"))


@needs_bwrap
def test_a_working_folder_at_the_root_is_the_workspace(local: LocalSandbox) -> None:
    layout = layout_for("/", local)
    assert (layout.workdir, layout.paths.workdir, layout.mapping) == ("/sandbox", (), {})


def test_a_backend_that_shows_nothing_gets_the_paths_mapped() -> None:
    box = E2BSandbox(debug=True, sandbox_url="http://127.0.0.1:9", http_version="1.1")
    layout = layout_for("/app", box)
    assert layout == Layout(
        workdir="/sandbox",
        tests="/sandbox/.harbor/tests",
        logs="/sandbox/.harbor/logs/verifier",
        solution="/sandbox/.harbor/solution",
        fresh=("/sandbox/.harbor",),
        paths=SessionPaths(),
        mapping={
            "/tests": "/sandbox/.harbor/tests",
            "/logs/verifier": "/sandbox/.harbor/logs/verifier",
            "/solution": "/sandbox/.harbor/solution",
            "/app": "/sandbox",
        },
    )
    assert not layout.shown


@needs_bwrap
def test_a_local_sandbox_that_cannot_show_them_maps_the_verifier_out_of_the_workspace() -> None:
    """A local session's /tmp lasts the session: a mapped verifier's folder is /tmp/.harbor."""
    if os.path.exists("/tests"):
        pytest.skip("this machine has a /tests folder")
    with LocalSandbox(base_uid=61575, max_concurrency=1, warm=0, ro_binds=("/tests",)) as box:
        layout = layout_for("/app", box)
    assert (layout.tests, layout.logs, layout.fresh) == (
        "/tmp/.harbor/tests",
        "/tmp/.harbor/logs/verifier",
        ("/tmp/.harbor",),
    )
    assert layout.mapping["/app"] == "/sandbox" and not layout.shown
