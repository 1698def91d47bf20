"""The env pool: where trajectories' environments run while the policy decodes.

`EnvPool.of(spec, base_dir)` gives a pool of `workers` Ray actors (each an `EnvHost` on up to
`threads` threads, 0 CPUs reserved) when Ray is running, else the same hosts on threads of
this process (tests, the serial driver). A trajectory's environment lives on one worker
(a stable hash of its key). Calls are submitted and polled, so the decoder keeps going while
environments step; a call that takes longer than `timeout_s` is answered
`{"ok": False, "reason": "timeout"}` (its thread is left to finish and is never waited for).
"""

from __future__ import annotations

import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from rlgraph.envs.host import EnvHost
from rlgraph.envs.spec import EnvSpec


@dataclass
class Call:
    """One env call in flight."""

    key: str
    what: str  # reset | step | replay
    submitted: float
    handle: Any  # a Ray ObjectRef, or a `_ThreadResult`


@dataclass
class _ThreadResult:
    """The result slot of a call running on a daemon thread."""

    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None


class EnvPool:
    """Environments of the trajectories in flight (see the module docstring)."""

    def __init__(self, spec: EnvSpec, base_dir: str | None, use_ray: bool):
        self.spec, self.timeout_s = spec, spec.timeout_s
        config = spec.config()
        self.use_ray = use_ray
        if use_ray:
            import ray

            actor = ray.remote(num_cpus=0, max_concurrency=spec.threads)(EnvHost)
            self.hosts = [actor.remote(spec.fn, config, base_dir) for _ in range(spec.workers)]
            ray.get([h.ping.remote() for h in self.hosts])  # a constructor error raises here
        else:
            self.hosts = [EnvHost(spec.fn, config, base_dir)]
        self._signal = threading.Event()  # a thread call finished (thread pool)
        self.busy_s = 0.0  # env seconds since the last `take_spans`
        self.spans: list[tuple[float, float]] = []  # wall-clock (start, end) of env calls

    @classmethod
    def of(cls, spec: EnvSpec, base_dir: str | None) -> EnvPool:
        """A Ray pool when Ray is running in this process, else a thread pool."""
        try:
            import ray

            use_ray = ray.is_initialized()
        except ImportError:
            use_ray = False
        return cls(spec, base_dir, use_ray)

    def _host(self, key: str) -> Any:
        return self.hosts[zlib.crc32(key.encode()) % len(self.hosts)]

    def submit(self, what: str, key: str, *args: Any) -> Call:
        """Start `what` (reset, step, replay) for trajectory `key`."""
        host = self._host(key)
        if self.use_ray:
            handle = getattr(host, what).remote(key, *args)
        else:
            handle = _ThreadResult()

            def work(slot: _ThreadResult = handle) -> None:
                slot.value = getattr(host, what)(key, *args)
                slot.done.set()
                self._signal.set()

            threading.Thread(target=work, daemon=True, name=f"env-{what}").start()
        return Call(key, what, time.time(), handle)

    def poll(self, calls: list[Call], wait_s: float) -> list[tuple[Call, Any]]:
        """The calls that finished or timed out within `wait_s` seconds, with their results
        (a timed-out call's: `{"ok": False, "reason": "timeout"}`); at least one returns
        when `wait_s` > 0 and a call is due before then."""
        if not calls:
            return []
        deadline = time.time() + max(0.0, wait_s)
        while True:
            out = self._finished(calls)
            now = time.time()
            answered = {id(c) for c, _ in out}
            for call in calls:
                if id(call) not in answered and now - call.submitted > self.timeout_s:
                    out.append((call, {"ok": False, "reason": "timeout",
                                       "error": f"{call.what} took longer than timeout_s "
                                       f"{self.timeout_s:g}", "start": call.submitted,
                                       "end": now}))
            if out or now >= deadline:
                for _, result in out:
                    results = result if isinstance(result, list) else [result]
                    for r in results:
                        if "start" in r:
                            self.spans.append((r["start"], r["end"]))
                            self.busy_s += r["end"] - r["start"]
                return out
            soonest = min(c.submitted + self.timeout_s for c in calls)
            pause = max(0.0, min(deadline, soonest) - now)
            self._wait(calls, pause)

    def _finished(self, calls: list[Call]) -> list[tuple[Call, Any]]:
        if self.use_ray:
            import ray

            refs = [c.handle for c in calls]
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            ready = {r.hex() for r in done}
            finished = [c for c in calls if c.handle.hex() in ready]
            values = ray.get([c.handle for c in finished]) if finished else []
            return list(zip(finished, values))
        return [(c, c.handle.value) for c in calls if c.handle.done.is_set()]

    def _wait(self, calls: list[Call], seconds: float) -> None:
        if seconds <= 0:
            return
        if self.use_ray:
            import ray

            ray.wait([c.handle for c in calls], num_returns=1, timeout=seconds)
        else:
            self._signal.wait(seconds)
            self._signal.clear()

    def close(self, keys: list[str]) -> None:
        """Forget finished trajectories' environments (fire and forget)."""
        if not keys:
            return
        by_host: dict[int, list[str]] = {}
        for key in keys:
            by_host.setdefault(zlib.crc32(key.encode()) % len(self.hosts), []).append(key)
        for index, part in by_host.items():
            host = self.hosts[index]
            if self.use_ray:
                host.close.remote(part)
            else:
                host.close(part)

    def take_spans(self) -> tuple[float, list[tuple[float, float]]]:
        """Env seconds and the merged wall-clock intervals of env calls since the last take."""
        spans = sorted(self.spans)
        merged: list[list[float]] = []
        for start, end in spans:
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        busy, self.busy_s, self.spans = self.busy_s, 0.0, []
        return busy, [(a, b) for a, b in merged]
