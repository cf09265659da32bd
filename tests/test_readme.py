"""The README's examples run as written, and CI runs the README's test command."""

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_python_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README, re.DOTALL)
    assert blocks, "README has no python example"
    for block in blocks:  # each in a process of its own: what it registers stays there
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(block)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"README example failed:\n{block}\n{done.stderr}"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    extracted = subprocess.run(
        ["bash", "-c", re.search(r"cmd=\$\((awk .*?)\)\n", ci).group(1)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert extracted == ".venv/bin/python -m pytest"
    assert f"```bash\n{extracted}\n```" in README


def test_public_api_list_matches_lazy_exports():
    import envhub

    assert envhub.__all__ == sorted(envhub._EXPORTS)
    for name in envhub.__all__:
        assert getattr(envhub, name) is not None


def _figures():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import figures
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return figures


def test_the_figures_the_docs_quote_are_the_recorded_ones():
    # What a user saw: the README said the held-out reward went 0.0 -> 0.375; the run gave 0.188.
    figures = _figures()
    artifact = json.loads(figures.ARTIFACT.read_text())
    assert figures.mismatches(figures.DOCS, figures.derived(artifact)) == []
    guides = ("docs/getting-started/setup.md", "docs/getting-started/train-on-cpu.md")
    for doc in ("README.md", *guides):
        keys = {key for key, _ in figures.MARKED.findall((ROOT / doc).read_text())}
        assert keys >= {"quickstart.eval_first", "quickstart.eval_last"}, doc


def test_a_changed_number_is_named(tmp_path):
    figures = _figures()
    artifact = json.loads(figures.ARTIFACT.read_text())
    derived = figures.derived(artifact)
    doc = tmp_path / "README.md"
    doc.write_text(README.replace(
        f"<!--fig quickstart.eval_last-->{derived['quickstart.eval_last']}<!--/fig-->",
        "<!--fig quickstart.eval_last-->0.375<!--/fig-->",
    ))  # fmt: skip
    line = next(n for n, text in enumerate(doc.read_text().splitlines(), 1) if "0.375<" in text)
    assert figures.mismatches([doc], derived) == [
        f"{doc}:{line}: quickstart.eval_last is '0.375', the artifact says "
        f"{derived['quickstart.eval_last']!r}"
    ]
    assert figures.write([doc], derived) == 1 and figures.mismatches([doc], derived) == []
    # A figure the artifact does not have is named too, rather than passed over.
    doc.write_text("<!--fig quickstart.typo-->1<!--/fig-->")
    assert figures.mismatches([doc], derived) == [
        f"{doc}:1: quickstart.typo is '1', the artifact says None"
    ]


def test_a_ci_log_gives_the_test_figures():
    figures = _figures()
    log = "install took 245 s\n+ .venv/bin/python -m pytest\n...\n" + (
        "===== 2691 passed, 46 skipped, 44 warnings in 1570.28s (0:26:10) =====\n"
    )
    read = figures.read_ci_log(log)
    assert {k: v for k, v in read.items() if k != "date"} == {
        "install_s": 245, "passed": 2691, "skipped": 46, "tests_s": 1570.3,
    }  # fmt: skip
    shown = figures._tests(read)
    assert (shown["tests.about"], shown["tests.minutes"], shown["tests.total_minutes"]) == (
        "2,700", "26.2", "30",
    )  # fmt: skip
    failed = log.replace("2691 passed", "1 failed, 2690 passed")
    with pytest.raises(SystemExit, match="did not pass"):
        figures.read_ci_log(failed)
