"""The engine's modules depend on each other one way: no import cycle inside ``featurelake/``.

The graph is built from the AST, so imports inside functions (lazy imports) count as edges too;
only imports under ``if TYPE_CHECKING:`` do not, because they never run.
``from featurelake import x`` is an edge to ``featurelake.x`` when ``x`` is a submodule, and to the
package ``featurelake`` otherwise.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "featurelake"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

# Cycles tolerated, as sorted tuples of module names. Keep it empty: break a new cycle instead.
ALLOWED_CYCLES: set[tuple[str, ...]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """Every featurelake module that ``module`` imports anywhere, outside ``if TYPE_CHECKING:``."""
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = resolve(alias.name)
                if target:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if sub in modules else resolve(base)
                if target:
                    found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module name -> featurelake modules it imports."""
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    modules = set(files)
    return {
        name: _imports(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py", modules)
        for name, path in files.items()
    }


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the components with more than one module (each one holds a cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return components


def a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One concrete cycle inside a component, as a path that returns to its start."""
    members = set(component)
    start = component[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if w not in parents:
                    parents[w] = v
                    nxt.append(w)
        frontier = nxt
    return component


def test_graph_sees_lazy_and_submodule_imports() -> None:
    """The checker itself: a lazy import inside a function and ``from pkg import sub`` are edges."""
    modules = {"featurelake", "featurelake.a", "featurelake.b", "featurelake.c"}
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "from featurelake import b, errors_name\n"
        "if TYPE_CHECKING:\n    from featurelake.c import X\n"
        "def f():\n    from featurelake.c import y\n"
    )
    assert _imports(tree, "featurelake.a", False, modules) == {"featurelake.b", "featurelake", "featurelake.c"}
    tree = ast.parse("if TYPE_CHECKING:\n    from featurelake.c import X\n")
    assert _imports(tree, "featurelake.a", False, modules) == set()
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert a_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert "featurelake.table" in graph
    cycles = {tuple(c) for c in strongly_connected(graph)}
    unexpected = cycles - ALLOWED_CYCLES
    report = "\n".join(" -> ".join(a_cycle(graph, list(c))) + f"   (component: {', '.join(c)})" for c in sorted(unexpected))
    assert not unexpected, f"import cycles inside featurelake/:\n{report}"
    stale = ALLOWED_CYCLES - cycles
    assert not stale, f"allow-listed cycles that are gone, remove them: {stale}"
