"""RUN_DIR/run.log: what `rlgraph run` printed (stdout and stderr), kept with the run.

`RunLog(folder)` mirrors every line written to `sys.stdout` / `sys.stderr` into run.log
(appended, so a resumed run's lines follow the first one's), stamped with the UTC time.
Terminal control sequences (colours, the progress bar's redraws) are left out of the file;
the bar itself is drawn on the terminal only and logged as a plain line every 10%.
The file stops growing at `MAX_BYTES` (one line says so), so a chatty run cannot fill the
disk through it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, TextIO

from rlgraph.errors import ESCAPES

MAX_BYTES = 64 << 20


def plain(text: str) -> str:
    """`text` without terminal escape sequences and other control characters (tabs and
    line breaks kept)."""
    text = ESCAPES.sub("", text)
    return "".join(ch for ch in text if ch in "\t\n" or ch.isprintable())


class _Mirror:
    """A text stream that writes to `stream` and copies whole lines into the log."""

    def __init__(self, stream: TextIO, log: RunLog) -> None:
        self.stream, self.log, self.pending = stream, log, ""

    def write(self, text: str) -> int:
        self.log.add(self, text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ...
        return getattr(self.stream, name)


class RunLog:
    """Mirror stdout and stderr into `folder/run.log` until `close` (a context manager)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "run.log"
        self.written = 0
        self.file: TextIO | None = None
        try:
            self.file = self.path.open("a", encoding="utf-8", errors="backslashreplace")
            self.written = self.path.stat().st_size
        except OSError:  # an unwritable run dir is refused elsewhere; the run needs no log
            self.file = None
        self.saved = (sys.stdout, sys.stderr)
        self.terminal = sys.stdout  # the progress bar draws here, never into the file

    def __enter__(self) -> RunLog:
        if self.file is not None:
            sys.stdout, sys.stderr = _Mirror(sys.stdout, self), _Mirror(sys.stderr, self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, mirror: _Mirror, text: str) -> None:
        """Take `text` written to `mirror`; complete lines go to the file."""
        mirror.pending += text
        *lines, mirror.pending = mirror.pending.split("\n")
        for line in lines:
            self.line(line)

    def line(self, text: str) -> None:
        """One line into the file (control sequences removed, a carriage return's overwritten
        part dropped)."""
        if self.file is None:
            return
        text = plain(text.rsplit("\r", 1)[-1])
        if not text.strip():
            return
        entry = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {text}\n"
        if self.written + len(entry) > MAX_BYTES:
            if self.written < MAX_BYTES + 1:
                self.file.write(f"(run.log stops here: it reached {MAX_BYTES} bytes)\n")
                self.written = MAX_BYTES + 1
            return
        try:
            self.file.write(entry)
            self.file.flush()
            self.written += len(entry)
        except OSError:  # a full disk: the run goes on, the log stops
            self.file = None

    def close(self) -> None:
        """Restore stdout / stderr and close the file."""
        for mirror in (sys.stdout, sys.stderr):
            if isinstance(mirror, _Mirror) and mirror.pending:
                self.line(mirror.pending)
                mirror.pending = ""
        sys.stdout, sys.stderr = self.saved
        if self.file is not None:
            self.file.close()
            self.file = None
