"""Prompts: built-in seeded tasks with exact answers, or jsonl / parquet files in verl's format.

A row is `{prompt, reward_model: {ground_truth}, data_source, extra_info}` where `prompt`
is a string or a chat message list. `DataSource.batch(step)` is a pure function of
`(seed, step)`: the examples at positions `step * prompts_per_step ...` of a seeded,
epoch-shuffled stream, so a run resumed at step k reads exactly what it would have read.
Every example carries a stable `uid` (task:index or file:row) for the ledger of trained prompts.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlgraph.errors import MissingDependencyError, RLGraphError, SpecError, did_you_mean, shown
from rlgraph.lengths import LengthModel, of
from rlgraph.presets.tasks import TASKS

if TYPE_CHECKING:
    from rlgraph.config.schema import DataSpec
    from rlgraph.model.tokenizer import Prompt


class DataError(RLGraphError):
    """A data file or row that cannot be used; the message names the file and row."""


@dataclass
class Example:
    """One prompt with its verifiable answer."""

    uid: str
    prompt: Prompt
    ground_truth: Any
    data_source: str
    extra_info: dict[str, Any] = field(default_factory=dict)
    where: str = ""  # a file row as a user finds it: `train.jsonl:line 12` (1-based)

    def __post_init__(self) -> None:
        self.where = self.where or self.uid


def task_example(task: str, seed: int, split: str, index: int,
                 lengths: LengthModel | None = None) -> Example:
    """Example `index` of a built-in task's `split` stream (same everywhere for one seed)."""
    prompt, answer = TASKS[task](random.Random(f"{seed}:{task}:{split}:{index}"), lengths)
    extra = {"index": index, "split": split}
    return Example(f"{task}:{split}:{index}", prompt, answer, task, extra)


# ---------------------------------------------------------------- files


CHECK_ROWS = 64  # rows of each data file `rlgraph compile` reads and checks


