"""Checkpoints and the ledger of trained prompts: what `--resume DIR` needs to go on at step k.

`DIR/checkpoint/` (the latest one; replaced atomically) holds no pickle, only data:
- the policy after train step k-1 (version k) as a Hugging Face model folder:
  `model.safetensors`, `config.json`, `generation_config.json` and the tokenizer's files
  (`AutoModelForCausalLM.from_pretrained(DIR/checkpoint)` loads it; see runtime.hf_folder);
- `trainer.json` + `trainer.safetensors`: the rest of the train workspace's state (optimizer
  state, seed, policy version) as JSON whose tensors live in the safetensors file;
- `rollout.json` + `rollout.safetensors`: the rollout buffer, batches generated but not yet
  trained (steps >= k), with every token's behaviour log-prob and version;
- `rollout_cache.json` + `.safetensors` (partial rollout only): per generate node, its
  rollout cache (prompt groups in flight, unfinished samples, next data position);
- `meta.json`: step k, policy version, data position, buffered steps, trace clock, and the
  graph it was written by;
- `manifest.json`: the SHA-256 and size of every other file, checked before anything is read.

Writes go to `checkpoint.tmp/` (each file fsync'd), which replaces `checkpoint/` by rename;
a crash or a full disk mid-write leaves the previous checkpoint as it was. Every problem
reading one (a file changed, truncated, empty, missing, not JSON) is a one-line
CheckpointError naming the file and what to do.

`DIR/ledger.jsonl` has one line per trained step with the prompt ids it trained on (fsync'd
before the checkpoint that covers the step is written); a resumed run cuts it at k and
appends, so it equals the ledger of an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlgraph.errors import RLGraphError
from rlgraph.limits import MAX_STEPS
from rlgraph.readback import MAX_SECONDS, count, finite_number, read_bytes, read_json
from rlgraph.runtime.hf_folder import MODEL_WEIGHTS
from rlgraph.runtime.state_files import StateFormatError, join, owned, split

CHECKPOINT = "checkpoint"
ARCHIVE = "checkpoints"  # older checkpoints kept by `checkpoint.keep_last` / `keep_every`
MANIFEST = "manifest.json"
FORMAT = 2
REQUIRED = ("meta.json", MODEL_WEIGHTS, "trainer.json", "trainer.safetensors", "rollout.json",
            "rollout.safetensors")
REDO = "restore the file from a copy of the run dir, or start the run again without --resume"


class CheckpointError(RLGraphError):
    """A run dir without a usable checkpoint, or a checkpoint that cannot be written."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: meta, the train workspace's state, the rollout buffer and the
    partial-rollout caches (generate node -> cache state)."""

    meta: dict[str, Any]
    state: dict[str, Any]
    rollout: dict[tuple[str, int], dict[str, Any]]
    caches: dict[str, dict[str, Any]] = field(default_factory=dict)
    folder: Path | None = None

    @property
    def step(self) -> int:
        """The next train step."""
        return int(self.meta["step"])


# ------------------------------------------------------------------------------- writing


def _tensor_bytes(tensors: dict[str, Any]) -> bytes:
    from safetensors.torch import save

    return save(tensors, metadata={"format": "pt"})


def checkpoint_files(meta: dict[str, Any], state: dict[str, Any],
                     rollout: dict[tuple[str, int], dict[str, Any]],
                     caches: dict[str, dict[str, Any]] | None = None,
                     policy_files: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """{file name: bytes} of a checkpoint (without its manifest)."""
    weights: dict[str, Any] = {}
    for k, v in state.get("weights", {}).items():
        weights[k] = owned(v, weights)  # tied embeddings: the second name gets a copy
    files = dict(policy_files or {})
    files[MODEL_WEIGHTS] = _tensor_bytes(weights)
    parts: dict[str, Any] = {
        "trainer": {k: v for k, v in state.items() if k != "weights"},
        "rollout": [{"node": n, "step": s, "batch": b} for (n, s), b in sorted(rollout.items())],
    }
    if caches:
        parts["rollout_cache"] = caches
    for name, value in parts.items():
        tree, tensors = split(value)
        files[f"{name}.json"] = json.dumps(tree).encode()
        files[f"{name}.safetensors"] = _tensor_bytes(tensors)
    meta = {**meta, "format": FORMAT, "rollout_steps": sorted({s for _, s in rollout}),
            "written": time.time()}
    files["meta.json"] = (json.dumps(meta, indent=2) + "\n").encode()
    return files


def write_folder(folder: Path, files: dict[str, bytes]) -> None:
    """`files` and their manifest into `folder` (created), each fsync'd."""
    folder.mkdir(parents=True)
    manifest = {"format": FORMAT, "files": {
        name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        for name, data in sorted(files.items())}}
    for name, data in [*files.items(), (MANIFEST, json.dumps(manifest, indent=2).encode())]:
        with (folder / name).open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be fsync'd
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class Keep:
    """Which checkpoints a run keeps: the `last` newest (the latest, `checkpoint/`, is one of
    them) and every one whose step is a multiple of `every` (0: none), in `checkpoints/<step>/`."""

    last: int = 1
    every: int = 0

    def kept(self, steps: list[int]) -> set[int]:
        """The archived steps to keep, given the archived steps (the latest not among them)."""
        newest = sorted(steps, reverse=True)[: max(self.last - 1, 0)]
        return set(newest) | {s for s in steps if self.every and s % self.every == 0}


