"""Run directories: claimed atomically, held by one run at a time, resumed only by the same graph.

- `claim_default_dir`: `runs/<name>-<time>/` made with an exclusive mkdir (a `-2`, `-3`, ...
  suffix when another run took the name in the same second), so two runs never share one.
- `hold`: an exclusive `flock` on `DIR/run.lock` for the whole run; a second run on the same
  folder is refused in one line (the kernel drops the lock when the process dies, however).
- `check_resume`: `--resume DIR` takes the graph on the command line (never code or spec
  from the run dir); it is compared with the spec the checkpoint was written by and refused,
  naming the first differing key, unless only resume-safe keys differ.
- `export_model`: the Hugging Face model folder of a checkpoint, copied out whole.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from rlgraph.errors import RLGraphError, shown
from rlgraph.runtime import checkpoint as ckpt

LOCK = "run.lock"
RESUME_SAFE = {("schedule", "steps"), ("checkpoint",), ("logging",)}  # a resume may change
MARKER = "run.json"  # what makes a folder a run dir `-o` may write into again
RLGRAPH_FILES = {"meta.json", ckpt.MANIFEST, "trainer.json", "trainer.safetensors",
                 "rollout.json", "rollout.safetensors", "rollout_cache.json",
                 "rollout_cache.safetensors"}


class RunDirError(RLGraphError):
    """A --resume / --out folder that cannot be used."""


def default_run_dir(name: str, now: float | None = None) -> Path:
    """runs/<name>-<YYYYmmdd-HHMMSS>/ (not yet claimed)."""
    safe = re.sub(r"[^\w.-]+", "-", name).strip("-.") or "run"
    return Path("runs") / f"{safe}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}"


def claim_default_dir(name: str, now: float | None = None) -> Path:
    """Create a fresh default run dir atomically (never one another run has claimed)."""
    base = default_run_dir(name, now)
    for n in range(1, 10_000):
        folder = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            folder.mkdir(parents=True)
            mark(folder, name)
            return folder
        except FileExistsError:
            continue
        except OSError as exc:
            raise RunDirError(f"cannot create the run dir {folder}: {exc.strerror or exc} "
                              f"(give a writable folder with --out)") from None
    raise RunDirError(f"{base}: 10000 runs of this name in one second; give --out")


def hold(folder: Path) -> Any:
    """Lock `folder` for this process's run; returns the open lock file (keep it open)."""
    import fcntl

    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = (folder / LOCK).open("a+")
    except OSError as exc:
        raise RunDirError(f"cannot write into the run dir {folder}: {exc.strerror or exc} "
                          f"(give a writable folder with --out)") from None
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        owner = lock.read().strip() or "?"
        lock.close()
        raise RunDirError(f"{folder}: another rlgraph run (pid {owner}) is writing into it; "
                          f"wait for it to end or give another --out") from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


def release(folder: Path, lock: Any) -> None:
    """End of a run: remove DIR/run.lock (while still holding it) and let it go."""
    with contextlib.suppress(OSError):
        (folder / LOCK).unlink()
    with contextlib.suppress(OSError):
        lock.close()


def refuse_reuse(folder: Path, graph: str | None = None) -> None:
    """`run -o DIR`: DIR must be new, empty, or a run of the same graph (its `run.json`
    says so) that has no progress to lose; anything else is the user's and is refused, so
    nothing of theirs is overwritten or deleted."""
    ledger = folder / "ledger.jsonl"
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise RunDirError(f"-o {shown(folder)}: exists and is not a folder; give a new folder")
    if not folder.exists():
        return
    try:
        entries = [p.name for p in folder.iterdir()]
    except OSError as exc:
        raise RunDirError(f"-o {shown(folder)}: cannot list it: {exc.strerror or exc}; give "
                          f"a new folder") from None
    if not entries:
        return
    if ((folder / ckpt.CHECKPOINT / ckpt.MANIFEST).is_file() or ckpt.archived(folder)
            or (ledger.is_file() and ledger.stat().st_size)):
        raise RunDirError(f"{folder} holds a run already; continue it with --resume {folder} "
                          f"or give another --out")
    owner = read_marker(folder)
    if owner is None:
        raise RunDirError(f"-o {shown(folder)}: the folder holds files that no `rlgraph run` "
                          f"wrote ({shown(', '.join(sorted(entries)[:3]))}"
                          f"{', ...' if len(entries) > 3 else ''}); rlgraph writes only into a "
                          f"new or empty folder or a run of the same graph: give another -o")
    if graph is not None and owner != graph:
        raise RunDirError(f"-o {shown(folder)}: a run of the graph '{shown(owner)}', not of "
                          f"'{shown(graph)}'; give another -o")


def read_marker(folder: Path) -> str | None:
    """The graph name in DIR/run.json (None: no rlgraph run made this folder)."""
    from rlgraph.readback import ReadBackError, read_json

    try:
        data = read_json(folder / MARKER)
    except ReadBackError:
        return None
    graph = data.get("graph") if isinstance(data, dict) else None
    return graph if isinstance(graph, str) else None


def mark(folder: Path, graph: str) -> None:
    """Write DIR/run.json: this folder is a run of `graph` (see `refuse_reuse`)."""
    try:
        (folder / MARKER).write_text(json.dumps({"graph": graph, "created": time.time()}) + "\n")
    except OSError as exc:
        raise RunDirError(f"cannot write into the run dir {shown(folder)}: "
                          f"{exc.strerror or exc} (give a writable folder with --out)") from None


