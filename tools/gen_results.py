"""Generate the results pages and the benchmark index from bench/results/*.json.

    python tools/gen_results.py          # docs/results/*.md, docs/results/index.md, bench/README.md

One page per benchmark script (`docs/results/<script>.md`). A page's text above the marker
`<!-- generated:start -->` is written by hand (what the figures say, kept once written); the
part between the markers is rewritten from the result files every time: for each file the
machine, the date, the command that reproduces it and its headline figures. A result file
without a date of its own is dated by the commit that last changed it.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
PAGES = ROOT / "docs" / "results"
START, END = "<!-- generated:start -->", "<!-- generated:end -->"

# Each benchmark script and the result files it writes (globs under bench/results/).
BENCHMARKS: dict[str, list[str]] = {
    "async_vs_sync": ["async_vs_sync*.json"],
    "streaming": ["streaming*.json"],
    "vs_trl": ["vs_trl*.json"],
    "learning": ["learning.json"],
    "serial_learning": ["serial_learning.json"],
    "prediction": ["prediction.json"],
    "runtime_overhead": ["runtime_overhead*.json"],
    "weight_sync_bench": ["weight_sync.json"],
    "checkpoint_cost": ["checkpoint_cost.json"],
    "compile_bench": ["compile.json"],
    "tune_bench": ["tune.json"],
    "hostile_inputs": ["hostile_inputs.json"],
    "fidelity": ["fidelity.json"],
    "own_runs": ["own_runs.json"],
    "gpu_bench": ["gpu-decode.json", "gpu-nccl-sync.json"],
    "gpu_e2e": ["gpu-e2e*.json", "gpu-longtail.json", "gpu-partial-rollout.json"],
    "gpu4": ["gpu4-*.json"],
    "gpu_longtail": ["gpu-longtail-1gpu.json", "gpu-stream-*.json"],
    "longtail_engine": [],
    "node_profile": ["gpu-node-profile-*.json"],
    "megatron_check": ["megatron-check.json"],
    "gpu_inflight": ["gpu-inflight*.json"],
    "sdpa_bias": ["gpu-sdpa-bias.json"],
    "train_split": ["gpu-train-split.json"],
    "pass_profile": ["gpu-pass-profile.json"],
    "decode_grid": ["gpu-decode-grid.json"],
}
# Modules of bench/ that are not benchmarks: what they hold.
SUPPORT = {"common": "what the benchmarks share: result paths, the machine record, mean and "
                     "spread, a metrics mirror",
           "trl_workload": "the TRL comparison's workload (model, data, reward), built locally"}
SKIP_KEYS = {"machine", "device", "date", "dates", "command", "commands", "benchmark", "bench"}
MAX_FIGURES = 24


def docstring(script: str) -> tuple[str, str]:
    """(first line, first paragraph) of a bench script's module docstring."""
    text = ast.get_docstring(ast.parse((BENCH / f"{script}.py").read_text())) or script
    first = " ".join(text.split("\n\n")[0].split())
    sentence = re.split(r"(?<=[.?:])\s", first, maxsplit=1)[0]
    return sentence.rstrip(".:"), first


def scripts() -> list[str]:
    """Every benchmark script: those of BENCHMARKS in its order, then any other of bench/."""
    found = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in SUPPORT)
    return [s for s in BENCHMARKS if s in found] + [s for s in found if s not in BENCHMARKS]


def result_files(script: str) -> list[Path]:
    """The result files of `script`, by its globs (a script BENCHMARKS does not name: files
    named after it)."""
    patterns = BENCHMARKS.get(script, [f"{script}*.json", f"{script.replace('_', '-')}*.json"])
    names = sorted(p.name for p in RESULTS.glob("*.json"))
    return [RESULTS / n for n in names if any(fnmatch.fnmatch(n, pat) for pat in patterns)]


def committed(path: Path) -> str:
    """The date of the last commit that changed `path` (empty outside git)."""
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%cs", "--", str(path)], cwd=ROOT,
                             capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return ""
    return out


