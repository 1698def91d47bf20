"""Node kinds: one module per kind, discovered here. Adding a kind touches this folder only.

`KINDS` maps a kind name (`generate`, `train`, ...) to its `NodeKind` record; the spec,
the graph builder, the cost pass and the runtime all dispatch through it.
"""

from __future__ import annotations

import importlib
import pkgutil

from rlgraph.nodes.base import NodeKind, NodeSpec

_NOT_KINDS = {"base", "parallel_spec"}


def _discover() -> dict[str, NodeKind]:
    kinds: dict[str, NodeKind] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name in _NOT_KINDS or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        kind = getattr(module, "KIND", None)
        if isinstance(kind, NodeKind):
            kinds[kind.name] = kind
    return dict(sorted(kinds.items()))


KINDS: dict[str, NodeKind] = _discover()

__all__ = ["KINDS", "NodeKind", "NodeSpec"]
