"""Generate the reference pages from the code, and the README's compiled example.

    python tools/gen_docs.py             # docs/reference/{graph-yaml,cli,plan-json}.md
    python tools/gen_docs.py --check     # exit 1 if one of them is stale (a test runs this)
    python tools/gen_docs.py --figures   # also the README's summary block and timeline PNG
                                         # and docs/reference/example-graphs.md (cost model)

The reference is read from the pydantic schema of graph.yaml (`rlgraph.config.schema`, each
node kind's spec), the CLI's argparse parser (`rlgraph.cli.main.build_parser`) and the
typed plan (`rlgraph.compiler.plan`). The figures come from the cost model, which changes
with its constants, so they are redrawn on demand and not checked.
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import re
import sys
import tokenize
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rlgraph.compiler import compile_plan
from rlgraph.config.load import load_spec
from rlgraph.config.schema import Spec
from rlgraph.nodes import KINDS
from rlgraph.nodes.base import NodeSpec
from rlgraph.presets.gpus import GPU_PRESETS
from rlgraph.presets.models import MODEL_PRESETS
from rlgraph.report.summary import cluster_line, print_summary
from rlgraph.report.timeline import fmt_seconds, render_png

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "graphs" / "dots-hybrid-logp-train.yaml"
PICTURE = ROOT / "docs" / "timeline-dots-hybrid.png"

# What a key means, where its pydantic field has no description (and what the seeds call it).
MEANINGS: dict[str, str] = {
    "cluster.local": "run on this machine's CPU cores (slots) instead of GPUs",
    "cluster.nodes": "machines (verl: trainer.nnodes)",
    "cluster.gpus_per_node": "GPUs per machine (verl: trainer.n_gpus_per_node)",
    "cluster.gpu": "GPU preset: " + ", ".join(k for k in GPU_PRESETS if k != "cpu"),
    "model.preset": "model preset: " + ", ".join(MODEL_PRESETS),
    "model.hf_config": "an inline Hugging Face config dict",
    "model.path": "a local Hugging Face model folder (relative: to the graph's folder)",
    "warm_start.lr": "learning rate of the supervised warm start",
    "warm_start.batch_size": "batch of the supervised warm start",
    "data.prompts_per_step": "prompts per train step (verl: data.train_batch_size)",
    "data.samples_per_prompt": "responses per prompt, the GRPO group (verl: rollout.n)",
    "data.prompt_len": "prompt tokens (verl: data.max_prompt_length)",
    "response_len.mean": "mean response tokens: throughput, and generate's time with "
                         "partial rollout",
    "response_len.max": "longest response (verl: data.max_response_length): a synchronous "
                        "batch decodes this long",
    "data.train_files": "verl-format .jsonl / .parquet training prompts",
    "data.val_files": "verl-format .jsonl / .parquet validation prompts",
    "data.seed": "seed of the data order and of sampling",
    "algorithm.name": "grpo (group-normalised advantages) or ppo",
    "algorithm.kl_coef": "KL-to-reference coefficient (verl: actor.kl_loss_coef)",
    "algorithm.kl_type": "KL estimator (verl: actor.kl_loss_type)",
    "algorithm.clip": "PPO clip ratio",
    "groups.<name>.share": "fraction of the cluster's GPUs (seeds: sperated_node_ratios)",
    "groups.<name>.tasks": "nodes that take turns on the group's GPUs "
                           "(seeds: sperated_node_tasks)",
    "nodes.<name>.kind": "one of " + ", ".join(KINDS),
    "engine": "native (torch / transformers) or sglang",
    "temperature": "sampling temperature",
    "top_p": "nucleus sampling",
    "backend": "torch, or megatron (megatron-core) on GPUs",
    "src": "the train node whose weights are sent",
    "dst": "the generate node that receives them",
    "bucket_mb.produce": "sender bucket, MiB = 2^20 bytes "
                         "(dots.rl: param_update_preduce_bucket_size_mb)",
    "bucket_mb.consume": "receiver bucket, MiB = 2^20 bytes "
                         "(dots.rl: param_update_consume_bucket_size_mb)",
    "transport": "auto, nccl (GPUs) or object_store (Ray)",
    "lr": "AdamW learning rate (verl: actor.optim.lr)",
    "grad_clip": "gradient-norm clip",
    "weight_decay": "AdamW weight decay",
    "schedule.max_lag": "policy versions a token may lag behind the policy that trains on it: "
                        "0 synchronous, 1 one-step-off (seeds: generate_ahead_steps)",
    "schedule.partial_rollout": "unfinished responses continue under the new weights "
                                "(generate costs the mean response, not the longest)",
    "schedule.steps": "train steps of a run",
}


def _meaning(key: str, description: str | None) -> str:
    if description:
        return description
    parts = key.split(".")
    for start in range(len(parts)):
        suffix = ".".join(parts[start:])
        if suffix in MEANINGS:
            return MEANINGS[suffix]
    return ""


def _groups(plan: dict) -> str:
    return "; ".join(f"{g['name']} {g['gpus']}: {', '.join(g['tasks'])}"
                     for g in plan["placement"]["groups"])


def graphs_table(graphs: list[Path], link: str = "../../graphs/") -> str:
    """One row per example graph: cluster, groups, lag, predicted period and speedup, and the
    best plan `rlgraph tune` finds for the same job."""
    from rlgraph.tune.search import tune

    rows = ["| graph | cluster · model | groups (GPUs: tasks) | max_lag | period | "
            "colocated sync | speedup | bottleneck | `rlgraph tune`: best plan |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for path in graphs:
        spec = load_spec(path)
        plan = compile_plan(spec)
        sched = plan["schedule"]
        best = tune(spec).plan
        tuned = (f"{_groups(best)}, max_lag {best['spec']['schedule']['max_lag']}: "
                 f"{fmt_seconds(best['schedule']['period_s'])}, "
                 f"{best['schedule']['speedup_vs_sync']:.2f}×")
        rows.append(
            f"| [{path.stem}]({link}{path.name}) | {cluster_line(plan)} | {_groups(plan)} | "
            f"{plan['spec']['schedule']['max_lag']} | {fmt_seconds(sched['period_s'])} | "
            f"{fmt_seconds(sched['sync_period_s'])} | **{sched['speedup_vs_sync']:.2f}×** | "
            f"{sched.get('bottleneck', '')} | {tuned} |")
    return "\n".join(rows)


def _type_name(annotation: Any) -> str:
    """A type for a markdown cell: `int, optional`, `one of grpo, ppo` (no bare `|`)."""
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(annotation))
    text = str(annotation).replace("typing.", "")
    text = re.sub(r"<class '([\w.]+)'>", lambda m: m.group(1).rsplit(".", 1)[-1], text)
    text = re.sub(r"\b(?:\w+\.)+(\w+)", r"\1", text)
    text = text.replace("NoneType", "None").replace(" | None", ", optional")
    return text.replace("|", "or")


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        value = field.default_factory()
        return "{}" if isinstance(value, dict | BaseModel) else repr(value)
    return "–" if field.default is None else f"`{field.default!r}`".replace("'", "")


def _model_rows(prefix: str, model: type[BaseModel], skip: set[str] = frozenset()) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        sub = typing.get_args(field.annotation) or (field.annotation,)
        nested = [t for t in sub if isinstance(t, type) and issubclass(t, BaseModel)]
        doc = field.description or (
            (nested[0].__doc__ or "").strip().splitlines()[0] if nested else None)
        rows.append(f"| `{prefix}{name}` | {_type_name(field.annotation)} | {_default(field)} | "
                    f"{_meaning(prefix + name, doc)} |")
        if nested and nested[0] is not model and name not in ("cost",):
            rows += _model_rows(f"{prefix}{name}.", nested[0])
    return rows


def keys_table() -> str:
    """Every graph.yaml key with its type, default and meaning, read from the pydantic models."""
    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    sections = {"name": None, "cluster": None, "model": None, "data": None, "algorithm": None,
                "groups": None, "nodes": None, "edges": None, "schedule": None, "pricing": None}
    for name in sections:
        field = Spec.model_fields[name]
        ann = field.annotation
        if name == "groups":
            rows.append("| `groups.<name>` | mapping | {} | tasks that share the group's GPUs "
                        "in time, and its share of the cluster |")
            rows += _model_rows("groups.<name>.", typing.get_args(ann)[1])
        elif name == "nodes":
            rows.append("| `nodes.<name>` | mapping | required | a node; `kind` defaults to the "
                        "node's name when that is a kind |")
            rows += _model_rows("nodes.<name>.", NodeSpec)
            for kind, record in KINDS.items():
                rows.append(f"| *kind: {kind}* | | | {record.doc} |")
                rows += _model_rows(f"nodes.<{kind}>.", record.spec,
                                    skip=set(NodeSpec.model_fields))
        elif isinstance(ann, type) and issubclass(ann, BaseModel):
            rows += _model_rows(f"{name}.", ann)
        else:
            doc = {"name": "names the plan, the output folder and the run",
                   "edges": 'replaces the default edges: ["generate -> reward", ...]'}[name]
            rows.append(f"| `{name}` | {_type_name(ann)} | {_default(field)} | {doc} |")
    return "\n".join(rows)


def example_summary(plan: dict) -> str:
    """The console output of `rlgraph compile` on the example graph, 100 columns wide."""
    buffer = io.StringIO()
    footer = (f"wrote out/{plan['name']}/: plan.json timeline.json timeline.html "
              f"(add --png for timeline.png)")
    os.environ["COLUMNS"] = "100"  # print_summary's width when not writing to a terminal
    print_summary(plan, file=buffer, footer=footer)
    lines = [line.rstrip() for line in buffer.getvalue().splitlines()]
    rel = EXAMPLE.relative_to(ROOT)
    return "```console\n$ rlgraph compile " + str(rel) + "\n" + "\n".join(lines) + "\n```"




# ---------------------------------------------------------------- the command line


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`" + (" ..." if action.nargs == "*" else "")
    names = ", ".join(f"`{o}`" for o in action.option_strings)
    if action.nargs == 0:
        return names
    return f"{names} `{action.metavar or action.dest.upper()}`"


def _usage(name: str, parser: argparse.ArgumentParser) -> str:
    words = [f"rlgraph {name}"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings:
            words.append(f"{action.metavar or action.dest}"
                         + (" ..." if action.nargs == "*" else ""))
        else:
            flag = action.option_strings[-1]
            meta = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
            words.append(f"[{flag}{meta}]")
    return " ".join(words)


def cli_reference() -> str:
    """Every subcommand of `rlgraph`: usage, description and arguments, from its parser."""
    from rlgraph.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    out = ["# The command line", "",
           "Generated from `rlgraph.cli.main.build_parser` by `python tools/gen_docs.py`; "
           "do not edit.", "", parser.description or "", "",
           "A graph.yaml's keys can be overridden after the file, as verl users type them "
           "(`key=value`, values are YAML). A mistake is one line naming the file, line, key "
           "and what to write instead, with exit status 2.", ""]
    for name, child in sub.choices.items():
        out += [f"## rlgraph {name}", "", helps.get(name) or "", ""]
        if child.description:
            out += [child.description, ""]
        out += ["```", _usage(name, child), "```", ""]
        rows = [a for a in child._actions if not isinstance(a, argparse._HelpAction)]
        if rows:
            out += ["| argument | meaning |", "| --- | --- |"]
            for action in rows:
                text = (action.help or "").replace("|", "\\|")
                if action.default not in (None, False, True, argparse.SUPPRESS, []) \
                        and "default" not in text:
                    text += f" (default {action.default})"
                out.append(f"| {_flags(action)} | {text} |")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


# ---------------------------------------------------------------- plan.json


def _field_comments(module_file: Path) -> dict[tuple[str, str], str]:
    """(class, field) -> the comment at the end of the field's line in the module's source."""
    source = module_file.read_text()
    comments: dict[int, str] = {}
    with open(module_file, "rb") as handle:
        for token in tokenize.tokenize(handle.readline):
            if token.type == tokenize.COMMENT:
                comments[token.start[0]] = token.string.lstrip("# ").strip()
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) \
                        and item.lineno in comments:
                    found[(node.name, item.target.id)] = comments[item.lineno]
    return found


# What a plan.json key means, where its field has no comment in rlgraph/compiler/plan.py.
PLAN_MEANINGS: dict[str, str] = {
    "version": "plan format version (changes to the keys below)",
    "name": "the graph's name",
    "placement.local": "a local CPU cluster instead of GPUs",
    "placement.slots": "CPU slots of a local cluster",
    "placement.gpu": "GPU preset of the cluster",
    "placement.shared_slots": "local slots shared by groups",
    "placement.groups[].name": "group name",
    "placement.groups[].tasks": "the nodes that take turns on the group",
    "placement.groups[].share": "fraction of the cluster, as written",
    "placement.groups[].gpus": "whole GPUs (or CPU slots) it got",
    "placement.groups[].replicas": "data-parallel processes",
    "costs.<name>.seconds": "seconds of one step of the node",
    "costs.<name>.detail": "the cost formula in words",
    "lag.per_edge": "the lag bound of each data edge into train",
    "lag.token_version_span": "versions one sample's tokens may span (partial rollout)",
    "lag.smallest_max_lag_for_best_period": "the least max_lag that reaches the best period",
    "lag.periods_by_max_lag": "predicted period at each max_lag up to yours",
    "lag.note": "why the cache can or cannot carry samples, in words",
    "schedule.period_s": "predicted seconds per step in the steady state",
    "schedule.bound_s": "lower bound on the period (cycle ratio and group load)",
    "schedule.sync_period_s": "the colocated synchronous baseline's period",
    "schedule.speedup_vs_sync": "sync_period_s / period_s",
    "schedule.utilization": "group -> busy fraction",
    "schedule.idle": "group -> idle fraction",
    "schedule.bottleneck": "what bounds the period, in words",
    "schedule.policy": "the scheduling policy the simulator and the runtime share",
    "schedule.steps_simulated": "steps of the discrete-event simulation",
    "schedule.cyclicity": "steps after which the steady state repeats",
    "schedule.events": "the predicted timeline: one event per task and step",
    "weight_sync.<name>.src": "the train node whose weights are sent",
    "weight_sync.<name>.dst": "the generate node that receives them",
    "weight_sync.<name>.bucket_mb.produce": "sender bucket, MiB",
    "weight_sync.<name>.bucket_mb.consume": "receiver bucket, MiB",
    "weight_sync.<name>.transport": "auto, nccl or object_store, as written",
    "pricing.runtime": "the system the baseline is priced as",
    "pricing.why": "why, in words",
    "trust.calibrated": "whether any cost comes from a measured run",
    "trust.calibrated_nodes": "nodes priced from a measured run",
    "trust.modelled_nodes": "nodes priced by the cost model",
    "trust.assumptions": "the assumptions that dominate the period, in words",
    "messages": "warnings and advice, as the summary prints them",
}


def _section_rows(prefix: str, model: type[BaseModel], comments: dict, seen: set) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        sub = typing.get_args(field.annotation) or (field.annotation,)
        nested = [t for t in sub if isinstance(t, type) and issubclass(t, BaseModel)]
        doc = comments.get((model.__name__, name)) or PLAN_MEANINGS.get(prefix + name) or (
            (nested[0].__doc__ or "").strip().splitlines()[0] if nested else "")
        doc = doc.replace("|", "or")
        rows.append(f"| `{prefix}{name}` | {_type_name(field.annotation)} | {doc} |")
        if nested and nested[0] not in seen:
            inner = f"{prefix}{name}." if typing.get_origin(field.annotation) is not dict \
                else f"{prefix}{name}.<name>."
            if typing.get_origin(field.annotation) in (tuple, list):
                inner = f"{prefix}{name}[]."
            rows += _section_rows(inner, nested[0], comments, seen | {nested[0]})
    return rows


def plan_reference() -> str:
    """plan.json's sections and keys, from the typed Plan and the comments beside its fields."""
    from rlgraph.compiler import plan as plan_module

    comments = _field_comments(Path(plan_module.__file__))
    out = ["# plan.json", "",
           "Generated from `rlgraph.compiler.plan` by `python tools/gen_docs.py`; do not edit.",
           "", (plan_module.__doc__ or "").strip(), "",
           "`rlgraph compile graph.yaml -o DIR` and `rlgraph run` write it; "
           "`Plan.read(path)` reads it back. Besides these keys it holds `spec`, the graph "
           "it was compiled from as graph.yaml data ([graph.yaml](graph-yaml.md)).", "",
           "| key | type | meaning |", "| --- | --- | --- |"]
    out += _section_rows("", plan_module.Plan, comments, {plan_module.Plan})
    return "\n".join(out).rstrip() + "\n"


