"""Generate the README's figures from the code: the example summary and timeline picture,
the example graphs' predicted figures and the graph.yaml key reference.

    python tools/readme_tables.py            # print the blocks
    python tools/readme_tables.py --write    # rewrite them in README.md, redraw the PNG

Each block sits between `<!-- NAME:start -->` and `<!-- NAME:end -->` markers in README.md
(NAME is `summary`, `graphs` or `keys`), so every figure in the README comes from this
command.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
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


def graphs_table(graphs: list[Path]) -> str:
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
            f"| [{path.stem}](graphs/{path.name}) | {cluster_line(plan)} | {_groups(plan)} | "
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
                "groups": None, "nodes": None, "edges": None, "schedule": None}
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
    footer = f"wrote out/{plan['name']}/: plan.json timeline.json timeline.html timeline.png"
    os.environ["COLUMNS"] = "100"  # print_summary's width when not writing to a terminal
    print_summary(plan, file=buffer, footer=footer)
    lines = [line.rstrip() for line in buffer.getvalue().splitlines()]
    rel = EXAMPLE.relative_to(ROOT)
    return "```console\n$ rlgraph compile " + str(rel) + "\n" + "\n".join(lines) + "\n```"


def replace_block(text: str, name: str, table: str) -> str:
    """Put `table` between the README's markers for `name`."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if start not in text or end not in text:
        raise SystemExit(f"README.md lacks the markers {start} ... {end}")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{table}\n{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    """Print the tables, or rewrite them in README.md with --write."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update README.md in place")
    args = parser.parse_args(argv)
    example = compile_plan(load_spec(EXAMPLE))
    tables = {"summary": example_summary(example),
              "graphs": graphs_table(sorted((ROOT / "graphs").glob("*.yaml"))),
              "keys": keys_table()}
    if not args.write:
        for name, table in tables.items():
            print(f"<!-- {name} -->\n{table}\n")
        return 0
    readme = ROOT / "README.md"
    text = readme.read_text()
    for name, table in tables.items():
        text = replace_block(text, name, table)
    readme.write_text(text)
    PICTURE.parent.mkdir(exist_ok=True)
    render_png(PICTURE, example)
    print(f"updated {readme} and {PICTURE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