def when(data: dict, path: Path) -> str:
    """The date a result was measured, or when its file was committed."""
    if isinstance(data.get("date"), str):
        return data["date"]
    dates = data.get("dates")
    if isinstance(dates, list) and dates:
        return f"{dates[0]} to {dates[-1]}" if len(dates) > 1 else str(dates[0])
    day = committed(path)
    return f"{day} (committed)" if day else "not recorded"


def machine(data: dict) -> str:
    """The machine in words: GPU model and count, or the CPU host."""
    device, host = data.get("device"), data.get("machine")
    if isinstance(device, dict) and device.get("name"):
        return f"{device.get('gpus', 1)}x {device['name']} (torch {device.get('torch', '?')})"
    if isinstance(host, dict) and host.get("device"):
        return f"{host.get('gpus', 1)}x {host['device']} (torch {host.get('torch', '?')})"
    if isinstance(host, dict):
        cores = host.get("cpu_count")
        return (f"{cores} CPU cores, {host.get('processor', '')}, Python "
                f"{host.get('python', '?')}").replace(" , ", " ")
    return "not recorded"


def command(data: dict, script: str) -> str:
    """The command that wrote the file, as recorded, else the script's default."""
    for key in ("command", "commands"):
        value = data.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, list) and value:
            return "; ".join(str(v) for v in value)
        if isinstance(value, dict) and value:
            return "; ".join(f"{k}: {v}" for k, v in value.items())
    return f"python bench/{script}.py"


def fmt(value: Any) -> str:
    """A figure for a table cell."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(fmt(v) for v in value[:6]) + (" ..." if len(value) > 6 else "")
    return str(value).replace("|", "\\|").replace("\n", " ")


def _scalar(value: Any) -> bool:
    if isinstance(value, int | float | bool):
        return True
    if isinstance(value, str):
        return len(value) <= 100
    return isinstance(value, list) and len(value) <= 6 and all(
        isinstance(v, int | float) for v in value)


def figures(data: dict) -> list[tuple[str, Any]]:
    """The headline figures: top-level scalars, then the scalars of `summary`/`median`."""
    found = [(k, v) for k, v in data.items() if k not in SKIP_KEYS and _scalar(v)]
    for section in ("summary", "median", "ratios", "targets"):
        inner = data.get(section)
        if isinstance(inner, dict):
            found += [(f"{section}.{k}", v) for k, v in inner.items() if _scalar(v)]
    return found[:MAX_FIGURES]


def _cell(value: Any) -> Any:
    """A nested {median, min, max} as one cell; other scalars as they are."""
    if isinstance(value, dict) and "median" in value:
        low, high = value.get("min"), value.get("max")
        return (f"{fmt(value['median'])} ({fmt(low)}-{fmt(high)})" if low is not None
                else fmt(value["median"]))
    return value


def table(rows: list[dict], label: str | None = None) -> list[str]:
    """Flat dicts as a markdown table (scalar columns only, the first ten)."""
    rows = [{k: _cell(v) for k, v in row.items()} for row in rows]
    columns: list[str] = []
    for row in rows:
        columns += [k for k, v in row.items() if k not in columns and _scalar(v)]
    columns = columns[:10]
    out = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for row in rows[:40]:
        out.append("| " + " | ".join(fmt(row.get(c, "")) for c in columns) + " |")
    return out


def tables(data: dict) -> list[str]:
    """The file's tables: lists of records, records by name, or a printed table."""
    out: list[str] = []
    for key in ("table", "plans", "summary", "cases", "variants", "runs", "modes"):
        value = data.get(key)
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            out += [f"`{key}`:", "", "```", *value, "```", ""]
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            out += [f"`{key}`:", "", *table(value), ""]
        elif isinstance(value, dict) and value and all(isinstance(v, dict)
                                                       for v in value.values()):
            rows = [{"name": name, **row} for name, row in value.items()]
            if sum(_scalar(_cell(v)) for row in rows for v in row.values()) > len(rows):
                out += [f"`{key}`:", "", *table(rows), ""]
    return out


