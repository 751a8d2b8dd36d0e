"""The architecture's import rules, read from the source: which wing may import which, the torch-free
contract the operator shares, and no import cycles (docs/architecture.md, "Layout")."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "runtime" / "pagoda_runtime"
OPERATOR = ROOT / "operator" / "pagoda_operator"
BENCHMARKS = ROOT / "benchmarks"

# What each wing of the runtime must never import (a prefix of a module name).
FORBIDDEN = {
    "contract": ("pagoda_runtime.",),  # except itself: checked below
    "executor": (
        "pagoda_runtime.server",
        "pagoda_runtime.cli",
        "pagoda_runtime.engine.llm_engine",
        "pagoda_runtime.engine.async_engine",
        "pagoda_runtime.engine.build",
        "pagoda_runtime.engine.llm",
        "pagoda_runtime.loading",
        "pagoda_runtime.bench",
    ),
    "loading": ("pagoda_runtime.server", "pagoda_runtime.cli", "pagoda_runtime.bench"),
    "engine": ("pagoda_runtime.server", "pagoda_runtime.cli", "pagoda_runtime.bench"),
    "parallel": ("pagoda_runtime.server", "pagoda_runtime.cli", "pagoda_runtime.bench"),
    "server": ("pagoda_runtime.cli", "pagoda_runtime.bench"),
}


def _module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module a file names in an import, top level or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: use absolute imports"
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _runtime_modules() -> dict[str, Path]:
    return {_module_name(p, RUNTIME): p for p in RUNTIME.rglob("*.py")}


@pytest.mark.parametrize("wing", sorted(FORBIDDEN))
def test_each_wing_imports_only_what_lies_beneath_it(wing):
    modules = _runtime_modules()
    breaches = []
    for name, path in modules.items():
        if not name.startswith(f"pagoda_runtime.{wing}"):
            continue
        for imported in _imports(path):
            if wing == "contract" and imported.startswith("pagoda_runtime.contract"):
                continue
            if imported.startswith(FORBIDDEN[wing]) and imported in modules | {"pagoda_runtime": None}:
                breaches.append(f"{name} imports {imported}")
    assert not breaches, "\n".join(breaches)


def test_the_operator_imports_only_the_runtime_contract():
    breaches = [
        f"{_module_name(path, OPERATOR)} imports {name}"
        for path in OPERATOR.rglob("*.py")
        for name in _imports(path)
        if name.startswith("pagoda_runtime") and not name.startswith("pagoda_runtime.contract")
    ]
    assert not breaches, "\n".join(breaches)


def test_the_runtime_never_imports_the_repository_tooling():
    """benchmarks/ and tests/ live in the checkout, not in the installed package."""
    breaches = [
        f"{name} imports {imported}"
        for name, path in _runtime_modules().items()
        for imported in _imports(path)
        if imported.split(".")[0] in ("benchmarks", "tests")
    ]
    assert not breaches, "\n".join(breaches)


def test_the_contract_needs_nothing_but_the_standard_library():
    """The operator image installs the contract alone, without the runtime's dependencies."""
    contract = sorted(n for n in _runtime_modules() if n.startswith("pagoda_runtime.contract"))
    code = (
        f"import sys; import {', '.join(contract)}; "
        "third = sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) "
        "- {'pagoda_runtime', '__main__', '__mp_main__'} - {m for m in sys.modules if m.startswith('_')}); "
        "assert not third, third"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_runtime_and_the_benchmarks_have_no_import_cycles():
    modules = _runtime_modules() | {_module_name(p, BENCHMARKS): p for p in BENCHMARKS.glob("*.py")}
    edges = {
        name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()
    }
    # A package's __init__ importing its own members is not a cycle worth forbidding.
    edges = {n: {m for m in e if not n.startswith(m + ".")} for n, e in edges.items()}
    cycles = [c for c in _strongly_connected(edges) if len(c) > 1]
    assert not cycles, cycles


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
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
            found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found
