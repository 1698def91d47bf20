"""How `env: {fn: ...}` finds its class: a built-in name, `module:Class` or `file.py:Class`
(code from a file runs only with `--trust-code`, checked by the CLI as for reward functions),
and the one-line error when it cannot be built. Imports the user's module; no torch, no ray."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from rlgraph.errors import Key, SpecError

BUILTIN = {
    "calculator": "rlgraph.envs.calculator:CalculatorEnv",
    "guess_number": "rlgraph.envs.guess_number:GuessNumberEnv",
    "delay": "rlgraph.envs.delay:DelayEnv",
}


def reference(fn: str) -> str:
    """`module:Class` of an env fn: a built-in name resolved, anything else as written."""
    return BUILTIN.get(fn, fn)


def load_env_class(fn: str, key: Key = (), base_dir: Path | None = None) -> type:
    """The class `fn` names; SpecError (one line, naming the key) when it cannot be found."""
    ref = reference(fn)
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr:
        raise SpecError(f"env fn '{fn}' is not a built-in ({', '.join(BUILTIN)}) nor "
                        "'module:Class' or 'file.py:Class'", key,
                        hint="e.g. calculator, or my_env.py:MyEnv")
    if target.endswith(".py"):
        path = Path(target).expanduser()
        if not path.is_absolute() and base_dir is not None and not path.exists():
            path = base_dir / path
        if not path.is_file():
            raise SpecError(f"env file '{target}' does not exist", key,
                            hint="give the path of a .py file, relative to graph.yaml")
        name = "rlgraph_env_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            try:
                spec.loader.exec_module(module)  # type: ignore[union-attr]
            except BaseException as exc:
                raise SpecError(f"importing '{target}' failed: {type(exc).__name__}: {exc}",
                                key) from None
            sys.modules[name] = module
    else:
        try:
            module = importlib.import_module(target)
        except BaseException as exc:
            raise SpecError(f"cannot import module '{target}': {type(exc).__name__}: {exc}",
                            key, hint="is it installed, or did you mean a file path ending "
                            "in .py?") from None
    cls = getattr(module, attr, None)
    if not isinstance(cls, type):
        raise SpecError(f"'{target}' has no class '{attr}'", key)
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if missing:
        raise SpecError(f"env class '{attr}' has no {' or '.join(missing)} method (the Env "
                        "contract: reset(prompt, sample) -> str, step(action) -> "
                        "(observation, reward, done))", key)
    return cls


def build_env(cls: type, config: dict[str, Any], fn: str, key: Key = ()) -> Any:
    """One environment `cls(**config)`; SpecError (one line) when the constructor refuses."""
    try:
        return cls(**config)
    except BaseException as exc:
        raise SpecError(f"env '{fn}' could not be built from {config}: "
                        f"{type(exc).__name__}: {exc}", key,
                        hint="the env block's keys other than fn, max_turns, timeout_s, "
                        "workers, max_observation_tokens, turns, observation_len, latency_s "
                        "and threads go to its constructor") from None


def stop_strings(env: Any) -> tuple[str, ...]:
    """The strings that end a model turn besides end-of-sequence (the env's `stop`)."""
    stop = getattr(env, "stop", ()) or ()
    if isinstance(stop, str):
        stop = (stop,)
    return tuple(s for s in stop if isinstance(s, str) and s)


def check_envs(spec: Any, base_dir: Path | None) -> None:
    """Build every generate node's environment once, before a run starts: a class that
    cannot be imported or a constructor that refuses its keys is a one-line SpecError."""
    for name, node in spec.nodes.items():
        env = getattr(node, "env", None)
        if env is None:
            continue
        key = ("nodes", name, "env", "fn")
        try:
            build_env(load_env_class(env.fn, key, base_dir), env.config(), env.fn, key)
        except SpecError as err:
            err.source = spec.source
            raise
