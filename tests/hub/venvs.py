"""A fresh virtual environment for install tests and the Hub benchmark."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path


def fresh_venv(folder: Path) -> Path:
    """A new venv whose only link to this one is a .pth line (so pip and envhub's dependencies
    are importable without reinstalling them); returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "_parent_env.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"
    )
    return python
