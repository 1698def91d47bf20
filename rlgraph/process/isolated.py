"""User code in a child process: a deadline on every call, its output captured and capped.

A reward function (or an agentic environment) is the user's Python: it may sleep, loop for
ever, print megabytes or kill its process. `Isolated(ref)` loads `ref` (`module:function`
or `file.py:function`, found as `rlgraph.rl.rewards.load_reward_fn` finds it) in a child
process of its own and calls it there:

- `map(calls, timeout_s)` sends a list of keyword-argument dicts and yields each result in
  order; a call that does not return within `timeout_s` seconds kills the child (the next
  call starts a fresh one) and raises `CallTimeout` naming the call's index. A call that
  raises is `CallFailed` with the exception's type and text (text capped at
  `MAX_ERROR_CHARS`); a child that dies is `CallFailed` too, with its exit status;
- everything the child writes to stdout / stderr (print, C extensions, subprocesses) goes
  to an unnamed temporary file that `take_output()` reads (up to `output_cap` bytes, the
  rest counted and dropped) and empties, so the caller can store it where the user looks
  and the disk holds at most one batch's output.

The child is started with `python -m rlgraph.process.isolated` (never fork: the parent is a
threaded Ray worker), speaking pickle over a socket pair, and exits when the parent closes
it or dies (on Linux it is killed with its parent, even mid-call). Results must pickle; one
that does not is `CallFailed`.

Reused by anything that runs a user's function per sample: `Isolated(ref).map(calls,
timeout_s)`; `rlgraph.rl.rewards.score_samples` shows how failures become one-line errors.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

OUTPUT_CAP = 64 << 10  # bytes of a child's output kept per take_output()
MAX_ERROR_CHARS = 4000  # of an exception's text sent back
START_S = 60.0  # longest wait for the child to import the function


class IsolatedError(Exception):
    """A call in the child did not give a result."""

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message)
        self.index = index


class CallTimeout(IsolatedError):
    """The call did not return within its deadline (the child was killed)."""


class CallFailed(IsolatedError):
    """The call raised, returned something that does not pickle, or the child died."""


class Isolated:
    """A child process running one user function (see the module docstring)."""

    def __init__(self, ref: str, base_dir: Path | None = None,
                 output_cap: int = OUTPUT_CAP) -> None:
        self.ref, self.base_dir, self.output_cap = ref, base_dir, output_cap
        self.proc: subprocess.Popen[bytes] | None = None
        self.conn: Connection | None = None
        # O_APPEND, emptied by take_output; closed with this object
        self._output = tempfile.TemporaryFile(mode="a+b")  # noqa: SIM115

    # ------------------------------------------------------------ the child

    def start(self) -> None:
        """Start the child now (else the first `map` does); loading failures raise here."""
        if self.proc is None or self.proc.poll() is not None:
            self._forget()
            self._start()

    def _start(self) -> None:
        parent, child = socket.socketpair()
        # the child imports what the worker can import (Ray may have added to sys.path)
        path = os.pathsep.join(p for p in sys.path if p)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlgraph.process.isolated", str(child.fileno()), self.ref,
             str(self.base_dir or "")],
            pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=self._output,
            stderr=subprocess.STDOUT, env=env, start_new_session=True)
        child.close()
        self.conn = Connection(parent.detach())
        if not self.conn.poll(START_S):
            self.close()
            raise CallFailed(f"the process running {self.ref} did not start within "
                             f"{START_S:g} s", -1)
        status = self._receive(-1)
        if status[0] != "ready":
            self.close()
            raise CallFailed(status[1], -1)

    def take_output(self) -> str:
        """What the child printed since the last call of this (capped; a last line says how
        much was dropped)."""
        fd = self._output.fileno()
        size = os.fstat(fd).st_size
        data = os.pread(fd, min(size, self.output_cap), 0)
        os.ftruncate(fd, 0)
        text = data.decode("utf-8", "replace")
        if size > len(data):
            text += (f"\n... {size - len(data)} more bytes of output dropped (cap "
                     f"{self.output_cap} bytes)\n")
        return text

    def _receive(self, index: int) -> tuple[Any, ...]:
        assert self.conn is not None and self.proc is not None
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            code = self.proc.wait(timeout=5)
            self._forget()
            raise CallFailed(f"the process running {self.ref} ended (exit status {code}) "
                             f"during the call", index) from None
        except Exception as exc:  # a result pickle cannot rebuild here
            self.close()
            raise CallFailed(f"its result could not be read back ({type(exc).__name__})",
                             index) from None

    # ------------------------------------------------------------ calls

    def map(self, calls: Sequence[dict[str, Any]], timeout_s: float | None) -> Iterator[Any]:
        """The result of `fn(**kwargs)` for each dict of `calls`, in order (see the module
        docstring for the errors). A caller that stops early stops the child too (its
        remaining replies would otherwise answer the next batch)."""
        if not calls:
            return
        self.start()
        assert self.conn is not None
        self.conn.send(("map", list(calls)))
        answered, failed = 0, False
        try:
            for index in range(len(calls)):
                if not self.conn.poll(timeout_s):
                    self.close()
                    raise CallTimeout(f"did not return within timeout_s={timeout_s:g} s "
                                      f"(the process running it was stopped)", index)
                reply = self._receive(index)
                answered += 1
                if reply[0] != "ok":
                    failed = True  # the child stops the batch there: nothing more comes
                    raise CallFailed(reply[1], index)
                yield reply[1]
        finally:
            if answered < len(calls) and not failed and self.conn is not None:
                self.close()  # left mid-batch: its remaining replies would still come

    def close(self) -> None:
        """Stop the child (killed if it does not end at once)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, 9)  # and whatever the user's code started
            with contextlib.suppress(Exception):
                self.proc.kill()
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=5)
        self._forget()

    def _forget(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.close()
        self.conn = None
        self.proc = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


# ---------------------------------------------------------------- the child's side


def _short(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else (
        text[:MAX_ERROR_CHARS] + f"... ({len(text) - MAX_ERROR_CHARS} more characters)")


def _child(fd: int, ref: str, base_dir: str) -> None:
    """Load `ref`, answer 'ready' (or why not), then serve `map` requests until EOF."""
    import pickle

    with contextlib.suppress(Exception):  # Linux: die with the worker that started us
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    conn = Connection(fd)
    try:
        from rlgraph.rl.rewards import load_reward_fn

        fn = load_reward_fn(ref, base_dir=Path(base_dir) if base_dir else None)
    except BaseException as exc:  # the user's module may raise anything, SystemExit too
        conn.send(("error", _short(f"loading {ref} failed: {type(exc).__name__}: {exc}")))
        return
    conn.send(("ready",))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        for kwargs in request[1]:
            try:
                value = fn(**kwargs)
                pickle.dumps(value)
                reply: tuple[Any, ...] = ("ok", value)
            except BaseException as exc:  # SystemExit and the like too
                if isinstance(exc, pickle.PicklingError | TypeError) and "pickle" in str(exc):
                    reply = ("error", f"returned a {type(value).__name__} that cannot be "
                             f"sent back")
                else:
                    reply = ("error", _short(f"raised {type(exc).__name__}: {exc}"))
            sys.stdout.flush()
            sys.stderr.flush()
            conn.send(reply)
            if reply[0] != "ok":
                break  # the caller stops at the first failure


if __name__ == "__main__":
    _child(int(sys.argv[1]), sys.argv[2], sys.argv[3])