def graph_yaml_reference() -> str:
    """Every graph.yaml key with its type, default and meaning."""
    return ("# graph.yaml\n\n"
            "Generated from the pydantic schema (`rlgraph.config.schema` and each node kind's "
            "spec in `rlgraph/nodes/`) by `python tools/gen_docs.py`; do not edit. "
            "`rlgraph schema` prints the same as JSON Schema, for editor completion.\n\n"
            "Default edges follow the kinds (generate -> reward, logp, ref_logp -> train -> "
            "param_update -> generate); an `edges:` list replaces them. A node's "
            "`cost: {seconds: S}` or `cost: {gpu_seconds: W}` replaces the cost model's "
            "figure. What the keys mean together: [the graph](../concepts/graph.md).\n\n"
            + keys_table() + "\n")


def example_graphs_page() -> str:
    """The example graphs' predicted figures and what `rlgraph tune` finds for each."""
    table = graphs_table(sorted((ROOT / "graphs").glob("*.yaml")))
    return ("# The example graphs, compiled\n\n"
            "Generated by `python tools/gen_docs.py --figures` from `graphs/*.yaml` and the "
            "cost model of the code it ran on. `graphs/` holds the configurations of the "
            "systems rlgraph compares with; each file starts with a comment naming its source "
            "and mapping its settings to keys. The figures are the compiler's analytic "
            "prediction (FLOPs, HBM and link bandwidth of the GPU preset; response lengths "
            "the sources leave open are assumptions stated in each file); the last column is "
            "the best plan `rlgraph tune` finds for the same GPUs and batch. How far to "
            "trust them: [pricing](../concepts/pricing.md) and "
            "[fidelity](../results/fidelity.md).\n\n" + table + "\n")