def save_checkpoint(run_dir: Path, meta: dict[str, Any], state: dict[str, Any],
                    rollout: dict[tuple[str, int], dict[str, Any]],
                    caches: dict[str, dict[str, Any]] | None = None,
                    policy_files: dict[str, bytes] | None = None, keep: Keep = Keep()) -> Path:
    """Write DIR/checkpoint: into `checkpoint.tmp/` first (every file fsync'd); only then is
    the previous one moved to `checkpoints/<step>/` and the new one renamed into place, and
    only after that are archived ones beyond `keep` removed. A crash or a full disk at any
    point leaves a complete earlier checkpoint (a full disk is a CheckpointError saying so)."""
    final = run_dir / CHECKPOINT
    tmp = run_dir / f"{CHECKPOINT}.tmp"
    try:
        files = checkpoint_files(meta, state, rollout, caches, policy_files)
    except StateFormatError as exc:
        raise CheckpointError(f"cannot write the checkpoint at step {meta.get('step')}: "
                              f"{exc}") from None
    try:
        shutil.rmtree(tmp, ignore_errors=True)  # a write a crash cut short (never the last one)
        write_folder(tmp, files)
        if final.is_dir() and not final.is_symlink():
            target = run_dir / ARCHIVE / _archive_name(final)
            target.parent.mkdir(exist_ok=True)
            if target.exists():  # an earlier copy of the step `final` holds whole
                shutil.rmtree(target)
            final.rename(target)
        tmp.rename(final)
        _fsync_dir(run_dir)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        kept = kept_step(run_dir)
        raise CheckpointError(
            f"cannot write the checkpoint at step {meta.get('step')} into {final}: "
            f"{exc.strerror or exc}; "
            + (f"the checkpoint at step {kept} stays valid (free space, then --resume "
               f"{run_dir})" if kept is not None else "no earlier checkpoint exists")) from None
    prune(run_dir, keep)
    return final


def _archive_name(folder: Path) -> str:
    """`<step>` of a checkpoint folder (from its meta.json), or `unreadable-<time>`."""
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        step = json.loads((folder / "meta.json").read_text())["step"]
        if isinstance(step, int) and step >= 0:
            return str(step)
    return f"unreadable-{time.strftime('%Y%m%d-%H%M%S')}"


def archived(run_dir: Path) -> dict[int, Path]:
    """step -> folder of the checkpoints kept in `DIR/checkpoints/` (newest last)."""
    root = run_dir / ARCHIVE
    if not root.is_dir() or root.is_symlink():
        return {}
    found = {int(p.name): p for p in root.iterdir()
             if p.name.isdigit() and p.is_dir() and not p.is_symlink()}
    return dict(sorted(found.items()))


def prune(run_dir: Path, keep: Keep) -> None:
    """Remove archived checkpoints beyond `keep` (the latest, `checkpoint/`, stays)."""
    folders = archived(run_dir)
    wanted = keep.kept(list(folders))
    for step, folder in folders.items():
        if step not in wanted:
            shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(run_dir / f"{CHECKPOINT}.old", ignore_errors=True)  # an older rlgraph's


