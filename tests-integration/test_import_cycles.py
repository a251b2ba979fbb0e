"""No import cycle among the modules of any package (issue 23).

Every ``import`` and ``from ... import`` in a package's source counts, wherever it sits:
at module level, inside a function (a lazy import), or under ``if TYPE_CHECKING:``. Two
kinds do not: a module importing a package it is part of (the package is always
imported first), and imports under ``if __name__ == "__main__":`` (they run only when the
module is the program, as another module object).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "packages").glob("*/src"))

#: Cycles left to their package's owners, through ``if TYPE_CHECKING:`` imports only.
#: Each entry is the sorted module list of one strongly connected component.
KNOWN: set[tuple[str, ...]] = {
    ("nvrx.straggler._drift", "nvrx.straggler._report", "nvrx.straggler.report_format"),
}


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for src in SOURCES:
        for path in src.rglob("*.py"):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_main_guard(node: ast.AST) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    left, right = node.test.left, node.test.comparators
    return (
        isinstance(left, ast.Name)
        and left.id == "__name__"
        and len(right) == 1
        and isinstance(right[0], ast.Constant)
        and right[0].value == "__main__"
    )


def _imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    out: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if _is_main_guard(node):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The module names an import statement may load."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join([*base, *([node.module] if node.module else [])])
    else:
        prefix = node.module or ""
    return [prefix, *(f"{prefix}.{alias.name}" for alias in node.names)]


def import_graph() -> dict[str, set[str]]:
    """Each module of the packages and the modules of the packages it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        deps = set()
        for node in _imports(tree):
            for target in _targets(module, path.name == "__init__.py", node):
                if target in modules and target != module and not module.startswith(f"{target}."):
                    deps.add(target)
        graph[module] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(tuple(sorted(component)))
    return found


def test_the_cycle_finder_finds_a_cycle_and_nothing_else() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [("a", "b", "c")]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_every_package_is_scanned() -> None:
    graph = import_graph()
    for package in ("nvrx.ft", "nvrx.launcher", "nvrx.straggler", "nvrx.ptl"):
        assert package in graph, package
    # A lazy (function-level) import counts: the launcher's CLI module imports the agent.
    assert "nvrx.launcher._agent" in graph["nvrx.launcher._launch"]


@pytest.mark.parametrize("source", SOURCES, ids=[s.parent.name for s in SOURCES])
def test_no_import_cycle(source: pathlib.Path) -> None:
    graph = import_graph()
    packages = {
        p.parent.relative_to(source).as_posix().replace("/", ".")
        for p in source.glob("*/*/__init__.py")
    }
    mine = [
        c for c in cycles(graph) if any(c[0].startswith(f"{p}.") or c[0] == p for p in packages)
    ]
    unexpected = [c for c in mine if c not in KNOWN]
    assert not unexpected, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in unexpected)
