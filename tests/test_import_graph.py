"""envhub's modules import one another without cycles, and the layers import downwards only.

The graph is read with ``ast`` (nothing is imported): a module's edges are the envhub modules it
names in an import statement at its top level, under ``if TYPE_CHECKING:`` included (a cycle
that only type checkers follow still ties two modules into one). ``from package import name``
is an edge to ``package.name`` when that is a module, else to ``package``. A package's
``__init__`` is not implied by importing one of its modules.

The layers (docs/developers/architecture.md): the SDK (``envhub/``) <- the trainer
(``trainer/``, installed as ``envhub.trainer``) <- the CLI (``cli/``, ``envhub.cli``). A module
never imports a layer above its own, neither at the top nor inside a function.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "envhub": ROOT / "envhub",
    "envhub.trainer": ROOT / "trainer",
    "envhub.cli": ROOT / "cli",
}
LAYERS = ("envhub", "envhub.trainer", "envhub.cli")
"""Lowest first: a module may import its own layer and those before it."""

KNOWN_CYCLES: set[frozenset[str]] = set()
KNOWN_FUNCTION_CYCLES: set[frozenset[str]] = set()
KNOWN_UPWARD: set[tuple[str, str]] = set()

Graph = dict[str, set[str]]


def modules(packages: dict[str, Path]) -> dict[str, Path]:
    """Every module of ``packages`` (dotted name -> file); nested mapped packages excluded."""
    found = {}
    for package, folder in packages.items():
        nested = {
            Path(*p[len(package) + 1 :].split(".")) for p in packages if p.startswith(f"{package}.")
        }
        for path in folder.rglob("*.py"):
            relative = path.relative_to(folder).with_suffix("")
            if any(relative.is_relative_to(n) for n in nested):
                continue
            parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
            found[".".join((package, *parts))] = path
    return found


def _statements(tree: ast.Module, inside_functions: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements at the module's top level (in its ``if``/``try`` blocks too), or
    anywhere in it."""
    if inside_functions:
        yield from (n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom))
        return
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If | ast.Try):
            todo += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
            todo += [s for handler in getattr(node, "handlers", []) for s in handler.body]


def _named(node: ast.Import | ast.ImportFrom, package: str) -> Iterator[tuple[str, str]]:
    """``(module, name)`` pairs a statement names: ``name`` may be a submodule of ``module``."""
    if isinstance(node, ast.Import):
        yield from ((alias.name, "") for alias in node.names)
        return
    origin = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        origin = ".".join([*anchor, *([origin] if origin else [])])
    yield from ((origin, alias.name) for alias in node.names)


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The module ``name`` runs: itself, or the nearest package above it that is known."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(known: dict[str, Path], inside_functions: bool = False) -> Graph:
    """Each module's edges to the other modules of ``known``."""
    graph: Graph = {}
    for module, path in known.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges = set()
        for node in _statements(ast.parse(path.read_text(encoding="utf-8")), inside_functions):
            for origin, name in _named(node, package):
                submodule = f"{origin}.{name}"
                edges.add(submodule if name and submodule in known else _resolve(origin, known))
        graph[module] = edges - {None, module}
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = stack[stack.index(node) :]
                    del stack[stack.index(node) :]
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in stack:
                low[node] = min(low[node], index[child])
    return found


def describe(component: list[str], graph: Graph) -> str:
    """A cycle's modules with the edges that close it."""
    members = set(component)
    return "\n".join(f"  {m} -> {', '.join(sorted(graph[m] & members))}" for m in component)


def _layer(module: str) -> int:
    return max(
        i for i, layer in enumerate(LAYERS) if module == layer or module.startswith(f"{layer}.")
    )


def upward_imports(graph: Graph) -> set[tuple[str, str]]:
    """``(importer, imported)`` where the imported module is in a higher layer."""
    return {(m, t) for m, edges in graph.items() for t in edges if _layer(t) > _layer(m)}


def test_no_import_cycle_type_only_imports_included() -> None:
    graph = import_graph(modules(PACKAGES))
    found = cycles(graph)
    new = [c for c in found if frozenset(c) not in KNOWN_CYCLES]
    assert not new, "import cycles:\n" + "\n".join(describe(c, graph) for c in new)
    assert {frozenset(c) for c in found} == KNOWN_CYCLES, "a known cycle is gone: drop its entry"


def test_no_new_cycle_through_imports_inside_functions() -> None:
    graph = import_graph(modules(PACKAGES), inside_functions=True)
    found = {frozenset(c) for c in cycles(graph)}
    new = [sorted(c) for c in found - KNOWN_FUNCTION_CYCLES]
    assert not new, "import cycles through functions:\n" + "\n".join(
        describe(c, graph) for c in new
    )
    assert found == KNOWN_FUNCTION_CYCLES, "a known cycle is gone: drop its entry"


def test_layers_import_downwards_only() -> None:
    upward = upward_imports(import_graph(modules(PACKAGES), inside_functions=True))
    assert upward - KNOWN_UPWARD == set(), "imports of a higher layer"
    assert upward == KNOWN_UPWARD, "a known upward import is gone: drop its entry"


def test_a_cycle_through_type_checking_is_found(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import B\nfrom pkg import c\n")
    (tmp_path / "pkg" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n"
    )
    (tmp_path / "pkg" / "c.py").write_text("def f():\n    import pkg.a\n")
    graph = import_graph(modules({"pkg": tmp_path / "pkg"}))
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b", "pkg.c"}, "pkg.b": {"pkg.a"}, "pkg.c": set()}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    assert describe(["pkg.a", "pkg.b"], graph) == "  pkg.a -> pkg.b\n  pkg.b -> pkg.a"
    inside = import_graph(modules({"pkg": tmp_path / "pkg"}), inside_functions=True)
    assert cycles(inside) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_the_layers_are_told_apart() -> None:
    graph = {"envhub.env": {"envhub.trainer.loop"}, "envhub.trainer.loop": {"envhub.cli.app"}}
    graph["envhub.cli.app"] = {"envhub.env"}
    assert upward_imports(graph) == {
        ("envhub.env", "envhub.trainer.loop"),
        ("envhub.trainer.loop", "envhub.cli.app"),
    }
