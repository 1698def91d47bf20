"""Reading graph.yaml (and `key=value` overrides) safely, with the line of every key.

A graph file is opened without blocking and refused unless it is a regular file of at most
MAX_FILE_BYTES of UTF-8 text without NUL bytes. Its YAML is composed with PyYAML's safe
composer under limits, each refusal one `file:line:col` error: nesting at most MAX_DEPTH
deep, at most MAX_ALIASES alias uses and MAX_VALUES values once aliases are expanded (no
alias bombs), no recursive aliases, no merge keys (`<<:`), keys that are plain scalars (no
`? [a, b]`), only the standard tags (no `!!python/...`), integers of at most MAX_INT_DIGITS
digits. Overrides are parsed by the same code, so they pass the same limits.
"""

from __future__ import annotations

import codecs
import errno
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from rlgraph.errors import Key, SourceMap, SpecError, shown

MAX_FILE_BYTES = 1 << 20  # a graph.yaml is a few kB; 1 MiB leaves room for long hf_configs
MAX_DEPTH = 32  # nested mappings/lists (the deepest real key is about 5 levels)
MAX_ALIASES = 256  # alias uses (*name) in one document
MAX_VALUES = 100_000  # values after expanding aliases
MAX_INT_DIGITS = 30  # digits of one integer literal (2**64 has 20)
MAX_OVERRIDE_CHARS = 65_536

_PLAIN_TAGS = {f"tag:yaml.org,2002:{t}" for t in
               ("str", "int", "float", "bool", "null", "seq", "map", "timestamp")}
_MERGE_TAG = "tag:yaml.org,2002:merge"
_BOMS = {codecs.BOM_UTF32_LE: "UTF-32", codecs.BOM_UTF32_BE: "UTF-32",
         codecs.BOM_UTF16_LE: "UTF-16", codecs.BOM_UTF16_BE: "UTF-16"}


def located(err: SpecError, where: str) -> SpecError:
    """Pin an error to a literal `file:line:col` (for errors before any key exists)."""
    err.source = SourceMap(path=where, positions={(): (0, 0)})
    err.render = lambda source=None: f"{where}: {err.message}" + (  # type: ignore[method-assign]
        f" ({err.hint})" if err.hint else ""
    )
    return err


def _refuse(path: str, message: str, hint: str | None = None, line: int | None = None,
            col: int = 1) -> SpecError:
    where = f"{shown(path)}:{line}:{col}" if line else shown(path)
    return located(SpecError(message, hint=hint), where)


# ---------------------------------------------------------------- the file


