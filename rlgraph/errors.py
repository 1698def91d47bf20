"""Errors a user can fix: they carry the key they are about and print as one line.

Every pass raises `SpecError(message, key=(...), hint=...)` naming the graph.yaml key it
refuses; the CLI resolves the key to `file:line:col` through the spec's source map and
prints `graph.yaml:LINE:COL: key: message (hint)` with exit status 2, never a traceback.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

Key = tuple[str | int, ...]
MAX_NAME_CHARS = 120  # a path or override longer than this is shortened in messages


def shown(path: str | os.PathLike[str]) -> str:
    """A path (or override) as messages print it: control characters escaped, shortened in
    the middle when very long, so an error stays one readable line."""
    text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(path))
    if len(text) <= MAX_NAME_CHARS:
        return text
    half = MAX_NAME_CHARS // 2 - 2
    return f"{text[:half]}...{text[-half:]}"


# CSI (colours, cursor moves), OSC (window titles) and two-character escape sequences
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def clean_text(text: str, limit: int = 300) -> str:
    """Text from user code (an exception's message, a response) as one short line: terminal
    escape sequences removed, other control characters and line breaks escaped, cut to
    `limit` characters with a count of the rest."""
    text = ESCAPES.sub("", str(text))
    text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


@dataclass
class SourceMap:
    """Where each key of a graph.yaml came from: file, line and column (1-based)."""

    path: str = "graph.yaml"
    positions: dict[Key, tuple[int, int]] = field(default_factory=dict)
    overrides: dict[Key, str] = field(default_factory=dict)

    def written(self, key: Sequence[str | int]) -> bool:
        """Whether the user wrote `key` (in the file or an override), not a default."""
        key = tuple(key)
        return key in self.positions or key in self.overrides

    def locate(self, key: Sequence[str | int]) -> str:
        """`file:line:col` of the longest known prefix of `key` (or the override that set it)."""
        key = tuple(key)
        for end in range(len(key), -1, -1):
            prefix = key[:end]
            if prefix in self.overrides:
                return f"<override {shown(self.overrides[prefix])}>"
            if prefix in self.positions:
                line, col = self.positions[prefix]
                return f"{self.path}:{line}:{col}"
        return f"{self.path}:1:1"


class RLGraphError(Exception):
    """Base of every error rlgraph reports to a user without a traceback."""

    exit_code = 2

    def render(self, source: SourceMap | None = None) -> str:
        """The one-line message shown to the user."""
        return str(self)


class SpecError(RLGraphError):
    """A graph.yaml (or an override) that rlgraph refuses; names the key and what to write."""

    def __init__(self, message: str, key: Sequence[str | int] = (), hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.key: Key = tuple(key)
        self.hint = hint
        self.source: SourceMap | None = None

    def render(self, source: SourceMap | None = None) -> str:
        """`file:line:col: key: message (hint)`."""
        source = source or self.source or SourceMap()
        where = source.locate(self.key)
        dotted = ".".join(str(k) for k in self.key)
        text = f"{where}: {dotted}: {self.message}" if dotted else f"{where}: {self.message}"
        return f"{text} ({self.hint})" if self.hint else text

    def __str__(self) -> str:
        return self.render()


class MissingDependencyError(RLGraphError):
    """A feature needs a package or device this machine does not have."""


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """A 'did you mean ...?' hint for a misspelt key or name, or None."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else None