def kept_step(run_dir: Path) -> int | None:
    """The step of the checkpoint that survives a failed write (None when there is none)."""
    with contextlib.suppress(CheckpointError, OSError, ValueError, KeyError, TypeError):
        folder = checkpoint_folder(run_dir)
        return int(json.loads((folder / "meta.json").read_text())["step"])
    return None


# ------------------------------------------------------------------------------- reading


def checkpoint_folder(run_dir: Path) -> Path:
    """DIR/checkpoint; when a crash came between moving it aside and renaming its successor
    into place, the newest complete one in DIR/checkpoints/ (or an older rlgraph's
    DIR/checkpoint.old)."""
    folder = run_dir / CHECKPOINT
    if folder.is_symlink():
        raise CheckpointError(f"{folder}: a symbolic link; rlgraph reads checkpoints only from "
                              f"folders it wrote inside the run dir (copy the folder there)")
    if not (folder / MANIFEST).exists():
        fallbacks = [*reversed(archived(run_dir).values()), run_dir / f"{CHECKPOINT}.old"]
        found = next((f for f in fallbacks if (f / MANIFEST).is_file()), None)
        if found is not None and not (folder.is_dir() and any(
                (folder / n).exists() for n in ("trainer.pt", "rollout.pt"))):
            folder = found
    if not folder.is_dir():
        raise CheckpointError(f"{run_dir}: no checkpoint to resume from (a run writes "
                              f"{CHECKPOINT}/ every few steps, at its end and when stopped)")
    if not (folder / MANIFEST).exists():
        if any((folder / n).exists() for n in ("trainer.pt", "rollout.pt")):
            raise CheckpointError(f"{folder}: a checkpoint in the old pickle format "
                                  f"(trainer.pt), which rlgraph no longer loads because "
                                  f"unpickling can run code; start the run again")
        raise CheckpointError(f"{folder / MANIFEST}: missing, so the checkpoint cannot be "
                              f"checked; {REDO}")
    return folder


def verified_files(folder: Path) -> dict[str, Path]:
    """The files the manifest lists, each checked (present, size, SHA-256)."""
    manifest = read_json_file(folder / MANIFEST)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{folder / MANIFEST}: not a format-{FORMAT} rlgraph manifest; "
                              f"{REDO}")
    listed = manifest.get("files")
    if not isinstance(listed, dict):
        raise CheckpointError(f"{folder / MANIFEST}: no 'files' table; {REDO}")
    for name in REQUIRED:
        if name not in listed:
            raise CheckpointError(f"{folder / name}: not in {MANIFEST} (an incomplete "
                                  f"checkpoint); {REDO}")
    paths = {}
    for name, entry in listed.items():
        path = folder / name
        if Path(name).name != name or not isinstance(entry, dict):
            raise CheckpointError(f"{folder / MANIFEST}: bad entry {name!r}; {REDO}")
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise CheckpointError(f"{path}: a link or not a regular file; a checkpoint holds "
                                  f"only the files rlgraph wrote; {REDO}")
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (listed in {MANIFEST}); {REDO}")
        data = read_bytes(path, REDO, CheckpointError)
        if not data and entry.get("bytes"):
            raise CheckpointError(f"{path}: empty file ({MANIFEST} lists {entry['bytes']} "
                                  f"bytes); {REDO}")
        if len(data) != entry.get("bytes"):
            raise CheckpointError(f"{path}: {len(data)} bytes, {MANIFEST} lists "
                                  f"{entry.get('bytes')} (truncated or changed); {REDO}")
        if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            raise CheckpointError(f"{path}: SHA-256 differs from {MANIFEST} (changed or "
                                  f"damaged after the run wrote it); {REDO}")
        paths[name] = path
    return paths


def read_json_file(path: Path) -> Any:
    """A JSON file, or a one-line CheckpointError naming it."""
    return read_json(path, REDO, CheckpointError)


META_COUNTS = {"step": 2**53, "policy_version": 2**53, "steps": MAX_STEPS,
               "data_position": 2**53, "generate_next_step": 2**53, "max_lag": 2**16}