def file_section(path: Path, script: str) -> list[str]:
    """One result file: machine, date, command, figures."""
    data = json.loads(path.read_text())
    out = [f"### [{path.name}](../../bench/results/{path.name})", ""]
    if not isinstance(data, dict):
        return [*out, f"{len(data)} records.", ""]
    out += [f"- machine: {machine(data)}", f"- date: {when(data, path)}",
            f"- command: `{command(data, script)}`", ""]
    found = figures(data)
    if found:
        out += ["| figure | value |", "| --- | --- |"]
        out += [f"| `{k}` | {fmt(v)} |" for k, v in found]
        out.append("")
    return out + tables(data)


def generated(script: str) -> str:
    """The generated part of a benchmark's page."""
    _, what = docstring(script)
    files = result_files(script)
    out = ["## Result files", "", f"Script: [bench/{script}.py](../../bench/{script}.py). {what}",
           ""]
    if not files:
        out += ["It writes no result file of its own.", ""]
    for path in files:
        out += file_section(path, script)
    return "\n".join(out).rstrip()


def write_page(script: str) -> Path:
    """Rewrite the generated part of docs/results/<script>.md, keeping the text above it."""
    page = PAGES / f"{script}.md"
    title, _ = docstring(script)
    text = page.read_text() if page.exists() else f"# {title}\n\n{START}\n{END}\n"
    if START not in text or END not in text:
        raise SystemExit(f"{page} lacks the markers {START} ... {END}")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    head = f"# {title}\n" + (head.split("\n", 1)[1] if head.startswith("# ") else head)
    page.write_text(f"{head}{START}\n{generated(script)}\n{END}{tail}")
    return page


def _rows(link: str, page: str) -> list[str]:
    """One row per benchmark: `link` and `page` format the script's links."""
    rows = []
    for script in scripts():
        title, _ = docstring(script)
        files = ", ".join(p.name for p in result_files(script)) or "–"
        rows.append(f"| {link.format(s=script)} | {fmt(title)} | {files} |"
                    + (f" {page.format(s=script)} |" if page else ""))
    return rows


def index() -> str:
    """docs/results/index.md: every benchmark, what it measures, its files."""
    return "\n".join([
        "# Results", "",
        "Generated by `python tools/gen_results.py` from `bench/results/*.json`; one page per "
        "benchmark, each figure with its machine, date and command. Ratios are measured side "
        "by side in one run. Older hand-kept measurements that the cost model's constants "
        "cite: [measurements](../measurements.md).", "",
        "| benchmark | what it measures | result files |", "| --- | --- | --- |",
        *_rows("[{s}]({s}.md)", "")]) + "\n"


def bench_readme() -> str:
    """bench/README.md: each script, what it measures, its result files."""
    return "\n".join([
        "# Benchmarks", "",
        "Generated by `python tools/gen_results.py`. Each script measures one thing, states the "
        "machine it ran on and writes `bench/results/*.json`; the figures are on the results "
        "pages ([docs/results](../docs/results/index.md)). GPU scripts run on a device machine "
        "(one script per call); the rest on 2 CPU cores.", "",
        "| script | what it measures | result files | page |", "| --- | --- | --- | --- |",
        *_rows("[{s}.py]({s}.py)", "[{s}](../docs/results/{s}.md)"), "", "Shared code:", "",
        *[f"- [{name}.py]({name}.py): {what}" for name, what in SUPPORT.items()]]) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write every results page, the index and bench/README.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    PAGES.mkdir(parents=True, exist_ok=True)
    for script in scripts():
        write_page(script)
    (PAGES / "index.md").write_text(index())
    (BENCH / "README.md").write_text(bench_readme())
    print(f"wrote {PAGES} and {BENCH / 'README.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
