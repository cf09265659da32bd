"""The SDK core imports in one direction: types -> state -> rewards -> rows -> env -> rollout.

A module may import its own layer and the ones before it, never a later one: not at the top,
not under ``TYPE_CHECKING``, not inside a function, and not through another envhub module (the
imports are followed from module to module). A package's ``__init__`` is not followed: importing
``envhub.rewards.rubric`` runs ``envhub/__init__.py``, but its imports are lazy re-exports.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = (
    "envhub.types",
    "envhub.state",
    "envhub.rewards",
    "envhub.rows",
    "envhub.env",
    "envhub.rollout",
)


def _layer(module: str) -> int | None:
    for i, layer in enumerate(LAYERS):
        if module == layer or module.startswith(layer + "."):
            return i
    return None


def _source(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _module_of(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(root: Path, module: str) -> set[str]:
    """The envhub modules that ``module`` names in any import statement, anywhere in it."""
    path = _source(root, module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            named.add(origin)
            named.update(f"{origin}.{alias.name}" for alias in node.names)
    return {m for m in named if m.startswith("envhub.") and _source(root, m) is not None}


def backward_imports(root: Path) -> list[str]:
    """Every chain by which a core module reaches a module of a later layer."""
    core = sorted(
        _module_of(root, path)
        for path in (root / "envhub").rglob("*.py")
        if _layer(_module_of(root, path)) is not None
    )
    found = []
    for start in core:
        chains = {start: [start]}
        todo = [start]
        while todo:
            module = todo.pop()
            for target in sorted(_imports(root, module) - chains.keys()):
                chains[target] = [*chains[module], target]
                layer = _layer(target)
                if layer is not None and layer > _layer(start):
                    found.append(" -> ".join(chains[target]))
                else:
                    todo.append(target)
    return found


def test_every_layer_has_modules():
    modules = {_module_of(ROOT, p) for p in (ROOT / "envhub").rglob("*.py")}
    for layer in LAYERS:
        assert any(_layer(m) == LAYERS.index(layer) for m in modules), layer


def test_the_sdk_core_imports_in_one_direction():
    assert backward_imports(ROOT) == []


def test_a_backward_import_is_found(tmp_path: Path):
    files = {
        "envhub/__init__.py": "from envhub.rollout import runner\n",
        "envhub/types.py": "",
        "envhub/state.py": "from envhub.types import Message\n",
        "envhub/helpers.py": "import envhub.env\n",
        "envhub/rewards/__init__.py": "",
        "envhub/rewards/rubric.py": (
            "from typing import TYPE_CHECKING\n"
            "from envhub.state import State\n"
            "if TYPE_CHECKING:\n    from envhub.env import Env\n"
        ),
        "envhub/rewards/match.py": "def f():\n    from envhub.helpers import x\n",
        "envhub/rows.py": "from .rewards import match\n",
        "envhub/env.py": "from envhub import rows\nfrom envhub.helpers import x\n",
        "envhub/rollout/__init__.py": "",
        "envhub/rollout/runner.py": "from envhub.env import Env\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert backward_imports(tmp_path) == [
        "envhub.rewards.match -> envhub.helpers -> envhub.env",
        "envhub.rewards.rubric -> envhub.env",
        "envhub.rows -> envhub.rewards.match -> envhub.helpers -> envhub.env",
    ]