def check_meta(meta: Any, where: Path) -> dict[str, Any]:
    """meta.json's figures, each of the right type and range (one line naming the key)."""
    if not isinstance(meta, dict):
        raise CheckpointError(f"{where}: not a mapping; {REDO}")
    for key in ("step", "policy_version"):
        if key not in meta:
            raise CheckpointError(f"{where}: no integer '{key}'; {REDO}")
    for key, upper in META_COUNTS.items():
        if key in meta:
            meta[key] = count(meta[key], f"{where}: '{key}'", upper, CheckpointError)
    if meta.get("steps") == 0:
        raise CheckpointError(f"{where}: 'steps' is 0 (a run trains at least one step); {REDO}")
    if "trace_end_s" in meta:
        finite_number(meta["trace_end_s"], f"{where}: 'trace_end_s'", upper=MAX_SECONDS,
                      error=CheckpointError)
    return meta


def read_tensors(path: Path) -> dict[str, Any]:
    """A safetensors file, or a one-line CheckpointError naming it."""
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for a broken header
        raise CheckpointError(f"{path}: not a safetensors file "
                              f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
                              f"; {REDO}") from None


def _part(paths: dict[str, Path], name: str) -> Any:
    try:
        return join(read_json_file(paths[f"{name}.json"]),
                    read_tensors(paths[f"{name}.safetensors"]))
    except StateFormatError as exc:
        raise CheckpointError(f"{paths[f'{name}.json']}: {exc}; {REDO}") from None


def load_checkpoint(run_dir: Path) -> Checkpoint:
    """Read and check DIR/checkpoint (manifest first); runs no code from the run dir."""
    folder = checkpoint_folder(run_dir)
    paths = verified_files(folder)
    meta = check_meta(read_json_file(paths["meta.json"]), paths["meta.json"])
    state = _part(paths, "trainer")
    rows = _part(paths, "rollout")
    if not isinstance(state, dict) or not isinstance(rows, list):
        raise CheckpointError(f"{folder}: trainer.json / rollout.json hold the wrong kind of "
                              f"value; {REDO}")
    state["weights"] = read_tensors(paths[MODEL_WEIGHTS])
    state["policy_version"] = int(meta["policy_version"])
    try:
        rollout = {(r["node"], int(r["step"])): r["batch"] for r in rows}
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{paths['rollout.json']}: rows without node/step/batch; "
                              f"{REDO}") from None
    caches = _part(paths, "rollout_cache") if "rollout_cache.json" in paths else {}
    return Checkpoint(meta, state, rollout, caches, folder)


# -------------------------------------------------------------------------------- ledger


class Ledger:
    """DIR/ledger.jsonl: the prompt ids trained at each step (resume cuts it at step k)."""

    def __init__(self, run_dir: Path, first_step: int = 0) -> None:
        self.path = run_dir / "ledger.jsonl"
        keep = [r for r in read_ledger(self.path) if r["step"] < first_step]
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in keep))
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)

    def append(self, step: int, uids: list[str], policy_version: int,
               stale_tokens: int = 0) -> None:
        """Record what train step `step` trained on (on disk before this returns);
        `stale_tokens`: response tokens left out of its loss for exceeding the lag bound."""
        row = {"step": step, "policy_version": policy_version, "prompt_uids": uids}
        if stale_tokens:
            row["stale_tokens"] = stale_tokens
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """Rows of a ledger.jsonl, in step order (a last line cut short by a crash is dropped;
    any other line that is not a row with a whole `step` is a one-line CheckpointError)."""
    if not path.exists() and not path.is_symlink():
        return []
    try:
        lines = read_bytes(path, REDO, CheckpointError).decode("utf-8").split("\n")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path}: not UTF-8 text (byte {exc.start}); {REDO}") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                if number == len(lines):
                    continue  # a line half-written when the process was killed
                raise CheckpointError(f"{path}:{number}: not a JSON row; {REDO}") from None
            if not isinstance(row, dict):
                raise CheckpointError(f"{path}:{number}: not a mapping; {REDO}")
            count(row.get("step"), f"{path}:{number}: 'step'", error=CheckpointError)
            rows.append(row)
    return sorted(rows, key=lambda r: r["step"])
