"""Files rlgraph wrote and reads back (trace.json, metrics.jsonl, meta.json, plan.json),
checked as strictly as a graph.yaml: a user may have edited, truncated or replaced them.

- `read_bytes`: regular files only, opened without blocking and without following a final
  symlink out of nowhere: a FIFO, a device or a folder in a file's place is refused at once
  (opening a FIFO for reading would block for ever), as is a file over `MAX_BYTES`;
- `read_json`: the same, parsed, with `file:line:col` for JSON that does not parse;
- `trace_spans`: a Chrome trace's complete spans, every field of the right type and every
  time finite and non-negative;
- `finite_number`, `count`: one number of such a file, refused when it is not a finite,
  non-negative number (or not a whole one), or beyond a bound.

Every refusal is a `ReadBackError` (or the caller's subclass of RLGraphError): one line
naming the file, the field and what to do. Pure Python: the compiler uses it too.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from rlgraph.errors import RLGraphError, shown

MAX_BYTES = 1 << 30  # a trace or metrics file of a very long run stays far below 1 GiB
MAX_SECONDS = 1e7  # ~116 days: no span of a real run is longer, so a larger one was edited


class ReadBackError(RLGraphError):
    """A file rlgraph wrote that cannot be read back as written."""


def read_bytes(path: str | os.PathLike[str], what: str = "",
               error: type[RLGraphError] = ReadBackError) -> bytes:
    """The bytes of a regular file, or a one-line `error` (FIFOs and devices never block)."""
    path = Path(path)
    hint = f" ({what})" if what else ""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{shown(path)}: no such file{hint}") from None
    except OSError as exc:
        raise error(f"{shown(path)}: cannot read it: {exc.strerror or exc}{hint}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a FIFO" if stat.S_ISFIFO(info.st_mode) else "a folder"
                    if stat.S_ISDIR(info.st_mode) else "not a regular file")
            raise error(f"{shown(path)}: {kind}, not a file rlgraph wrote; replace it with "
                        f"the file or remove it")
        if info.st_size > MAX_BYTES:
            raise error(f"{shown(path)}: {info.st_size} bytes, more than rlgraph ever writes "
                        f"there ({MAX_BYTES}); replace it with the file rlgraph wrote")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise error(f"{shown(path)}: cannot read it: {exc.strerror or exc}{hint}") from None
    finally:
        os.close(fd)


def read_json(path: str | os.PathLike[str], what: str = "",
              error: type[RLGraphError] = ReadBackError) -> Any:
    """A JSON file read with `read_bytes`; broken JSON or text is `file:line:col`."""
    data = read_bytes(path, what, error)
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise error(f"{shown(path)}: not UTF-8 text (byte {exc.start}); {_redo(what)}") from None
    except json.JSONDecodeError as exc:
        raise error(f"{shown(path)}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg}); "
                    f"{_redo(what)}") from None
    except RecursionError:
        raise error(f"{shown(path)}: JSON nested too deeply; {_redo(what)}") from None


def _redo(what: str) -> str:
    return what or "restore the file rlgraph wrote"


def finite_number(value: Any, where: str, *, upper: float = math.inf, integer: bool = False,
                  error: type[RLGraphError] = ReadBackError) -> float:
    """`value` as a finite number in [0, upper] (a whole one if `integer`), else `error`."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok and integer:
        ok = isinstance(value, int) or (math.isfinite(value) and float(value).is_integer())
    if not ok or not (0 <= value <= upper):
        bound = f"at most {upper:g}" if math.isfinite(upper) else "finite"
        kind = "a whole number" if integer else "a number"
        raise error(f"{where}: {_short(value)} is not {kind} >= 0 and {bound}")
    return int(value) if integer else float(value)


def count(value: Any, where: str, upper: float = 2**53,
          error: type[RLGraphError] = ReadBackError) -> int:
    """A non-negative whole number (a step, a count) no larger than `upper`."""
    return int(finite_number(value, where, upper=upper, integer=True, error=error))


def _short(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return shown(text if len(text) <= 40 else text[:37] + "...")


def trace_spans(trace: Any, where: str,
                error: type[RLGraphError] = ReadBackError) -> list[dict[str, Any]]:
    """The complete ("X") spans of a Chrome trace (a dict with `traceEvents`, or a list),
    each with a finite non-negative `ts` and `dur` (microseconds), a string name and, when
    present, an `args` mapping whose `step` is a whole number >= -1."""
    raw = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    if not isinstance(raw, list):
        raise error(f"{where}: 'traceEvents' is not a list of spans; give the trace.json "
                    f"`rlgraph run` wrote")
    spans = []
    for i, span in enumerate(raw):
        at = f"{where}: traceEvents[{i}]"
        if not isinstance(span, dict):
            raise error(f"{at}: not a mapping")
        if span.get("ph") != "X":
            continue
        for key in ("ts", "dur"):
            finite_number(span.get(key, 0), f"{at}.{key}", upper=MAX_SECONDS * 1e6,
                          error=error)
        args = span.get("args", {})
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise error(f"{at}.args: not a mapping")
        name = args.get("node", span.get("name"))
        if not isinstance(name, str) or not name:
            raise error(f"{at}: no node name (args.node or name)")
        step = args.get("step", -1)
        if isinstance(step, bool) or not isinstance(step, int) or not -1 <= step <= 2**53:
            raise error(f"{at}.args.step: {_short(step)} is not a step number")
        occupies = args.get("occupies")
        if occupies is not None and not (isinstance(occupies, list)
                                         and all(isinstance(g, str) for g in occupies)):
            raise error(f"{at}.args.occupies: not a list of group names")
        spans.append(span)
    return spans
