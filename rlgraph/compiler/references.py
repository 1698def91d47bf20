"""References pass: what a run would load later is found now, without running any of it.

A reward function (`nodes.<reward>.fn`, `nodes.<validate>.fn`: `module:function` or
`file.py:function`) must name a Python source file that defines the function at its top
level: the file is found the way `rlgraph.rl.rewards.load_reward_fn` finds it (a file relative
to the graph's folder or the working directory; a module on sys.path, located through its
packages without importing them) and parsed with `ast`, never executed. Data files
(`data.train_files`, `data.val_files`, `nodes.<validate>.files`) must be regular files
whose first rows read as verl's rows (UTF-8 JSON lines or a readable parquet file, with
`prompt` and `reward_model.ground_truth`): a wrong column is found now, before Ray starts.
Each refusal names the key, so it prints as the user's `file:line:col`.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import os
import sys
from functools import lru_cache
from pathlib import Path

from rlgraph.config.schema import Spec
from rlgraph.envs.load import BUILTIN as ENV_BUILTINS
from rlgraph.errors import Key, SpecError
from rlgraph.rl.data import DataError, check_file

MAX_SOURCE_BYTES = 8 << 20  # a reward module larger than this is not parsed (accepted)


def base_dir(spec: Spec) -> Path | None:
    """The folder of the graph file (relative paths resolve against it, as at run time)."""
    source = Path(spec.source.path)
    return source.parent if source.is_file() else None


def _resolve(name: str, base: Path | None) -> Path:
    """A path as the runtime resolves it: as given, else relative to the graph's folder."""
    path = Path(name).expanduser()
    if not path.is_absolute() and not path.exists() and base is not None:
        path = base / path
    return path


def _module_file(dotted: str) -> tuple[str | None, bool]:
    """(source file of a module, whether it was found) without importing any package: each
    package's `__init__` is located, never run. A module found without Python source (a
    built-in or extension) is (None, True)."""
    if dotted in sys.modules:
        origin = getattr(sys.modules[dotted], "__file__", None)
        return (origin if origin and origin.endswith(".py") else None), True
    search: list[str] | None = [*sys.path, os.getcwd()]
    spec = None
    parts = dotted.split(".")
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        loaded = sys.modules.get(name)
        if loaded is not None and i < len(parts) - 1 and hasattr(loaded, "__path__"):
            search = list(loaded.__path__)  # an imported package (an editable install too)
            continue
        try:
            spec = importlib.machinery.PathFinder.find_spec(name, search)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            if name in sys.builtin_module_names:
                return None, True
            return None, False
        search = list(spec.submodule_search_locations or [])
    origin = spec.origin if spec is not None else None
    return (origin if origin and origin.endswith(".py") else None), True


def _defines(source: str, attr: str) -> bool | None:
    """Whether a module's top level defines `attr` (def, class, assignment or import); None
    when it cannot be told without running it (`from x import *`, a module `__getattr__`)."""
    tree = ast.parse(source)
    unknown = False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == attr:
                return True
            unknown |= node.name == "__getattr__"
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if any(isinstance(n, ast.Name) and n.id == attr for n in ast.walk(target)):
                    return True
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    unknown = True
                elif (alias.asname or alias.name.split(".")[0]) == attr:
                    return True
        elif isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            continue  # `if __name__ == "__main__":` runs only as a script
        elif isinstance(node, ast.If | ast.Try | ast.With):
            unknown = True  # definitions under a condition: trust the run to find them
    return None if unknown else False


def _stamp(path: str | Path) -> tuple[int, int, int]:
    """(inode, size, modification time in ns) of a file: a new version changes one."""
    info = os.stat(path)
    return info.st_ino, info.st_size, info.st_mtime_ns


_PARSED: dict[tuple[bytes, str], bool | None] = {}  # (digest of a source, name) -> _defines


def _source_defines(source: str, attr: str) -> bool | None:
    """`_defines`, each source parsed once (a compile checks a plan and its baseline; tune
    compiles many plans of one graph)."""
    key = (hashlib.blake2b(source.encode("utf-8", "surrogatepass")).digest(), attr)
    if key not in _PARSED:
        if len(_PARSED) >= 256:
            _PARSED.clear()
        _PARSED[key] = _defines(source, attr)
    return _PARSED[key]


@lru_cache(maxsize=256)
def _file_checked(path: Path, stamp: tuple[int, int, int], key: Key) -> None:
    """`check_file` of a data file, once per version (`stamp`) that passes it (a data file
    may be large: its inode, size and time stand for its content)."""
    check_file(path, key)


