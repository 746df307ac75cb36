"""The layout of ``delayq.cli``: commands by role over one shared module, imports pointing one
way. app.py composes the command modules; each command module imports only the shared and
helper modules; none of them reaches back into another from inside a function (the way
outbox.py once imported ``CliError`` from app.py), and each imports on its own."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import delayq.cli

CLI = Path(delayq.cli.__file__).resolve().parent
PACKAGE = "delayq.cli"
SRC = CLI.parents[1]  # the folder holding the delayq package that is under test
# What every command module may import from the CLI: the shared module and the helpers.
SHARED = {"common", "helptext", "outboxdb", "parse", "render"}
# The modules that compose the command modules (and so import them).
ROOTS = {"__init__", "__main__", "app"}


def module_name(stem: str) -> str:
    return PACKAGE if stem == "__init__" else f"{PACKAGE}.{stem}"


STEMS = sorted(path.stem for path in CLI.glob("*.py"))
MODULES = {module_name(stem): CLI / f"{stem}.py" for stem in STEMS}


def imported(node: ast.Import | ast.ImportFrom, importer: str) -> list[str]:
    """The modules an import statement in module ``importer`` names, absolute; a name taken
    from a package is the submodule when the CLI has one of that name."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        package = importer if importer == PACKAGE else importer.rpartition(".")[0]
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1])
        target = f"{base}.{node.module}" if node.module else base
    else:
        target = node.module or ""
    modules = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
    # from . import parse names the module parse, not the package (no edge to __init__)
    return modules if len(modules) == len(node.names) else [target, *modules]


def cli_imports(source: str, importer: str) -> list[tuple[int, str, bool]]:
    """Each import of a ``delayq.cli`` module in ``source``: (line, module, inside a function)."""
    found: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                for name in imported(child, importer):
                    if name == PACKAGE or name.startswith(PACKAGE + "."):
                        found.append((child.lineno, name, in_function))
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            visit(child, inner)

    visit(ast.parse(source), False)
    return found


def graph() -> dict[str, set[str]]:
    """Module to the CLI modules it imports (anywhere in it), by their short names."""
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = {target for _, target, _ in cli_imports(path.read_text(), name)}
        edges[name.removeprefix(PACKAGE).lstrip(".") or "__init__"] = {
            target.removeprefix(PACKAGE).lstrip(".") or "__init__" for target in targets
        }
    return edges


def test_the_check_sees_a_function_local_import_of_a_cli_module() -> None:
    source = (
        "from . import parse\n"
        "def f():\n    from .app import CliError\n"
        "def g():\n    from . import app\n"
        "async def h():\n    import delayq.cli.app\n"
        "def k():\n    from ..outbox import Outbox\n"
    )
    assert cli_imports(source, f"{PACKAGE}.outbox") == [
        (1, f"{PACKAGE}.parse", False),
        (3, f"{PACKAGE}.app", True),
        (5, f"{PACKAGE}.app", True),
        (7, f"{PACKAGE}.app", True),
    ]


def test_no_cli_module_imports_another_inside_a_function() -> None:
    local = [
        f"{path.name}:{line}: {target}"
        for name, path in MODULES.items()
        for line, target, in_function in cli_imports(path.read_text(), name)
        if in_function
    ]
    assert local == [], f"import at module level (common.py is what they share): {local}"


def test_command_modules_import_only_the_shared_ones() -> None:
    edges = graph()
    assert edges["common"] <= SHARED - {"common"}, "common.py imports no command module"
    wrong = {
        stem: sorted(targets - SHARED)
        for stem, targets in edges.items()
        if stem not in ROOTS and targets - SHARED
    }
    assert wrong == {}, "a command module imports only common.py and the helpers"
    assert {"tasks", "views", "repair", "serving", "outbox", "reshard"} <= edges["app"]


def test_the_cli_imports_have_no_cycle() -> None:
    edges = graph()
    state: dict[str, str] = {}  # "open" while on the current path, "done" after

    def walk(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                cycle = [*path[path.index(target) :], target] if target in path else [target]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if target not in state:
                walk(target, [*path, target])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            walk(node, [node])


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_cli_module_imports_in_a_fresh_interpreter(name: str) -> None:
    """Imported first, on its own, each module must work: an order-dependent cycle fails here
    with a partly initialised module."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", f"import {name}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
