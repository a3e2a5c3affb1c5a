"""The import graph: no cycle, and every import points down the layers of docs/architecture.md.

Imports are read with `ast` from every module of the package, function-level imports included (a cycle
hidden in a function is still a cycle); imports under `if TYPE_CHECKING:` are annotations only and skipped.
Function-level imports of the project's own modules are allowed only in the faces that keep start-up
light (`cli.py`, the package's `__init__.py`, the pytest plugin).

Run alone: `python -m pytest tests/test_layering.py`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Source folder → package name it is installed as (pyproject.toml's package-dir).
SOURCES = {"scalify_hlo": "scalify_hlo", "parsers": "scalify_hlo.parsers", "rules": "scalify_hlo.rules"}

# Bottom to top. A module belongs to the layer of its longest matching prefix; it may import its own layer
# and the layers below.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("ir", ("scalify_hlo.ir",)),
    ("op declarations", ("scalify_hlo.ops.elementwise", "scalify_hlo.ops.reducers", "scalify_hlo.ops.attrs")),
    ("report", ("scalify_hlo.report",)),
    ("layout", ("scalify_hlo.layout",)),
    ("parsers", ("scalify_hlo.parsers",)),
    ("numeric", ("scalify_hlo.numeric",)),
    ("terms", ("scalify_hlo.terms",)),
    ("rules", ("scalify_hlo.rules",)),
    ("op registry", ("scalify_hlo.ops.registry", "scalify_hlo.ops")),
    ("prove", ("scalify_hlo.prove",)),
    ("faces", ("scalify_hlo.api", "scalify_hlo.audit", "scalify_hlo.cli", "scalify_hlo.jax",
               "scalify_hlo.passes", "scalify_hlo.__main__", "scalify_hlo.pytest_plugin", "scalify_hlo")),
]
# The pytest plugin is loaded by every pytest run in the environment: it loads jax only for a test that asks.
LAZY_ALLOWED = {"scalify_hlo", "scalify_hlo.cli", "scalify_hlo.pytest_plugin"}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in SOURCES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts))
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _layer(module: str) -> int:
    best = max(((len(p), i) for i, (_, prefixes) in enumerate(LAYERS) for p in prefixes
                if module == p or module.startswith(p + ".")), default=None)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best[1]


def _imports(module: str) -> Iterator[tuple[str, int, bool]]:
    """(imported project module, line, at function level) for every import outside TYPE_CHECKING."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    top = {id(n) for n in tree.body}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            origin = ".".join([*base, node.module] if node.module else base)
            targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in MODULES else origin for a in node.names]
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t != module:
                yield t, node.lineno, id(node) not in top


GRAPH = {m: sorted({t for t, _, _ in _imports(m)}) for m in MODULES}


def test_every_module_has_a_layer() -> None:
    for m in MODULES:
        _layer(m)


def test_no_import_cycle() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                cycles.append(sorted([v, *component]))

    for m in sorted(MODULES):
        if m not in index:
            visit(m)
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module: str) -> None:
    mine = _layer(module)
    upward = [f"line {line}: {t} ({LAYERS[_layer(t)][0]})" for t, line, _ in _imports(module) if _layer(t) > mine]
    assert not upward, f"{module} ({LAYERS[mine][0]}) imports upward: {upward}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_project_imports_at_top_level(module: str) -> None:
    if module in LAZY_ALLOWED:
        return
    lazy = [f"line {line}: {t}" for t, line, inner in _imports(module) if inner]
    assert not lazy, f"{module} imports project modules inside functions (hidden cycles): {lazy}"