def read_text(path: str | os.PathLike[str]) -> str:
    """The UTF-8 text of a graph file; anything else is a one-line SpecError naming it."""
    name = str(path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise _refuse(name, f"the file name is too long ({len(os.path.basename(name))} "
                          "characters)", hint="rename the file") from None
        raise _refuse(name, f"cannot read the graph: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            what = ("a directory" if stat.S_ISDIR(info.st_mode) else
                    "a FIFO" if stat.S_ISFIFO(info.st_mode) else
                    "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else
                    "a socket" if stat.S_ISSOCK(info.st_mode) else "not a regular file")
            raise _refuse(name, f"the graph is {what}, not a file",
                          hint="give the path of a graph.yaml")
        if info.st_size > MAX_FILE_BYTES:
            raise _refuse(name, f"the file has {info.st_size} bytes, more than a graph's "
                          f"limit of {MAX_FILE_BYTES}", hint="is this the right file?")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise _refuse(name, f"cannot read the graph: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise _refuse(name, f"the file has more than {MAX_FILE_BYTES} bytes, a graph's limit")
    return decode(data, name)


def decode(data: bytes, name: str) -> str:
    """UTF-8 bytes -> text; UTF-16/32, other encodings and NUL bytes are refused by line."""
    for bom, encoding in _BOMS.items():
        if data.startswith(bom):
            raise _refuse(name, f"the file is {encoding} text, not UTF-8",
                          hint="save it as UTF-8", line=1)
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise _refuse(name, f"the file is not UTF-8 text (byte 0x{data[exc.start]:02x})",
                      hint="save it as UTF-8; is it a binary file, or Latin-1 text?",
                      line=line, col=col) from None
    if "\0" in text:
        at = text.index("\0")
        line = text.count("\n", 0, at) + 1
        raise _refuse(name, "the file holds a NUL byte", hint="is this a text file?", line=line,
                      col=at - (text.rfind("\n", 0, at) + 1) + 1)
    return text


# ---------------------------------------------------------------- the YAML


class _LimitedLoader(yaml.SafeLoader):
    """The safe composer with a depth limit and an alias count (construction is ours)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0
        self.aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise _LimitError(self.peek_event().start_mark,
                                  f"more than {MAX_ALIASES} aliases (*name)",
                                  "write the values out; aliases are for a few repeats")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _LimitError(self.peek_event().start_mark,
                              f"nesting deeper than {MAX_DEPTH} levels",
                              "a graph.yaml is a few levels deep; check the brackets")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _LimitError(Exception):
    """A limit hit while composing: where, what, and what to do."""

    def __init__(self, mark: Any, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.mark, self.message, self.hint = mark, message, hint


_Constructor = yaml.SafeLoader("")


def _short_tag(tag: str) -> str:
    """`!!python/name:os.system` as the user wrote it (shortened when long)."""
    return shown(tag.replace("tag:yaml.org,2002:", "!!"))


class _Walk:
    """Nodes -> plain data, recording key positions and refusing what graph.yaml forbids."""

    def __init__(self, positions: dict[Key, tuple[int, int]]) -> None:
        self.positions = positions
        self.values = 0
        self.open: set[int] = set()  # ids of the collections being walked (recursion check)

    def scalar(self, node: yaml.Node) -> Any:
        if node.tag not in _PLAIN_TAGS:
            raise _LimitError(node.start_mark, f"the tag {_short_tag(node.tag)} is not allowed",
                              "graph.yaml holds plain values only")
        if node.tag.endswith(":int"):
            digits = sum(ch.isalnum() for ch in node.value)
            if digits > MAX_INT_DIGITS:
                raise _LimitError(node.start_mark, f"an integer of {digits} digits",
                                  "no graph.yaml key takes numbers this large")
        return _Constructor.construct_object(node, deep=True)

    def __call__(self, node: yaml.Node, path: Key) -> Any:
        self.values += 1
        if self.values > MAX_VALUES:
            raise _LimitError(node.start_mark, f"more than {MAX_VALUES} values once aliases "
                              "are expanded (an alias bomb?)", "write the values out")
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node)
        if node.tag not in _PLAIN_TAGS:
            raise _LimitError(node.start_mark, f"the tag {_short_tag(node.tag)} is not allowed",
                              "graph.yaml holds plain mappings, lists and values only")
        if id(node) in self.open:
            raise _LimitError(node.start_mark, "a recursive alias (a value that contains "
                              "itself)", "write the values out")
        self.open.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self.mapping(node, path)
            return [self._item(item, (*path, i)) for i, item in enumerate(node.value)]
        finally:
            self.open.discard(id(node))

    def _item(self, node: yaml.Node, path: Key) -> Any:
        self.positions[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
        return self(node, path)

    def mapping(self, node: yaml.MappingNode, path: Key) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                raise _LimitError(key_node.start_mark, "YAML merge keys (<<:) are not "
                                  "supported", "write the keys out")
            if not isinstance(key_node, yaml.ScalarNode):
                raise _LimitError(key_node.start_mark, "a key must be a plain name, not a "
                                  "list or mapping (? [a, b])", "write key: value")
            key = self.scalar(key_node)
            where = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if key in out:
                first = self.positions[(*path, key)][0]
                self.positions[(*path, key)] = where  # point at the second one
                raise SpecError(f"key '{key}' appears twice (first on line {first})",
                                (*path, key), hint="keep one")
            self.positions[(*path, key)] = where
            out[key] = self(value_node, (*path, key))
        return out


def compose(text: str, where: str, lines: bool = True) -> yaml.Node | None:
    """The YAML node tree of `text` under the limits; errors point at `where:line:col`
    (at `where` alone without `lines`: an override's value)."""
    loader = _LimitedLoader(text)
    try:
        return loader.get_single_node()
    except _LimitError as exc:
        raise _at(exc, where, lines) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark and lines else where
        problem = str(exc.problem or exc.context)
        raise located(SpecError(f"invalid YAML: {problem}", hint=_yaml_hint(problem)),
                      at) from None
    except yaml.YAMLError as exc:
        raise located(SpecError(f"invalid YAML: {str(exc).splitlines()[0]}"), where) from None
    finally:
        loader.dispose()


def _at(exc: _LimitError, where: str, lines: bool = True) -> SpecError:
    mark = exc.mark
    at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark and lines else where
    return located(SpecError(exc.message, hint=exc.hint), at)


def to_data(node: yaml.Node, where: str, positions: dict[Key, tuple[int, int]],
            path: Key = (), lines: bool = True) -> Any:
    """Plain data of a composed node, recording each key's position in `positions`."""
    try:
        return _Walk(positions)(node, path)
    except _LimitError as exc:
        raise _at(exc, where, lines) from None
    except yaml.YAMLError as exc:  # a scalar PyYAML cannot construct (a bad timestamp)
        raise located(SpecError(f"invalid YAML value: {str(exc).splitlines()[0]}"),
                      where) from None


def parse_yaml(text: str, path: str = "graph.yaml") -> tuple[dict[str, Any], SourceMap]:
    """YAML text -> (plain data, source map); syntax errors and refusals name the line."""
    name = shown(path)
    source = SourceMap(path=path)
    root = compose(text, name)
    if root is None:
        raise located(SpecError("the file is empty", hint="start from graphs/quickstart.yaml"),
                      f"{name}:1:1")
    if not isinstance(root, yaml.MappingNode):
        mark = root.start_mark
        raise located(SpecError("the top level must be a mapping of keys (name:, nodes:, ...)"),
                      f"{name}:{mark.line + 1}:{mark.column + 1}")
    try:
        data = to_data(root, name, source.positions)
    except SpecError as err:
        err.source = err.source or source
        raise
    return data, source


def parse_value(raw: str, where: str) -> Any:
    """One override's value, parsed as YAML under the same limits (a string if not YAML)."""
    if len(raw) > MAX_OVERRIDE_CHARS:
        raise located(SpecError(f"the value has {len(raw)} characters, more than "
                                f"{MAX_OVERRIDE_CHARS}"), where)
    if not raw.strip():
        return None
    if "\0" in raw:
        raise located(SpecError("the value holds a NUL byte"), where)
    try:
        node = compose(raw, where, lines=False)
    except SpecError as err:
        if err.message.startswith("invalid YAML"):
            return raw  # `name=a: b` and friends: the text itself
        raise
    return None if node is None else to_data(node, where, {}, lines=False)


def _yaml_hint(problem: str) -> str | None:
    """What usually causes PyYAML's problem, in words."""
    if "'\\t'" in problem or "\t" in problem:
        return "indent with spaces, not tabs"
    if "expected ',' or '}'" in problem or "expected ',' or ']'" in problem:
        return "a { or [ opened before this line is not closed"
    if "<block end>" in problem or "mapping values are not allowed" in problem:
        return "check the indentation of this line and the one before"
    if "could not find expected ':'" in problem:
        return "a key needs a colon: key: value"
    return None


def read_graph(path: str | os.PathLike[str]) -> tuple[dict[str, Any], SourceMap]:
    """Read and parse a graph file: (plain data, source map)."""
    return parse_yaml(read_text(path), str(Path(path)))
