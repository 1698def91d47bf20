"""Check `rlgraph/engines/sglang_engine.py` against sglang's released source, read from its wheel.

    python tools/check_sglang_api.py                 # pip download sglang --no-deps, then check
    python tools/check_sglang_api.py --wheel W.whl   # a wheel already on disk

sglang does not install on our CI or on the lent GPU machines, so the adapter's calls are
checked here against the source of the release: the adapter's own source is parsed (`ast`) for
every call it makes into sglang (`sgl.Engine(...)` keywords, `engine.<method>(...)` with its
keywords and positional count, the `io_struct` request classes, the sampling-parameter keys
and the `meta_info` keys it reads), and each is looked up in the wheel's modules, which are
parsed, never imported. A call guarded by `hasattr` is optional: reported, not required.
Prints one line per call and exits 1 if a required one is missing.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ADAPTER = ROOT / "rlgraph" / "engines" / "sglang_engine.py"
ENGINE_MODULE = "sglang/srt/entrypoints/engine.py"
SERVER_ARG_MODULES = ("sglang/srt/server_args.py", "sglang/srt/arg_groups/fields/")
SAMPLING_MODULE = "sglang/srt/sampling/sampling_params.py"
IO_MODULE = "sglang/srt/managers/io_struct.py"
TOKENIZER_MANAGER = "sglang/srt/managers/tokenizer_manager.py"


@dataclass
class AdapterCalls:
    """What the adapter uses of sglang, read from its source."""

    engine_kwargs: set[str] = field(default_factory=set)  # sgl.Engine(...) keywords
    methods: dict[str, tuple[int, set[str]]] = field(default_factory=dict)  # name -> (args, kw)
    optional: set[str] = field(default_factory=set)  # methods looked up with hasattr first
    attributes: set[str] = field(default_factory=set)  # engine.<attr> read without a call
    manager_methods: set[str] = field(default_factory=set)  # tokenizer_manager.<m>(...)
    io_classes: dict[str, set[str]] = field(default_factory=dict)  # io.<Class>(kw=...)
    sampling_keys: set[str] = field(default_factory=set)
    output_keys: set[str] = field(default_factory=set)  # out[...] / meta.get(...)


def _name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else (
        f"{_name(node.value)}.{node.attr}" if isinstance(node, ast.Attribute) else "")


def adapter_calls(source: str) -> AdapterCalls:
    """Every use of sglang in the adapter's source."""
    calls = AdapterCalls()
    tree = ast.parse(source)
    called = set()
    own = {a.arg for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
           and node.name == "SGLangEngine" for f in node.body
           if isinstance(f, ast.FunctionDef) and f.name == "__init__"
           for a in f.args.args + f.args.kwonlyargs}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            target = _name(node.func)
            keys = {k.arg for k in node.keywords if k.arg}
            if target == "sgl.Engine":
                calls.engine_kwargs |= keys
            elif target == "SGLangEngine":  # keywords beyond its own pass on to sgl.Engine
                calls.engine_kwargs |= keys - own
            elif target.removeprefix("self.").startswith("engine.") \
                    and target.removeprefix("self.").count(".") == 1:
                method = target.rsplit(".", 1)[1]
                calls.methods[method] = (len(node.args), keys)
                called.add(id(node.func))
            elif target.startswith("tm."):
                calls.manager_methods.add(target.split(".", 1)[1])
            elif target.startswith("io.") and target[3:4].isupper():
                calls.io_classes[target[3:]] = keys
            elif target == "hasattr" and len(node.args) == 2 \
                    and isinstance(node.args[1], ast.Constant):
                calls.optional.add(node.args[1].value)
            elif target in ("out.get", "meta.get") and node.args \
                    and isinstance(node.args[0], ast.Constant):
                calls.output_keys.add(node.args[0].value)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and _name(node.targets[0]) == "params" and isinstance(node.value, ast.Dict):
            calls.sampling_keys |= {k.value for k in node.value.keys
                                    if isinstance(k, ast.Constant)}
        elif isinstance(node, ast.Subscript) and _name(node.value) == "params" \
                and isinstance(node.slice, ast.Constant):
            calls.sampling_keys.add(node.slice.value)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in called \
                and _name(node.value) in ("engine", "self.engine") \
                and node.attr not in calls.methods:
            calls.attributes.add(node.attr)
    return calls


class Wheel:
    """The Python modules of a wheel, parsed on demand."""

    def __init__(self, path: Path):
        self.zip = zipfile.ZipFile(path)
        self.names = self.zip.namelist()

    def text(self, name: str) -> str:
        """The source of one module."""
        return self.zip.read(name).decode()

    def modules(self, prefix: str) -> list[str]:
        """Module paths equal to or under `prefix`."""
        return [n for n in self.names if n.endswith(".py") and n.startswith(prefix)]

    def class_body(self, module: str, name: str) -> ast.ClassDef | None:
        """The class `name` of `module`."""
        for node in ast.walk(ast.parse(self.text(module))):
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
        return None


