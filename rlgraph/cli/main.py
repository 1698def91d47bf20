"""`rlgraph` command line: compile, schema, timeline, run, tune, export.

Every RLGraphError (a graph.yaml or an argument the user can fix) prints `err.render()` on
stderr and exits 2 without a traceback; any other exception is a bug and keeps its
traceback. The compile path imports neither torch nor ray; rich and matplotlib are imported
only when a summary is printed or a PNG drawn, so `rlgraph compile --json` stays fast.
"""

from __future__ import annotations

import argparse
import errno
import gc
import importlib
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlgraph import __version__
from rlgraph.errors import MissingDependencyError, RLGraphError, SpecError
from rlgraph.pricing.system import SYSTEMS, unknown_system_hint

if TYPE_CHECKING:
    from rlgraph.compiler.plan import Plan

PLAN_FILES = ("plan.json", "timeline.json", "timeline.html")  # + timeline.png with --png


class CLIError(RLGraphError):
    """A command-line problem: a missing file, an unreadable run dir, an absent subsystem."""


# ---------------------------------------------------------------- helpers


def one_line(message: str) -> str:
    """An error as one line: line breaks a user's text brought in (a key, a value, a file
    name) printed escaped."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def _lazy(module: str, attr: str, command: str) -> Callable[..., Any]:
    """Import `module.attr` on first use; a subsystem not built yet is a clear error."""
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == module or module.startswith(missing + "."):
            raise CLIError(f"`rlgraph {command}` is not available in this install: "
                           f"{module} does not exist yet") from None
        if missing.split(".")[0] == "rlgraph":
            raise
        raise MissingDependencyError(f"`rlgraph {command}` needs the Python package "
                                     f"'{missing}' (pip install {missing})") from None
    if not hasattr(loaded, attr):
        raise CLIError(f"`rlgraph {command}`: {module} has no {attr}() yet")
    return getattr(loaded, attr)


def read_json(path: Path, what: str) -> Any:
    """A JSON file, or a CLIError naming the file (and line) that is missing or broken (a
    FIFO or a device in its place is refused at once: rlgraph.readback)."""
    from rlgraph.readback import read_json as read_back

    return read_back(path, what, CLIError)


def compile_spec(spec: Any, calibration: Path | None = None, baseline: str | None = None
                 ) -> Plan:
    """Run the compiler on a loaded spec; its SpecErrors point into the spec's file.

    `calibration`: a run dir or its trace.json: the run's measured / modelled node times
    scale this plan's (`rlgraph.compiler.calibrate.carried_calibration`), and a multi-turn
    run's env step prices its env where the graph gives no latency. `baseline`: the
    system whose colocated synchronous step the speedup compares with.
    """
    compile_plan = _lazy("rlgraph.compiler", "compile_plan", "compile")
    carried = _lazy("rlgraph.compiler.calibrate", "carried_calibration", "compile")
    env_latency = _lazy("rlgraph.compiler.calibrate", "with_env_latency", "compile")
    try:
        spec = env_latency(spec, calibration)  # a multi-turn run's measured env step
        measured = carried(calibration, spec) if calibration is not None else None
        return compile_plan(spec, calibration=measured, baseline=baseline)
    except SpecError as err:
        err.source = err.source or spec.source
        raise


def out_dir_for(name: str) -> Path:
    """Default output folder of `rlgraph compile`: out/<graph name>/."""
    return Path("out") / (re.sub(r"[^\w.-]+", "-", name).strip("-.") or "graph")


def write_plan(out: Path, plan: Plan, measured: list[dict] | None = None,
               png: bool = True) -> list[Path]:
    """plan.json and the timeline files into `out` (timeline.png only with `png`: drawing it
    takes matplotlib a second or more); a folder that cannot be written (read-only, no
    permission, a name too long, a full disk) is a one-line CLIError."""
    from rlgraph.config.safe_yaml import shown
    from rlgraph.report.timeline import write_timeline

    try:
        out.mkdir(parents=True, exist_ok=True)
        plan_file = out / "plan.json"
        plan_file.write_text(plan.to_json())
        return [plan_file, *write_timeline(out, plan, measured, png=png)]
    except OSError as exc:
        what = exc.strerror or type(exc).__name__
        if exc.errno == errno.ENAMETOOLONG:
            what += f" ({max(len(part) for part in out.parts)} characters in one name)"
        raise CLIError(f"{shown(out)}: cannot write the plan there: {what} (give -o a "
                       f"writable folder)") from None


# ---------------------------------------------------------------- commands


def cmd_compile(args: argparse.Namespace) -> int:
    """graph.yaml -> plan: summary table (or --json), plan.json and the timeline files."""
    from rlgraph.config.load import load_spec

    if args.baseline is not None and args.baseline not in SYSTEMS:
        raise CLIError(f"--baseline: unknown system '{args.baseline}' "
                       f"({unknown_system_hint(args.baseline)})")
    if args.first_steps is not None and args.first_steps < 2:
        raise CLIError(f"--first-steps {args.first_steps}: give 2 or more (step 0 is the "
                       f"warm-up)")
    spec = load_spec(args.graph, args.overrides)
    plan = compile_spec(spec, Path(args.calibrate) if args.calibrate else None, args.baseline)
    if args.json:
        if args.out:
            write_plan(Path(args.out), plan, png=args.png)
        sys.stdout.write(plan.to_json())
        return 0
    out = Path(args.out) if args.out else out_dir_for(spec.name)
    paths = write_plan(out, plan, png=args.png)
    from rlgraph.report.summary import print_summary

    picture = "" if args.png else " (add --png for timeline.png)"
    print_summary(plan, footer=f"wrote {out}/: {' '.join(p.name for p in paths)}{picture}")
    if args.first_steps is not None:
        print(first_steps_line(spec, plan, args.first_steps,
                               Path(args.calibrate) if args.calibrate else None))
    return 0


def first_steps_line(spec: Any, plan: Plan, steps: int, calibration: Path | None) -> str:
    """What a run of `steps` steps measures after its warm-up step 0 (steps 1..steps - 1:
    `compiler.first_steps_period`, its first rollout rounds from an empty cache), beside
    the plan's steady period."""
    period = _lazy("rlgraph.compiler", "first_steps_period", "compile")
    carried = _lazy("rlgraph.compiler.calibrate", "carried_calibration", "compile")
    window = (1, steps)
    measured = carried(calibration, spec, window=window) if calibration is not None else None
    try:
        mean = period(spec, window, measured)
    except SpecError as err:
        err.source = err.source or spec.source
        raise
    steady = plan.schedule.period_s
    return (f"first {steps} steps: {mean:.4g} s a step over steps 1-{steps - 1} (the rollout "
            f"rounds a run decodes first, from an empty cache), {mean / steady:.2f}x the "
            f"steady period {steady:.4g} s")


