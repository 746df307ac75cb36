"""No import cycle anywhere in ``delayq``: a module that imports another which (at module
level or inside a function) imports it back only works in one import order, and a
function-local import that hides a cycle is still one (``delayq.listen`` once hid
``_workers.background`` <-> the workers that way). Imports under ``if TYPE_CHECKING:`` never
run and are left out."""

from __future__ import annotations

import ast
from pathlib import Path

import delayq

ROOT = Path(delayq.__file__).resolve().parent
PACKAGE = "delayq"


def module_name(path: Path) -> str:
    parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def imported(node: ast.Import | ast.ImportFrom, importer: str) -> list[str]:
    """The delayq modules an import statement of ``importer`` names, absolute: a name taken
    from a package is its submodule when there is one (``from . import parse``), else the
    package itself (its ``__init__`` runs)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        package = importer if is_package(importer) else importer.rpartition(".")[0]
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1])
        target = f"{base}.{node.module}" if node.module else base
    else:
        target = node.module or ""
    modules = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
    return modules if len(modules) == len(node.names) else [target, *modules]


def is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
    )


def imports_of(source: str, importer: str) -> set[str]:
    """Every delayq module ``source`` imports when it runs (anywhere but TYPE_CHECKING)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if is_type_checking(child):
                for orelse in getattr(child, "orelse", []):
                    visit(orelse)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.update(
                    name
                    for name in imported(child, importer)
                    if name in MODULES and name != importer
                )
            visit(child)

    visit(ast.parse(source))
    return found


def graph() -> dict[str, set[str]]:
    return {name: imports_of(path.read_text(), name) for name, path in MODULES.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``edges``: each group of modules that reach one another
    (strongly connected, Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = [stack.pop()]
            while group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_check_sees_a_cycle_through_a_function_local_import() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert cycles(edges) == [["a", "b", "c"], ["d", "e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    source = (
        "from typing import TYPE_CHECKING\n"
        "from .common import x\n"
        "if TYPE_CHECKING:\n    from .thread_worker import Worker\n"
        "def f():\n    from .async_worker import AsyncWorker\n"
    )
    assert imports_of(source, "delayq._workers.background") == {
        "delayq._workers.common",
        "delayq._workers.async_worker",
    }


def test_delayq_has_no_import_cycle() -> None:
    found = cycles(graph())
    assert found == [], f"import cycles (the modules of each import one another): {found}"


def test_the_workers_import_in_one_direction() -> None:
    edges = graph()
    background = edges["delayq._workers.background"]
    assert not background & {"delayq._workers.thread_worker", "delayq._workers.async_worker"}
    assert "delayq._workers.background" in edges["delayq._workers.thread_worker"]