def _fields(body: ast.ClassDef) -> set[str]:
    """Annotated fields and `__init__` parameters of a class."""
    names = {n.target.id for n in body.body
             if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    for item in body.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            names |= {a.arg for a in item.args.args + item.args.kwonlyargs}
    return names


def check(wheel: Wheel, calls: AdapterCalls) -> list[tuple[str, bool, str]]:
    """(what, found, detail) for every use of sglang the adapter makes."""
    results = []
    engine = wheel.class_body(ENGINE_MODULE, "Engine")
    if engine is None:
        return [(f"class Engine in {ENGINE_MODULE}", False, "not in this wheel")]
    methods = {f.name: f for f in engine.body
               if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
    assigned = {t.attr for n in ast.walk(engine) if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Attribute)}
    server_fields: set[str] = set()
    for prefix in SERVER_ARG_MODULES:
        for module in wheel.modules(prefix):
            for node in ast.walk(ast.parse(wheel.text(module))):
                if isinstance(node, ast.ClassDef):
                    server_fields |= _fields(node)
    for key in sorted(calls.engine_kwargs):
        results.append((f"sgl.Engine({key}=...)", key in server_fields, "ServerArgs field"))
    for name, (positional, keys) in sorted(calls.methods.items()):
        func = methods.get(name)
        optional = name in calls.optional
        if func is None:
            results.append((f"Engine.{name}", optional, "optional: absent, the fallback runs"
                            if optional else "no such method"))
            continue
        params = [a.arg for a in func.args.args[1:] + func.args.kwonlyargs]
        unknown = sorted(keys - set(params)) if func.args.kwarg is None else []
        fits = positional <= len(func.args.args) - 1 and not unknown
        results.append((f"Engine.{name}({positional} positional, {', '.join(sorted(keys))})",
                        fits, f"unknown keywords {unknown}" if unknown else
                        f"signature ({', '.join(params[:8])}{', ...' if len(params) > 8 else ''})"))
    for attr in sorted(calls.attributes):
        results.append((f"Engine.{attr}", attr in assigned or attr in methods,
                        "attribute set by Engine"))
    manager = wheel.class_body(TOKENIZER_MANAGER, "TokenizerManager")
    manager_defs = set() if manager is None else {
        f.name for f in manager.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
    for name in sorted(calls.manager_methods):
        results.append((f"TokenizerManager.{name}", name in manager_defs, TOKENIZER_MANAGER))
    for name, keys in sorted(calls.io_classes.items()):
        body = wheel.class_body(IO_MODULE, name)
        missing = sorted(keys - _fields(body)) if body else sorted(keys)
        results.append((f"io_struct.{name}({', '.join(sorted(keys))})",
                        body is not None and not missing,
                        f"missing fields {missing}" if missing else IO_MODULE))
    sampling = wheel.class_body(SAMPLING_MODULE, "SamplingParams")
    sampling_fields = _fields(sampling) if sampling else set()
    for key in sorted(calls.sampling_keys):
        results.append((f"sampling_params['{key}']", key in sampling_fields, "SamplingParams"))
    manager_text = wheel.text(TOKENIZER_MANAGER)
    for key in sorted(calls.output_keys):
        results.append((f"output['{key}']", f'"{key}"' in manager_text,
                        "a key the tokenizer manager writes"))
    return results


def download() -> Path:
    """The latest sglang wheel from PyPI (no dependencies), in a temporary folder."""
    folder = Path(tempfile.mkdtemp(prefix="sglang-wheel-"))
    subprocess.run([sys.executable, "-m", "pip", "download", "sglang", "--no-deps", "-q",
                    "-d", str(folder)], check=True)
    return next(folder.glob("sglang-*.whl"))


def main(argv: list[str] | None = None) -> int:
    """Check the adapter against a wheel; exit 1 if a required call is missing."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, help="an sglang wheel (default: pip download)")
    args = parser.parse_args(argv)
    wheel_path = args.wheel or download()
    results = check(Wheel(wheel_path), adapter_calls(ADAPTER.read_text()))
    print(f"{ADAPTER.relative_to(ROOT)} against {wheel_path.name}:")
    for what, found, detail in results:
        print(f"  {'ok     ' if found else 'MISSING'} {what}  [{detail}]")
    missing = [r for r in results if not r[1]]
    print(f"{len(results) - len(missing)} of {len(results)} uses found")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