def cmd_schema(args: argparse.Namespace) -> int:
    """Print the JSON Schema of graph.yaml."""
    from rlgraph.config.schema import json_schema

    sys.stdout.write(json.dumps(json_schema(), indent=2) + "\n")
    return 0


def cmd_timeline(args: argparse.Namespace) -> int:
    """Redraw a run dir's timeline.html/png from its plan.json and trace.json."""
    from rlgraph.report.chrome_trace import events_from_trace
    from rlgraph.report.timeline import write_timeline

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise CLIError(f"{run_dir}: not a directory (give a run dir, e.g. runs/quickstart-...)")
    from rlgraph.compiler.plan import Plan

    plan_file = run_dir / "plan.json"
    data = read_json(plan_file, "rlgraph run and rlgraph compile -o DIR write it")
    plan = Plan.from_dict(data, str(plan_file))
    trace_file = run_dir / "trace.json"
    measured = (events_from_trace(read_json(trace_file, ""), str(trace_file))
                if trace_file.exists() or trace_file.is_symlink() else None)
    paths = write_timeline(run_dir, plan, measured)
    what = "predicted and measured" if measured else "predicted only: no trace.json"
    print(f"wrote {', '.join(str(p) for p in paths[1:])} ({what})")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Compile and run the graph on Ray (rlgraph.cli.run.run_main)."""
    return int(_lazy("rlgraph.cli.run", "run_main", "run")(args) or 0)


def cmd_export(args: argparse.Namespace) -> int:
    """A run's checkpoint as a Hugging Face model folder (rlgraph.runtime.run_dir)."""
    export_model = _lazy("rlgraph.runtime.run_dir", "export_model", "export")
    source, out = Path(args.run_dir), Path(args.out)
    names = export_model(source, out)
    print(f"wrote {out}/: {' '.join(names)} (load it with "
          f"AutoModelForCausalLM.from_pretrained('{out}'))")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    """Search groups, shares and lag (rlgraph.cli.tune.run_tune)."""
    return int(_lazy("rlgraph.cli.tune", "run_tune", "tune")(args) or 0)


# ---------------------------------------------------------------- parser


