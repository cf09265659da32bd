"""Wheels and dependencies the install guard's tests write (shared by test_install_guard and
test_make, which import it at their top, as they import hub_server and venvs)."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path


def write_wheel(folder: Path, name: str, version: str) -> None:
    """A minimal pure-Python wheel of ``name`` at ``version``."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


def requiring(package: Path, *requirements: str) -> None:
    """Add ``requirements`` to the package's dependencies."""
    pyproject = package / "pyproject.toml"
    text = pyproject.read_text()
    deps = json.loads(re.search(r"^dependencies = (\[.*\])$", text, re.M)[1])
    pyproject.write_text(text.replace(json.dumps(deps), json.dumps([*deps, *requirements])))
