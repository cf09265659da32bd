"""The README's examples run as written, and CI runs the README's test command."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

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
