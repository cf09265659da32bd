"""Running a Harbor task's tests in a session and reading the reward they wrote, as Harbor
reads it: :func:`run_verifier`.

The verifier ends what the session's calls left running (unless told not to: in the task's
own container what the agent started lives on, as in Harbor's), empties the tests' and logs'
folders (whatever the model planted there goes) and ``/tmp``'s test-runner configuration,
copies ``tests/`` in (unless the session's image holds them: a separate verifier's,
:mod:`envhub.harbor.separate`), and runs ``test.sh`` in the working folder. The reward:

- ``reward.json`` first: a JSON object of numbers; the reward is its ``"reward"`` key, or its
  only value, else the mean of its values (every key is also reported as a weight-0
  component);
- else ``reward.txt``: one number.

A CTRF report beside it (``ctrf.json``, as pytest-json-ctrf writes it) adds the components
``tests_passed`` (the fraction of its tests that passed) and ``tests`` (how many ran).
Rewards must lie in [0, 1]; neither file, an empty or malformed one raises
:class:`~envhub.errors.VerifierError` with the end of the script's output.
"""

from __future__ import annotations

import json
import math

from envhub.errors import VerifierError
from envhub.harbor.layout import Layout
from envhub.harbor.task import HarborTask, rewrite_bytes
from envhub.sandbox.base import ExecResult
from envhub.sandbox.session import Session
from envhub.tools.terminal import in_folder
from envhub.workspace_env import Verdict


