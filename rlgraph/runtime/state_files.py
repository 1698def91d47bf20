"""Python state as JSON plus safetensors: what a checkpoint stores instead of a pickle.

`split(obj)` turns nested dicts, lists, tuples, numbers, strings, numpy values and torch
tensors into a JSON-able tree whose tensors are replaced by `{"__tensor__": key}`, and the
tensors by key (for one safetensors file); `join(tree, tensors)` rebuilds the object. Loading
runs no code: JSON and safetensors hold data only. Dicts whose keys are not all plain strings
(an optimizer's `state` is keyed by parameter index) and tuples keep their type through a
tagged form; non-finite floats through `{"__float__": "nan"}`.
"""

from __future__ import annotations

import math
from typing import Any

TAGS = ("__tensor__", "__ndarray__", "__tuple__", "__items__", "__float__")


class StateFormatError(ValueError):
    """A value a checkpoint cannot hold, or a tree that is not one `split` wrote."""


def split(obj: Any, prefix: str = "t") -> tuple[Any, dict[str, Any]]:
    """(JSON-able tree, {key: tensor}) of `obj` (see the module docstring)."""
    tensors: dict[str, Any] = {}
    return _encode(obj, tensors, prefix), tensors


def _encode(obj: Any, tensors: dict[str, Any], prefix: str) -> Any:
    import numpy as np
    import torch

    if obj is None or isinstance(obj, bool | str):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}
    if isinstance(obj, torch.Tensor):
        key = f"{prefix}.{len(tensors)}"
        tensors[key] = owned(obj, tensors)
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            return {"__ndarray__": None, "items": [_encode(v, tensors, prefix) for v in obj]}
        key = f"{prefix}.{len(tensors)}"
        tensors[key] = torch.from_numpy(np.ascontiguousarray(obj).copy())
        return {"__ndarray__": key}
    if isinstance(obj, np.generic):
        return _encode(obj.item(), tensors, prefix)
    if isinstance(obj, list):
        return [_encode(v, tensors, prefix) for v in obj]
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors, prefix) for v in obj]}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and k not in TAGS for k in obj):
            return {k: _encode(v, tensors, prefix) for k, v in obj.items()}
        return {"__items__": [[_encode(k, tensors, prefix), _encode(v, tensors, prefix)]
                              for k, v in obj.items()]}
    raise StateFormatError(f"a {type(obj).__name__} cannot be stored in a checkpoint "
                           f"(only tensors, numbers, strings, lists and dicts)")


def owned(tensor: Any, others: dict[str, Any]) -> Any:
    """`tensor` on the CPU as a whole storage of its own (safetensors refuses shared or
    partial storages); copied only when it is not one already."""
    t = tensor.detach().to("cpu")
    storage = t.untyped_storage()
    shared = any(o.untyped_storage().data_ptr() == storage.data_ptr() for o in others.values())
    if (shared or not t.is_contiguous() or t.storage_offset()
            or t.numel() * t.element_size() != storage.nbytes()):
        t = t.contiguous().clone()
    return t


def join(tree: Any, tensors: dict[str, Any]) -> Any:
    """The object `split` turned into (tree, tensors)."""
    if isinstance(tree, list):
        return [join(v, tensors) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if "__tensor__" in tree:
        return _tensor(tree["__tensor__"], tensors)
    if "__ndarray__" in tree:
        if tree["__ndarray__"] is None:
            import numpy as np

            items = [join(v, tensors) for v in tree.get("items", [])]
            out = np.empty(len(items), dtype=object)
            out[:] = items
            return out
        return _tensor(tree["__ndarray__"], tensors).numpy()
    if "__tuple__" in tree:
        return tuple(join(v, tensors) for v in tree["__tuple__"])
    if "__items__" in tree:
        return {_hashable(join(k, tensors)): join(v, tensors) for k, v in tree["__items__"]}
    if "__float__" in tree:
        if tree["__float__"] not in ("nan", "inf", "-inf"):
            raise StateFormatError(f"not a float: {tree['__float__']!r}")
        return float(tree["__float__"])
    return {k: join(v, tensors) for k, v in tree.items()}


def _tensor(key: Any, tensors: dict[str, Any]) -> Any:
    if not isinstance(key, str) or key not in tensors:
        raise StateFormatError(f"refers to tensor {key!r}, which the tensor file lacks")
    return tensors[key]


def _hashable(key: Any) -> Any:
    if isinstance(key, list | dict):
        raise StateFormatError(f"a dict key cannot be a {type(key).__name__}")
    return key