REFERENCE = ROOT / "docs" / "reference"
PAGES = {"graph-yaml.md": graph_yaml_reference, "cli.md": cli_reference,
         "plan-json.md": plan_reference}


def replace_block(text: str, name: str, block: str) -> str:
    """Put `block` between the markers `<!-- name:start -->` and `<!-- name:end -->`."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if start not in text or end not in text:
        raise SystemExit(f"README.md lacks the markers {start} ... {end}")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{block}\n{end}{tail}"


def stale_pages() -> list[str]:
    """Reference pages whose text differs from what the code generates now."""
    return [name for name, make in PAGES.items()
            if not (REFERENCE / name).exists() or (REFERENCE / name).read_text() != make()]


def main(argv: list[str] | None = None) -> int:
    """Write the reference pages (--check: only compare; --figures: the README's too)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is stale")
    parser.add_argument("--figures", action="store_true",
                        help="also redraw the README's compiled example and example-graphs.md")
    args = parser.parse_args(argv)
    os.environ["COLUMNS"] = "100"
    if args.check:
        stale = stale_pages()
        for name in stale:
            print(f"docs/reference/{name} is stale: run python tools/gen_docs.py",
                  file=sys.stderr)
        return 1 if stale else 0
    REFERENCE.mkdir(parents=True, exist_ok=True)
    for name, make in PAGES.items():
        (REFERENCE / name).write_text(make())
    if args.figures:
        example = compile_plan(load_spec(EXAMPLE))
        readme = ROOT / "README.md"
        readme.write_text(replace_block(readme.read_text(), "summary",
                                        example_summary(example)))
        render_png(PICTURE, example)
        (REFERENCE / "example-graphs.md").write_text(example_graphs_page())
    print(f"wrote {REFERENCE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
