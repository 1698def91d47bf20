"""The package's layout: no module-level import cycle among rlgraph's modules (a cycle makes a
module fail to import when it happens to be imported first)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[2]


def module_name(path: Path) -> str:
    """`rlgraph/a/b.py` -> `rlgraph.a.b`; a package's `__init__.py` -> the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> nx.DiGraph:
    """Module -> module it imports at module level (function bodies and TYPE_CHECKING blocks
    run later); importing `a.b.c` imports packages `a.b` first; `rlgraph.nodes` imports every
    kind module (its discovery)."""
    modules = {module_name(p): p for p in (ROOT / "rlgraph").rglob("*.py")}
    graph = nx.DiGraph()
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                parts = target.split(".")
                for i in range(2, len(parts) + 1):  # the target and the packages above it
                    dep = ".".join(parts[:i])
                    if dep in modules and dep != name and not name.startswith(dep + "."):
                        graph.add_edge(name, dep)
        if name.startswith("rlgraph.nodes."):
            graph.add_edge("rlgraph.nodes", name)
    return graph


def test_no_module_level_import_cycle() -> None:
    graph = import_graph()
    assert graph.number_of_nodes() > 100  # the whole package was read
    assert list(nx.simple_cycles(graph)) == []