def first_difference(saved: Any, given: Any, key: tuple = ()) -> tuple | None:
    """The first key (as a path) where two spec dicts differ, ignoring RESUME_SAFE keys."""
    if key in RESUME_SAFE:
        return None
    if isinstance(saved, dict) and isinstance(given, dict):
        for name in sorted(set(saved) | set(given), key=str):
            if name not in saved or name not in given:
                if (*key, name) not in RESUME_SAFE:
                    return (*key, name)
                continue
            found = first_difference(saved[name], given[name], (*key, name))
            if found is not None:
                return found
        return None
    return None if saved == given else key


def saved_meta(folder: Path) -> dict[str, Any]:
    """meta.json of the run's checkpoint, its files checked against the manifest."""
    paths = ckpt.verified_files(ckpt.checkpoint_folder(folder))
    return ckpt.check_meta(ckpt.read_json_file(paths["meta.json"]), paths["meta.json"])


def with_defaults(saved: dict[str, Any]) -> dict[str, Any]:
    """The run's recorded graph as this rlgraph reads it: a key added to the schema since
    the run started takes its default (what the run ran with); a key since removed is
    dropped. A recorded graph this rlgraph refuses is returned as recorded."""
    from pydantic import ValidationError

    from rlgraph.config.schema import Spec

    data = json.loads(json.dumps(saved))
    for _ in range(64):
        try:
            return Spec.model_validate(data).to_yaml_dict()
        except ValidationError as exc:
            extra = [e["loc"] for e in exc.errors() if e["type"] == "extra_forbidden"]
            if not extra or not _drop(data, extra[0]):
                return saved
        except Exception:  # a validator refused a recorded value: compare it as recorded
            return saved
    return saved


def _drop(data: Any, loc: tuple) -> bool:
    for k in loc[:-1]:
        if isinstance(data, dict) and k in data:
            data = data[k]
        else:
            return False
    if isinstance(data, dict) and loc[-1] in data:
        del data[loc[-1]]
        return True
    return False


def check_resume(folder: Path, spec_data: dict[str, Any], graph: str) -> dict[str, Any]:
    """The checkpoint's meta, after refusing a graph that differs from the run's."""
    if not folder.is_dir():
        raise RunDirError(f"--resume {folder}: not a directory (give the folder a run wrote)")
    meta = saved_meta(folder)
    saved = meta.get("spec")
    if not isinstance(saved, dict):
        raise RunDirError(f"{folder}: its checkpoint does not record the graph it was "
                          f"written by (an older rlgraph); start the run again")
    check_run_files(folder)
    saved = with_defaults(saved)
    # compare as JSON would store them (tuples as lists, ...)
    key = first_difference(saved, json.loads(json.dumps(spec_data)))
    if key is not None:
        dotted = ".".join(str(k) for k in key)
        theirs, ours = _at(saved, key), _at(spec_data, key)
        fix = (f"add the override {dotted}={_short(theirs)}" if not isinstance(
            theirs, dict | list) and theirs != "<absent>" else
            "resume with the graph and overrides the run started with")
        raise RunDirError(f"--resume {folder}: {shown(graph)} differs from the run's graph at "
                          f"'{shown(dotted)}' (run: {_short(theirs)}, given: {_short(ours)}); "
                          f"{fix} (only schedule.steps / --steps and checkpoint.* may change)")
    return meta


def check_run_files(folder: Path) -> None:
    """Read what a resumed run reads back besides its checkpoint (trace.json, metrics.jsonl,
    ledger.jsonl) now, before Ray starts: a damaged one is refused in one line here."""
    from rlgraph.runtime.metrics import read_rows
    from rlgraph.runtime.tracing import load_events

    load_events(folder / "trace.json")
    read_rows(folder / "metrics.jsonl")
    ckpt.read_ledger(folder / "ledger.jsonl")


def _at(data: Any, key: tuple) -> Any:
    for k in key:
        if not isinstance(data, dict) or k not in data:
            return "<absent>"
        data = data[k]
    return data


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return shown(text if len(text) <= 60 else text[:57] + "...")


def export_model(source: Path, out: Path) -> list[str]:
    """Copy the Hugging Face model folder of a run's checkpoint (or of a checkpoint folder)
    into `out`, checked against its manifest; returns the file names. Writes only inside
    `out` (new, or an empty folder), follows no link, and on failure removes only what it
    made."""
    folder = source if (source / ckpt.MANIFEST).exists() else ckpt.checkpoint_folder(source)
    paths = ckpt.verified_files(folder)
    names = sorted(n for n in paths if n not in RLGRAPH_FILES)
    if "config.json" not in names:
        raise RunDirError(f"{folder}: no config.json in this checkpoint (written by an older "
                          f"rlgraph); nothing to export")
    made = False
    try:
        if out.is_symlink() or (out.exists() and not out.is_dir()):
            raise RunDirError(f"{shown(out)}: exists and is not a folder; give a new folder")
        if out.exists() and any(out.iterdir()):
            raise RunDirError(f"{shown(out)}: exists and is not empty; give a new folder")
        if not out.exists():
            out.mkdir(parents=True)
            made = True
        part = out / ".export.partial"
        part.mkdir()
        for name in names:
            shutil.copyfile(paths[name], part / name, follow_symlinks=False)
        for name in names:
            os.replace(part / name, out / name)
        part.rmdir()
    except OSError as exc:
        what = exc.strerror or str(exc)
        if exc.errno == errno.ENAMETOOLONG:
            what += f" ({max(len(p) for p in out.parts)} characters in one name; at most 255)"
        if made:
            shutil.rmtree(out, ignore_errors=True)
        else:
            shutil.rmtree(out / ".export.partial", ignore_errors=True)
            for name in names:
                with contextlib.suppress(OSError):
                    (out / name).unlink()
        raise RunDirError(f"cannot write {shown(out)}: {what}") from None
    return names