def check_reward_fn(ref: str, key: Key, base: Path | None, what: str = "reward fn",
                    thing: str = "function") -> None:
    """Refuse a reward fn (or env class: `what`, `thing`) whose file or module, or whose
    function in it, does not exist."""
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr or not attr.isidentifier():
        raise SpecError(f"{what} '{ref}' is not 'module:{thing}' or 'file.py:{thing}'",
                        key, hint="e.g. rlgraph.rl.rewards:exact_match or "
                        "rewards/score.py:compute_score" if thing == "function" else
                        f"a built-in ({', '.join(ENV_BUILTINS)}) or my_env.py:MyEnv")
    if target.endswith(".py"):
        path = _resolve(target, base)
        if not path.is_file():
            where = f" (looked in {base})" if base is not None else ""
            raise SpecError(f"{what.split()[0]} file '{target}' does not exist{where}", key,
                            hint="give the path of a .py file, relative to graph.yaml")
        origin: str | None = str(path)
    else:
        if not all(part.isidentifier() for part in target.split(".")):
            raise SpecError(f"'{target}' is not a module name", key,
                            hint="module:function, or a file path ending in .py")
        origin, found = _module_file(target)
        if not found:
            raise SpecError(f"no module '{target}' on the Python path", key,
                            hint="is it installed, or did you mean a file path ending in .py?")
    if origin is None:
        return
    try:
        if os.path.getsize(origin) > MAX_SOURCE_BYTES:
            return
        defines = _source_defines(Path(origin).read_text(encoding="utf-8"), attr)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
        line = f" line {exc.lineno}" if isinstance(exc, SyntaxError) and exc.lineno else ""
        raise SpecError(f"cannot read '{target}'{line}: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}", key) from None
    if defines is False:
        raise SpecError(f"'{target}' defines no {thing} '{attr}'", key,
                        hint=f"check the name after ':'; the file is {origin}")


def check_data_files(files: list[str], key: Key, base: Path | None) -> None:
    """Refuse a data file that does not exist or is not a regular file."""
    for i, name in enumerate(files):
        path = _resolve(name, base)
        if not path.exists():
            raise SpecError(f"data file '{name}' does not exist", (*key, i),
                            hint="give a path to a .jsonl or .parquet file in verl's format, "
                            "relative to graph.yaml")
        if not path.is_file():
            raise SpecError(f"data file '{name}' is not a regular file", (*key, i),
                            hint="give a path to a .jsonl or .parquet file")
        try:
            _file_checked(path, _stamp(path), (*key, i))
        except DataError as err:
            raise SpecError(str(err), (*key, i)) from None
        except OSError as exc:
            raise SpecError(f"data file '{name}' cannot be read: {exc.strerror or exc}",
                            (*key, i)) from None


def code_from_files(spec: Spec) -> list[tuple[Key, str, str]]:
    """(key, reference, file) of every reward function a run would execute from a file rather
    than from an installed package: `file.py:function`, or a module found only in the working
    directory or the graph's folder. `rlgraph run` runs none of them unless told to
    (`--trust-code`)."""
    base = base_dir(spec)
    local = [os.path.realpath(os.getcwd())] + ([os.path.realpath(base)] if base else [])
    installed = [p for p in sys.path if p and os.path.realpath(p) not in local]
    found = []
    for key, ref in _code_references(spec):
        target, sep, _ = (ref or "").rpartition(":")
        if not sep or not target:
            continue
        if target.endswith(".py"):
            found.append((key, ref, str(_resolve(target, base))))
            continue
        try:
            on_path = importlib.machinery.PathFinder.find_spec(target.split(".")[0], installed)
        except (ImportError, ValueError):
            on_path = None
        top = target.split(".")[0]
        if on_path is None and top not in sys.builtin_module_names and top not in sys.modules:
            origin, exists = _module_file(target)
            if exists:
                found.append((key, ref, origin or target))
    return found


def _code_references(spec: Spec) -> list[tuple[Key, str]]:
    """(key, reference) of every reward function and env class a run would load (built-in
    environments aside)."""
    refs: list[tuple[Key, str]] = []
    for name, node in spec.nodes.items():
        fn = getattr(node, "fn", None)
        if fn:
            refs.append((("nodes", name, "fn"), fn))
        env = getattr(node, "env", None)
        if env is not None and env.fn not in ENV_BUILTINS:
            refs.append((("nodes", name, "env", "fn"), env.fn))
    return refs


def check_references(spec: Spec) -> None:
    """Every reward function and data file the run would load, found now."""
    base = base_dir(spec)
    for key in ("train_files", "val_files"):
        files = getattr(spec.data, key)
        if files:
            check_data_files(files, ("data", key), base)
    for name, node in spec.nodes.items():
        fn = getattr(node, "fn", None)
        if fn:
            check_reward_fn(fn, ("nodes", name, "fn"), base)
        env = getattr(node, "env", None)
        if env is not None and env.fn not in ENV_BUILTINS:
            check_reward_fn(env.fn, ("nodes", name, "env", "fn"), base, "env fn", "class")
        files = getattr(node, "files", None)
        if files:
            check_data_files(files, ("nodes", name, "files"), base)