def _read_rows(path: Path, limit: int | None = None) -> list[tuple[str, Any]]:
    """(where, row) of a .jsonl / .json / .parquet file (`where`: `file:line N` or
    `file:row N`, 1-based), the first `limit` rows when given. Text that is not UTF-8, JSON
    that does not parse and a file pyarrow cannot read are one-line DataErrors."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise MissingDependencyError(
                f"reading {path} needs pyarrow: pip install pyarrow (or convert it to .jsonl)"
            ) from None
        try:
            if limit is None:
                rows = pq.read_table(path).to_pylist()
            else:
                batches = pq.ParquetFile(path).iter_batches(batch_size=limit)
                rows = next(iter(batches), None)
                rows = [] if rows is None else rows.to_pylist()[:limit]
        except Exception as exc:  # pyarrow's own error types: a damaged or foreign file
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DataError(f"{shown(path)}: not a readable parquet file ({shown(first)[:200]})"
                            f"; give a verl-format .parquet or .jsonl file") from None
        return [(f"{shown(path)}:row {i + 1}", row) for i, row in enumerate(rows)]
    try:
        with path.open(encoding="utf-8") as f:
            if path.suffix == ".json":
                try:
                    rows = json.load(f)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{shown(path)}:{exc.lineno}:{exc.colno}: not valid JSON "
                                    f"({exc.msg})") from None
                if not isinstance(rows, list):
                    raise DataError(f"{shown(path)}: a .json data file must hold a list of rows")
                rows = rows if limit is None else rows[:limit]
                return [(f"{shown(path)}:row {i + 1}", row) for i, row in enumerate(rows)]
            out: list[tuple[str, Any]] = []
            for line_no, line in enumerate(f, 1):
                if limit is not None and len(out) >= limit:
                    break
                if not line.strip():
                    continue
                try:
                    out.append((f"{shown(path)}:line {line_no}", json.loads(line)))
                except (json.JSONDecodeError, RecursionError) as exc:
                    why = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deep"
                    raise DataError(f"{shown(path)}:{line_no}: not valid JSON ({why})") from None
            return out
    except UnicodeDecodeError as exc:
        raise DataError(f"{shown(path)}: not UTF-8 text (byte {exc.start}); save the data "
                        f"as UTF-8 JSON lines") from None
    except OSError as exc:
        raise DataError(f"{shown(path)}: cannot read it: {exc.strerror or exc}") from None


def check_file(path: Path, key: tuple[str | int, ...]) -> None:
    """What `rlgraph compile` checks of a data file: its first CHECK_ROWS rows read and
    turned into examples (verl's columns), and at least one row."""
    rows = _read_rows(path, CHECK_ROWS)
    if not rows:
        raise SpecError(f"data file '{shown(path)}' holds no rows", key,
                        hint="give a .jsonl / .parquet file in verl's format with at least "
                        "one row")
    for where, row in rows:
        _example_from_row(row, where, where)


def _example_from_row(row: Any, where: str, uid: str) -> Example:
    """A verl row -> Example, with a clear error for a missing or malformed field."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: a row must be a mapping with verl's columns (prompt, "
                        f"reward_model.ground_truth), got {type(row).__name__}")
    prompt = row.get("prompt")
    if isinstance(prompt, list):
        if not all(isinstance(m, dict) and "content" in m for m in prompt):
            raise DataError(f"{where}: 'prompt' messages need a 'content' (and a 'role')")
    elif not isinstance(prompt, str):
        have = ", ".join(sorted(map(str, row))[:6]) or "none"
        raise DataError(f"{where}: the row has no 'prompt' (a string or a list of messages); "
                        f"its columns: {shown(have)}")
    reward_model = row.get("reward_model") or {}
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise DataError(f"{where}: the row has no 'reward_model.ground_truth'")
    extra = row.get("extra_info") or {}
    return Example(uid, prompt, reward_model["ground_truth"], str(row.get("data_source", "")),
                   dict(extra) if isinstance(extra, dict) else {"value": extra})


def load_files(files: list[str], key: tuple[str, ...], base_dir: Path | None) -> list[Example]:
    """All rows of `files` (paths relative to the graph's folder, else to the working dir)."""
    examples: list[Example] = []
    for i, name in enumerate(files):
        path = Path(name).expanduser()
        if not path.is_absolute() and not path.exists() and base_dir is not None:
            path = base_dir / path
        if not path.exists():
            raise SpecError(f"data file '{name}' does not exist", (*key, i),
                            hint="give a path to a .jsonl or .parquet file in verl's format")
        for row_no, (where, row) in enumerate(_read_rows(path)):
            example = _example_from_row(row, where, f"{path.name}:{row_no}")
            example.where = where
            examples.append(example)
    if not examples:
        raise SpecError("the data files hold no rows", key)
    return examples


def write_task_file(path: str | Path, task: str, n: int, seed: int = 0, split: str = "train",
                    chat: bool = False) -> Path:
    """Write `n` examples of a built-in task as a verl-format .jsonl or .parquet file."""
    path = Path(path)
    rows = []
    for i in range(n):
        ex = task_example(task, seed, split, i)
        prompt = [{"role": "user", "content": ex.prompt}] if chat else ex.prompt
        rows.append({"data_source": ex.data_source, "prompt": prompt,
                     "reward_model": {"style": "rule", "ground_truth": ex.ground_truth},
                     "extra_info": ex.extra_info})
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------- the source


class DataSource:
    """The prompts of one split, addressed by position: deterministic in (seed, position)."""

    def __init__(self, data: DataSpec, split: str = "train", base_dir: Path | None = None):
        self.data, self.split, self.seed = data, split, data.seed
        files = data.train_files if split == "train" else data.val_files
        self.examples: list[Example] | None = None
        if files:
            key = ("data", "train_files" if split == "train" else "val_files")
            self.examples = load_files(files, key, base_dir)
        elif data.task not in TASKS:
            raise SpecError(f"unknown task '{data.task}'", ("data", "task"),
                            hint=did_you_mean(data.task, TASKS) or f"tasks: {', '.join(TASKS)}")
        self._order: dict[int, list[int]] = {}

    def __len__(self) -> int:
        """Rows of the files; a built-in task is an endless stream (reported as 0)."""
        return len(self.examples) if self.examples is not None else 0

    def example(self, position: int) -> Example:
        """The example at a stream position; files are reshuffled each epoch, seeded."""
        if self.examples is None:
            return task_example(self.data.task, self.seed, self.split, position,
                                of(self.data.response_len))
        n = len(self.examples)
        epoch, offset = divmod(position, n)
        if epoch not in self._order:
            order = list(range(n))
            random.Random(f"{self.seed}:{self.split}:epoch:{epoch}").shuffle(order)
            self._order = {epoch: order}
        return self.examples[self._order[epoch][offset]]

    def batch(self, step: int) -> list[Example]:
        """The prompts of train step `step`."""
        size = self.data.prompts_per_step
        return [self.example(step * size + i) for i in range(size)]

    def validation(self, n: int | None = None) -> list[Example]:
        """The first `n` examples of the split in file order (all rows of val files)."""
        if self.examples is not None:
            return self.examples[: n or len(self.examples)]
        lengths = of(self.data.response_len)
        return [task_example(self.data.task, self.seed, self.split, i, lengths)
                for i in range(n or 64)]
