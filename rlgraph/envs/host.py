"""`EnvHost`: the environments of many trajectories in one process, one instance per
trajectory, and the checks that turn whatever an environment does into a plain result.

`reset` and `step` may be coroutines (`async def`): each is run to its end on the calling
thread's own event loop. Every call returns a dict, never raises: `{"ok": True,
"observation", "reward", "done", "tool_call", "start", "end"}` or `{"ok": False,
"reason": "error", "error": one line}`. An environment that raises, returns the wrong
types, a non-finite reward or a huge observation ends that trajectory only; the message
names what it returned. This is what an env actor runs (`rlgraph.envs.pool`); no torch, no ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import numbers
import threading
import time
from pathlib import Path
from typing import Any

from rlgraph.envs.load import build_env, load_env_class

MAX_OBSERVATION_CHARS = 1 << 20  # an observation longer than this is refused before encoding


def _line(text: Any, limit: int = 160) -> str:
    """A value as a short one-line text."""
    out = " ".join(repr(text).split()) if not isinstance(text, str) else " ".join(text.split())
    return out if len(out) <= limit else out[: limit - 3] + "..."


def _awaited(value: Any) -> Any:
    """An async environment's result: a coroutine is run to its end on this thread's own
    event loop (each env call runs on a thread of its own)."""
    return asyncio.run(value) if inspect.iscoroutine(value) else value


def check_step(value: Any) -> tuple[str, float, bool, bool | None]:
    """(observation, reward, done, tool_call) of what `step` returned; ValueError naming it
    when it is not (str, number, bool) or (str, number, bool, dict)."""
    if not isinstance(value, tuple) or len(value) not in (3, 4):
        raise ValueError(f"step returned {_line(value, 80)}, not (observation: str, reward: "
                         "float, done: bool)")
    observation, reward, done = value[:3]
    info = value[3] if len(value) == 4 else {}
    if not isinstance(observation, str):
        raise ValueError(f"step returned observation {_line(observation, 80)} of type "
                         f"{type(observation).__name__}, not str")
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) \
            or not math.isfinite(float(reward)):
        raise ValueError(f"step returned reward {_line(reward, 80)}, not a finite number")
    if not isinstance(done, bool):
        raise ValueError(f"step returned done {_line(done, 80)} of type "
                         f"{type(done).__name__}, not bool")
    if not isinstance(info, dict):
        raise ValueError(f"step returned info {_line(info, 80)}, not a dict")
    if len(observation) > MAX_OBSERVATION_CHARS:
        raise ValueError(f"step returned an observation of {len(observation)} characters")
    tool = info.get("tool_call")
    return observation, float(reward), done, None if tool is None else bool(tool)


class EnvHost:
    """The environments of the trajectories assigned to one worker, keyed by trajectory."""

    def __init__(self, fn: str, config: dict[str, Any], base_dir: str | None = None):
        self.fn, self.config = fn, dict(config)
        self.cls = load_env_class(fn, ("env", "fn"), Path(base_dir) if base_dir else None)
        build_env(self.cls, self.config, fn)  # a constructor that refuses fails here, once
        self.envs: dict[str, Any] = {}
        self.lock = threading.Lock()

    def ping(self) -> bool:
        """Reachable (the pool waits for its actors once)."""
        return True

    def reset(self, key: str, prompt: str, sample: dict) -> dict[str, Any]:
        """A new environment for trajectory `key`; its reset text as the observation."""
        start = time.time()
        try:
            env = build_env(self.cls, self.config, self.fn)
            text = _awaited(env.reset(prompt, sample))
            if not isinstance(text, str):
                raise ValueError(f"reset returned {_line(text, 80)} of type "
                                 f"{type(text).__name__}, not str")
            if len(text) > MAX_OBSERVATION_CHARS:
                raise ValueError(f"reset returned {len(text)} characters")
        except BaseException as exc:
            return self._failed("reset", exc, start)
        with self.lock:
            self.envs[key] = env
        return {"ok": True, "observation": text, "reward": 0.0, "done": False,
                "tool_call": None, "start": start, "end": time.time()}

    def step(self, key: str, action: str) -> dict[str, Any]:
        """Step trajectory `key`'s environment with the model's turn."""
        start = time.time()
        env = self.envs.get(key)
        if env is None:
            return {"ok": False, "reason": "error", "error": "no environment (not reset)",
                    "start": start, "end": time.time()}
        try:
            observation, reward, done, tool = check_step(_awaited(env.step(action)))
        except BaseException as exc:
            return self._failed("step", exc, start)
        return {"ok": True, "observation": observation, "reward": reward, "done": done,
                "tool_call": tool, "start": start, "end": time.time()}

    def replay(self, key: str, prompt: str, sample: dict, actions: list[str]
               ) -> list[dict[str, Any]]:
        """Rebuild trajectory `key`'s environment after a resume: reset, then step through
        the turns it had taken; the results in order (reset first). Stops at a failure."""
        results = [self.reset(key, prompt, sample)]
        for action in actions:
            if not results[-1]["ok"]:
                break
            results.append(self.step(key, action))
        return results

    def close(self, keys: list[str]) -> None:
        """Forget the environments of finished trajectories (calls `close()` if they have
        one; errors there are ignored)."""
        for key in keys:
            with self.lock:
                env = self.envs.pop(key, None)
            close = getattr(env, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):
                    close()

    @staticmethod
    def _failed(what: str, exc: BaseException, start: float) -> dict[str, Any]:
        detail = str(exc) if isinstance(exc, ValueError) and "returned" in str(exc) \
            else f"{what} raised {type(exc).__name__}: {exc}"
        return {"ok": False, "reason": "error", "error": _line(detail),
                "start": start, "end": time.time()}
