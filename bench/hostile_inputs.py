"""Hostile or mistaken inputs, each through `rlgraph compile` in its own process.

Every attack runs with a 10 s wall clock and a 3 GiB address-space limit; the table records
the exit status, whether stderr held a traceback, how many lines it printed, the seconds the
process took (interpreter start-up and imports included), the seconds `main()` itself took
(`main_s`, where it returned) and the message's first 160 characters. Writes
bench/results/hostile_inputs.json under `--label`; `--code DIR` runs another checkout's
rlgraph (e.g. `git archive 3457924 | tar -x -C /tmp/before` for the "before" column):

    python bench/hostile_inputs.py [--label after] [--code DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, machine

QUICKSTART = (ROOT / "graphs" / "quickstart.yaml").read_text()
LIMIT_S = 10
TIMED_MAIN = ("import sys, time\nfrom rlgraph.cli.main import main\nt = time.perf_counter()\n"
              "rc = main(sys.argv[1:])\nprint(f'MAIN_S {time.perf_counter() - t:.4f}', "
              "file=sys.stderr)\nsys.exit(rc)")
MEMORY_BYTES = 3 << 30


def _nested(depth: int) -> str:
    return "name: deep\nextra: " + "[" * depth + "]" * depth + "\n"


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n"
    for p, c in zip("abcdefgh", "bcdefghi"))


def attacks(tmp: Path) -> dict[str, tuple[Path, list[str]]]:
    """name -> (graph file, overrides): one per item of the list ("-o" among the
    overrides replaces the default output folder)."""
    def write(name: str, data: str | bytes) -> Path:
        path = tmp / name
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        return path

    qs = write("quickstart.yaml", QUICKSTART)
    fifo = tmp / "fifo.yaml"
    os.mkfifo(fifo)
    out: dict[str, tuple[Path, list[str]]] = {
        "integer 10^400": (write("int.yaml", QUICKSTART.replace("seed: 0", f"seed: {10**400}")),
                           []),
        "binary file": (write("binary.yaml", bytes(range(256)) * 4), []),
        "Latin-1 file": (write("latin1.yaml", ("# caf\xe9\n" + QUICKSTART).encode("latin-1")), []),
        "UTF-16 file": (write("utf16.yaml", QUICKSTART.encode("utf-16")), []),
        "NUL byte": (write("nul.yaml", QUICKSTART.replace("name: quickstart", "name: a\0b")), []),
        "recursive alias": (write("recursive.yaml", QUICKSTART + "extra: &r [*r]\n"), []),
        "5000-deep nesting": (write("deep.yaml", _nested(5000)), []),
        "merge key <<:": (write("merge.yaml", QUICKSTART.replace(
            "algorithm: {name: grpo", "base: &b {name: grpo}\nalgorithm: {<<: *b")), []),
        "complex key ? [a, b]": (write("complex.yaml", QUICKSTART + "? [a, b]\n: 1\n"), []),
        "!!python/name: tag": (write("tag.yaml", QUICKSTART.replace(
            "name: quickstart", "name: !!python/name:os.system")), []),
        "300-char file name": (tmp / ("x" * 300 + ".yaml"), []),
        "/dev/zero": (Path("/dev/zero"), []),
        "FIFO": (fifo, []),
        "directory": (tmp, []),
        "alias bomb (300 B)": (write("bomb.yaml", QUICKSTART + BOMB), []),
        "samples_per_prompt=2**64+1": (qs, [f"data.samples_per_prompt={2**64 + 1}"]),
        "max_lag=1000": (qs, ["schedule.max_lag=1000"]),
        "max_lag=100000": (qs, ["schedule.max_lag=100000"]),
        "cluster.cpus=1e11": (qs, ["cluster.cpus=100000000000"]),
        "lr=.inf": (qs, ["nodes.train.lr=.inf"]),
        "kl_coef=.inf": (qs, ["algorithm.kl_coef=.inf"]),
        "sigma=.inf": (qs, ["data.response_len.sigma=.inf"]),
        "seed=10**30": (qs, [f"data.seed={10**30}"]),
        "share=1e-300": (qs, ["groups.rollout.share=1e-300"]),
        "bucket_mb 1e-300": (qs, ["nodes.param_update.bucket_mb.produce=1e-300"]),
        "reward.workers=4": (qs, ["nodes.reward.workers=4"]),
        "data.task: bogus": (qs, ["data.task=bogus"]),
        "fn: nosuch:fn": (qs, ["nodes.reward.fn=nosuch:fn"]),
        "fn: missing.py:f": (qs, ["nodes.reward.fn=missing.py:f"]),
        "data file missing": (qs, ["data.train_files=[nope.jsonl]"]),
        "override 10^400": (qs, ["data.seed=1" + "0" * 400]),
        "override alias bomb": (qs, ["name=" + BOMB]),
        "--out in /sys (EPERM)": (qs, ["-o", "/sys/rlgraph-out"]),
        "--out under a file": (qs, ["-o", "/dev/null/out"]),
        "--out 300-char name": (qs, ["-o", str(tmp / ("o" * 300))]),
    }
    return out


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def run_attack(graph: Path, overrides: list[str], out: Path, env: dict[str, str]) -> dict:
    """One `rlgraph compile` in a fresh process: status, lines, traceback, seconds."""
    if "-o" not in overrides:
        overrides = [*overrides, "-o", str(out)]
    began = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", TIMED_MAIN, "compile", str(graph),
                               *overrides], capture_output=True, text=True, env=env,
                              errors="replace", timeout=LIMIT_S, preexec_fn=_limit,
                              cwd=out.parent)  # not ROOT: its rlgraph would shadow --code
    except subprocess.TimeoutExpired:
        return {"rc": None, "outcome": f"hang (> {LIMIT_S} s)", "seconds": LIMIT_S}
    seconds = time.perf_counter() - began
    lines = proc.stderr.strip().splitlines()
    main_s = next((float(x.split()[1]) for x in lines if x.startswith("MAIN_S ")), None)
    err = "\n".join(x for x in lines if not x.startswith("MAIN_S "))
    traceback = "Traceback" in err
    if proc.returncode == 0:
        outcome = "accepted"
    elif traceback:
        outcome = "traceback"
    elif proc.returncode == 2 and len(err.splitlines()) == 1:
        outcome = "one-line error"
    else:
        outcome = f"rc {proc.returncode}, {len(err.splitlines())} lines"
    last = err.splitlines()[-1] if err else ""
    return {"rc": proc.returncode, "outcome": outcome, "seconds": round(seconds, 2),
            "main_s": main_s, "message": last[:160]}


def main() -> None:
    """Run every attack; print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--label", default="after", help="key of this run in the JSON")
    parser.add_argument("--code", help="a checkout whose rlgraph to run (default: this one)")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.code:
        env["PYTHONPATH"] = str(Path(args.code).resolve())
    results_file = RESULTS / "hostile_inputs.json"
    saved = json.loads(results_file.read_text()) if results_file.exists() else {}
    tmp = Path(tempfile.mkdtemp(prefix="rlgraph-hostile-"))
    rows = {}
    try:
        for name, (graph, overrides) in attacks(tmp).items():
            row = run_attack(graph, overrides, tmp / "out", env)
            shutil.rmtree(tmp / "out", ignore_errors=True)
            rows[name] = row
            main_s = f"{row['main_s']:.3f}" if row.get("main_s") is not None else "-"
            print(f"{name:28s} {row['outcome']:18s} {row['seconds']:6.2f}s {main_s:>6s}s  "
                  f"{row.get('message', '')[:90]}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    saved[args.label] = {"machine": machine(), "code": args.code or str(ROOT),
                         "attacks": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    results_file.write_text(json.dumps(saved, indent=2) + "\n")
    print(f"wrote {results_file}")


if __name__ == "__main__":
    main()