def _graph_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("graph", help="graph.yaml")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="overrides, e.g. schedule.max_lag=2 groups.rollout.share=0.5")


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="rlgraph",
        description="Compile and run asynchronous RL dataflow graphs (graph.yaml).")
    parser.add_argument("--version", action="version", version=f"rlgraph {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("compile", help="placement, lag bound, schedule and timeline of a graph",
                       description="Compile graph.yaml: prints a summary and writes plan.json, "
                       "timeline.json (Perfetto) and timeline.html (timeline.png with --png).")
    _graph_args(p)
    p.add_argument("-o", "--out", metavar="DIR", help="output folder (default: out/<name>/)")
    p.add_argument("--json", action="store_true",
                   help="print the plan as JSON on stdout and nothing else (files only with -o)")
    p.add_argument("--calibrate", metavar="TRACE_OR_RUN_DIR",
                   help="scale node costs to a measured run: a run dir (its plan.json and "
                   "trace.json: measured / modelled per node carries to this plan, whatever "
                   "its groups) or a trace.json (measured times replace the model's)")
    p.add_argument("--baseline", metavar="SYSTEM",
                   help="price the synchronous baseline as SYSTEM, one of: "
                   + ", ".join(SYSTEMS) + " (default: the graph's pricing.system)")
    p.add_argument("--png", action="store_true",
                   help="also draw timeline.png (matplotlib; about a second more)")
    p.add_argument("--first-steps", metavar="N", type=int,
                   help="also print the mean step a run of N steps measures after its "
                   "warm-up step (its first rollout rounds, before they settle)")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("schema", help="print the JSON Schema of graph.yaml")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("timeline", help="redraw a run dir's predicted and measured timelines")
    p.add_argument("run_dir", metavar="RUN_DIR", help="folder with plan.json (and trace.json)")
    p.set_defaults(func=cmd_timeline)

    p = sub.add_parser("run", help="compile and run the graph on Ray (local CPU by default)")
    _graph_args(p)
    p.add_argument("--steps", type=int, help="train steps (default: schedule.steps)")
    p.add_argument("-o", "--out", metavar="DIR", help="run folder (default: runs/<name>-<time>/)")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its checkpoint")
    p.add_argument("--address", help="join this Ray cluster (default: RAY_ADDRESS or local)")
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                   help="checkpoint every N steps (default: every minute; 0: only at the "
                   "end, on Ctrl-C / SIGTERM and on a failure)")
    p.add_argument("--trust-code", action="store_true",
                   help="let the graph's reward functions run Python code from files "
                   "(file.py:function); without it such a graph is refused")
    p.add_argument("--verify-weights", action="store_true",
                   help="check a SHA-256 of the weights at every object-store sync")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar (logs and CI)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("export", help="write a run's checkpoint as a Hugging Face model folder")
    p.add_argument("run_dir", metavar="RUN_DIR",
                   help="a run dir (its latest checkpoint) or a checkpoint folder")
    p.add_argument("out", metavar="OUT", help="new folder for the model")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("tune", help="search groups, shares and lag for the shortest period")
    _graph_args(p)
    p.add_argument("-o", "--out", metavar="TUNED_YAML", help="write the best plan as graph.yaml")
    p.add_argument("--json", action="store_true", help="print the best plan as JSON only")
    p.add_argument("--top", type=int, default=5, metavar="K", help="plans to list (default 5)")
    p.add_argument("--calibrate", metavar="RUN_DIR", help="use the node times measured in a run")
    p.add_argument("--seed", type=int, default=0, help="seed of the local search (default 0)")
    p.add_argument("--tp", metavar="CHOICES", help="generate tp values to try, e.g. 1,2,4")
    p.set_defaults(func=cmd_tune)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse; `key=value` words after options count as overrides too."""
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    for word in words:
        if word.startswith("--") and ("=" in word or "." in word.split("=")[0]):
            key = word[2:]
            if "." in key.split("=")[0]:  # --schedule.max_lag=2: an override with dashes
                right = key if "=" in key else f"{key}=VALUE"
                parser.exit(2, f"rlgraph: '{one_line(word)}' is an override: write it without "
                               f"dashes, after the graph: {one_line(right)}\n")
    args, extra = parser.parse_known_args(words)
    overrides = [word for word in extra if "=" in word and not word.startswith("-")]
    if len(overrides) != len(extra) or (overrides and not hasattr(args, "overrides")):
        unknown = [w for w in extra if w not in overrides or not hasattr(args, "overrides")]
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if overrides:
        args.overrides = [*args.overrides, *overrides]
    return args


SHORT_COMMANDS = ("compile", "schema", "timeline")  # a process that answers in under a second


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `rlgraph` console script; returns the exit status.

    Called as a program (`argv` None) for a short command, the cyclic garbage collector is
    off while the command imports its libraries and runs, and what it built is frozen
    before exit, so the interpreter neither collects during ~0.5 s of imports nor walks
    every object at shutdown (about 0.15 s of a 0.75 s compile on 2 cores:
    bench/compile_bench.py). Reference counting still frees everything as usual.
    """
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    short = argv is None and args.command in SHORT_COMMANDS and gc.isenabled()
    if short:
        gc.disable()
    try:
        return args.func(args)
    except RLGraphError as err:
        print(one_line(err.render()), file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `rlgraph compile --json | head`
        return 0
    finally:
        if short:
            gc.freeze()  # the process exits next: nothing left for the collector to walk
            gc.enable()


if __name__ == "__main__":
    sys.exit(main())