async def run_verifier(
    session: Session,
    task: HarborTask,
    env: dict[str, str],
    layout: Layout,
    toolchain: str | None = None,
    *,
    kill: bool = True,
    copy_tests: bool = True,
) -> Verdict:
    """Run a task's tests in ``session`` (laid out as ``layout``) and read the reward they
    wrote; ``toolchain``: where the session shows the verifier toolchain, whose commands come
    first on the tests' ``PATH`` (:mod:`envhub.harbor.toolchain`); ``kill``: end what the
    session's calls left running first; ``copy_tests``: copy ``tests/`` in (not when the
    session's image holds them).

    Raises:
        VerifierError: The tests' folders could not be emptied, no reward file, or a malformed
            one (with the script's output's end).
    """
    if kill:
        await session.akill_processes()
    cleared = await session.arun(["/bin/sh", "-c", _CLEAR, "sh", *layout.fresh])
    if not cleared.ok:
        raise VerifierError(f"could not empty {', '.join(layout.fresh)}: {cleared.describe()}")
    if copy_tests:
        await _copy_tests(session, task, layout)
    command = in_folder(layout.workdir, ["bash", f"{layout.tests}/test.sh"])
    if toolchain is not None:
        command = ["/bin/sh", "-c", _WITH_TOOLCHAIN.format(toolchain), "sh", *command]
        env = {**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": f"{toolchain}/wheels"}
    result = await session.arun(
        command,
        wall_time=task.verifier_timeout,
        env={**env, **task.verifier_env, "PYTHONNOUSERSITE": "1"},
    )
    return await read_reward(session, task, result, layout.logs)


async def _copy_tests(session: Session, task: HarborTask, layout: Layout) -> None:
    """Clear ``/tmp``'s test-runner configuration, copy ``tests/`` in (executable, as Harbor
    copies them) and make the logs' folder: one call with the files as a tar on its stdin (each
    call into a container costs an engine ``exec``), or a call per file where the session has
    no ``tar``."""
    files = {name: rewrite_bytes(data, layout.mapping) for name, data in task.tests.items()}
    result = await session.arun(
        ["/bin/sh", "-c", _PREPARE, "sh", layout.tests, layout.logs, *RUNNER_CONFIGS],
        stdin=_tar(files),
    )
    if result.ok:
        return
    if result.exit_code != _NO_TAR:
        raise VerifierError(f"could not copy the tests in: {result.describe()}: {result.stderr}")
    await session.arun(["/bin/sh", "-c", _CLEAR_TMP, "sh", *RUNNER_CONFIGS])
    for name, data in files.items():
        await put_file(session, f"{layout.tests}/{name}", data)
    await session.arun(["chmod", "-R", "a+x", layout.tests])
    await session.arun(["mkdir", "-p", layout.logs])


def _tar(files: dict[str, bytes]) -> bytes:
    """``files`` (relative path -> bytes) as an uncompressed tar."""
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in sorted(files.items()):
            member = tarfile.TarInfo(name)
            member.size, member.mode = len(data), 0o755
            archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def _tail(result: ExecResult) -> str:
    """The end of a command's output (stdout, then stderr)."""
    return (result.stdout + result.stderr).strip()[-500:]


async def read_reward(session: Session, task: HarborTask, result: ExecResult, logs: str) -> Verdict:
    """The reward ``test.sh`` wrote in ``logs`` (Harbor's ``/logs/verifier``):
    ``reward.json`` first, else ``reward.txt``.

    Raises:
        VerifierError: Neither file, or one that does not hold a reward in [0, 1].
    """
    where = task.path / "tests" / "test.sh"
    for name, parse in (("reward.json", _json_reward), ("reward.txt", _text_reward)):
        text = await _get(session, f"{logs}/{name}")
        if text is None:
            continue
        verdict = parse(text, f"{where} wrote {name}")
        if not 0.0 <= verdict.reward <= 1.0:
            raise VerifierError(f"{where} wrote {name} with reward {verdict.reward}, not in [0, 1]")
        ctrf = ctrf_components(await _get(session, f"{logs}/ctrf.json"))
        return Verdict(verdict.reward, {**ctrf, **verdict.components}, _tail(result))
    tail = _tail(result)
    raise VerifierError(
        f"{where} wrote no reward ({result.describe()}): it must write /logs/verifier/reward.txt "
        f"or reward.json. Its output ended with: {tail or '(nothing)'}"
    )


RUNNER_CONFIGS = (
    "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg", "setup.py",
    "conftest.py", "__init__.py",
)  # fmt: skip
"""Files a test runner reads from the folders above its tests: taken out of ``/tmp``."""
# Each folder emptied: made readable first (the model may have locked it), removed (a link
# with it; a mount point stays), made again, then checked empty.
_CLEAR = (
    'for d in "$@"; do if [ -d "$d" ] && [ ! -L "$d" ]; then chmod -R u+rwx -- "$d"; fi; '
    'rm -rf -- "$d" 2>/dev/null; mkdir -p -- "$d" && left=$(ls -A -- "$d") && [ -z "$left" ] '
    "|| exit 1; done"
)
_CLEAR_TMP = 'cd /tmp && rm -rf -- "$@"'
_NO_TAR = 99
_PREPARE = (
    "command -v tar >/dev/null 2>&1 || exit 99; tests=$1 logs=$2; shift 2; "
    '(cd /tmp && rm -rf -- "$@") && mkdir -p -- "$tests" && tar -xf - -C "$tests" '
    '--no-same-owner && chmod -R a+x -- "$tests" && mkdir -p -- "$logs"'
)
_WITH_TOOLCHAIN = 'PATH="{0}/shims:$PATH" exec "$@"'
_PUT = 'mkdir -p -- "$(dirname -- "$1")" && exec cat > "$1"'
_GET = 'if [ -f "$1" ] && [ ! -L "$1" ]; then exec head -c 65536 -- "$1"; fi; exit 102'


async def put_file(session: Session, path: str, data: bytes) -> None:
    """Write a file anywhere the session may (``write_file`` keeps to ``/sandbox``)."""
    result = await session.arun(["/bin/sh", "-c", _PUT, "sh", path], stdin=data)
    if not result.ok:
        raise VerifierError(f"could not write {path} in the session: {result.describe()}")


async def _get(session: Session, path: str) -> str | None:
    """A regular file's text (its first 64 KiB), or ``None`` when there is none."""
    result = await session.arun(["/bin/sh", "-c", _GET, "sh", path])
    return result.stdout if result.ok else None


def ctrf_components(text: str | None) -> dict[str, float]:
    """A CTRF report's (``ctrf.json``, pytest-json-ctrf's) summary as reward components:
    ``tests_passed``, the fraction of its tests that passed, and ``tests``, how many ran
    (none when there is no report, or it is malformed)."""
    try:
        summary = json.loads(text or "")["results"]["summary"]
        total, passed = int(summary["tests"]), int(summary["passed"])
    except (ValueError, TypeError, KeyError):
        return {}
    if total <= 0:
        return {}
    return {"tests_passed": passed / total, "tests": float(total)}


def _text_reward(text: str, where: str) -> Verdict:
    if not text.strip():
        raise VerifierError(f"{where}, but it is empty")
    try:
        value = float(text.strip())
    except ValueError:
        raise VerifierError(f"{where}, but it holds {text.strip()[:80]!r}, not a number") from None
    return Verdict(_finite(value, where))


def _json_reward(text: str, where: str) -> Verdict:
    try:
        data = json.loads(text)
    except ValueError as e:
        raise VerifierError(f"{where}, but it is not JSON ({e})") from None
    if not isinstance(data, dict) or not data:
        raise VerifierError(f"{where}, but it is not a JSON object of numbers")
    values: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise VerifierError(f"{where}, but its {key!r} is {value!r}, not a number")
        values[str(key)] = _finite(float(value), where)
    if "reward" in values:
        main = values["reward"]
    else:
        main = sum(values.values()) / len(values)
    return Verdict(main, {k: v for k, v in values.items() if k != "reward"})


def _finite(value: float, where: str) -> float:
    if not math.isfinite(value):
        raise VerifierError(f"{where}, but its reward is {value}")
    return value
