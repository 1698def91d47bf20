"""Load a graph.yaml: read it safely, apply `key=value` overrides, validate it into a `Spec`.

`load_spec(path, overrides)` returns a validated `Spec` whose `source` maps every key to
its line; any problem raises `SpecError` that renders as `graph.yaml:LINE:COL: ...`. The
file and the overrides are read by `rlgraph.config.safe_yaml` (limits on size, depth, aliases).
"""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import (
    BaseModel,
    ValidationError,
)

from rlgraph.config.safe_yaml import MAX_DEPTH, parse_value, read_graph, shown
from rlgraph.config.safe_yaml import located as _located
from rlgraph.config.schema import Spec
from rlgraph.errors import Key, SourceMap, SpecError, did_you_mean
from rlgraph.nodes import KINDS


def _surrogate(text: str) -> str | None:
    """The first lone surrogate in `text` (an undecodable byte of a command line or a YAML
    escape such as "\\udc80"), escaped, or None."""
    found = next((ch for ch in text if "\ud800" <= ch <= "\udfff"), None)
    return None if found is None else repr(found)[1:-1]


def refuse_surrogates(data: Any, key: Key = ()) -> None:
    """Refuse a key or string value holding a lone surrogate: it is no text, and would stop
    rlgraph later when printed or written (after a run dir was made)."""
    if isinstance(data, str):
        bad = _surrogate(data)
        if bad is not None:
            raise SpecError(f"the text holds {bad}, a lone surrogate (an undecodable byte or a "
                            f"\\u escape of half a character), which is not text", key,
                            hint="write the name in UTF-8")
    elif isinstance(data, dict):
        for name, value in data.items():
            refuse_surrogates(name, (*key, name) if isinstance(name, str) else key)
            refuse_surrogates(value, (*key, name))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            refuse_surrogates(value, (*key, i))


def apply_overrides(data: dict[str, Any], overrides: Sequence[str], source: SourceMap) -> None:
    """Apply verl-style `a.b.c=value` overrides (value parsed as YAML) in place."""
    for text in overrides:
        bad = _surrogate(text)
        if bad is not None:
            raise _located(SpecError(f"override '{shown(text)}' holds {bad}, a byte that is not "
                                     f"UTF-8", hint="write the override in UTF-8"),
                           f"<override {shown(text)}>")
        if "=" not in text:
            raise _located(SpecError(f"override '{text}' has no '='",
                                     hint="write key.path=value, e.g. schedule.max_lag=2"),
                           f"<override {text}>")
        dotted, _, raw = text.partition("=")
        keys = [k for k in dotted.lstrip("+").split(".") if k]
        if len(keys) > MAX_DEPTH:
            raise _located(SpecError(f"override '{shown(dotted)}' names {len(keys)} levels of "
                                     f"keys, more than {MAX_DEPTH}"), f"<override {shown(text)}>")
        if not keys:
            raise _located(SpecError(f"override '{text}' names no key",
                                     hint="e.g. schedule.max_lag=2"), f"<override {text}>")
        value = parse_value(raw, f"<override {shown(text)}>")
        if not dotted.startswith("+"):
            _check_named_entry(data, keys, text)
        target = data
        for i, key in enumerate(keys[:-1]):
            nxt = target.setdefault(key, {})
            if not isinstance(nxt, dict):
                raise SpecError(
                    f"override '{text}': '{'.'.join(keys[: i + 1])}' is not a mapping",
                    tuple(keys[: i + 1]),
                )
            target = nxt
        target[keys[-1]] = value
        for stale in [k for k in source.positions if k[:len(keys)] == tuple(keys)]:
            del source.positions[stale]  # the file's lines under it no longer hold its value
        for stale in [k for k in source.overrides if k[:len(keys)] == tuple(keys)]:
            del source.overrides[stale]  # nor do earlier overrides below it
        for written in _key_paths(value, tuple(keys)):
            source.overrides[written] = text


def _key_paths(value: Any, key: Key) -> list[Key]:
    """`key` and the key of every mapping entry below it in `value` (what an override
    writes)."""
    paths = [key]
    if isinstance(value, dict):
        for name, inner in value.items():
            paths += _key_paths(inner, (*key, name))
    return paths


NAMED_SECTIONS = {"groups": "group", "nodes": "node"}  # mappings whose keys the user names


def _check_named_entry(data: dict[str, Any], keys: list[str], text: str) -> None:
    """An override below `groups.NAME` or `nodes.NAME` must name an entry the file has (a
    typo would otherwise create a new, half-written one); `+groups.NAME...` adds one."""
    section = data.get(keys[0])
    if keys[0] not in NAMED_SECTIONS or len(keys) < 3 or not isinstance(section, dict):
        return
    if keys[1] in section:
        return
    what, names = NAMED_SECTIONS[keys[0]], [str(name) for name in section]
    guess = did_you_mean(keys[1], names)
    hint = (guess + "; " if guess else f"{what}s: {', '.join(names)}; ") + \
        f"to add a new {what}, write +{text}"
    raise _located(SpecError(f"unknown {what} '{shown(keys[1])}'",
                             hint=hint), f"<override {shown(text)}>")


# ---------------------------------------------------------------- validation errors


def _unwrap(annotation: Any) -> Any:
    """Strip Optional / Annotated down to the class or container inside."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _unwrap(args[0]) if len(args) == 1 else annotation
    return annotation


def _model_at(path: Key, raw: Any) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at `path` (for key hints)."""
    cls: Any = Spec
    node: Any = raw
    keys = list(path)
    while keys:
        key = keys.pop(0)
        node = node.get(key) if isinstance(node, dict) else None
        field = cls.model_fields.get(key) if isinstance(cls, type) else None
        if field is None:
            return None
        ann = _unwrap(field.annotation)
        if typing.get_origin(ann) is dict:
            if not keys:
                return None
            item_key = keys.pop(0)
            node = node.get(item_key) if isinstance(node, dict) else None
            ann = _unwrap(typing.get_args(ann)[1])
            if typing.get_origin(ann) in (Union, types.UnionType):
                kind = node.get("kind") if isinstance(node, dict) else None
                ann = KINDS[kind].spec if kind in KINDS else None
        cls = ann
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def _clean_loc(loc: tuple[Any, ...]) -> Key:
    """Drop the tag pydantic inserts for discriminated unions: nodes.gen.generate.tp."""
    loc = tuple(loc)
    if len(loc) >= 3 and loc[0] == "nodes" and loc[2] in KINDS:
        loc = loc[:2] + loc[3:]
    return tuple(k for k in loc if not (isinstance(k, str) and k.startswith("function-")))


# Words of the configs users bring from other frameworks (verl, dots.rl async-rl, AReaL,
# NeMo-RL, slime, OpenRLHF, ROLL, prime-rl, SkyRL, PipelineRL) and their rlgraph key. A dotted
# word matches a nested key (verl's rollout.n); docs/how-to/price-a-published-run.md maps them.
FIELD_ONE_GROUP = "one group holding generate and train with share 1 (groups.<name>)"
SEED_WORDS: dict[str, str] = {
    # lag and streaming
    "generate_ahead_steps": "schedule.max_lag",
    "staleness_threshold": "schedule.max_lag",
    "max_head_offpolicyness": "schedule.max_lag",
    "max_trajectory_age_steps": "schedule.max_lag",
    "max_staleness_steps": "schedule.max_lag",
    "max_async_level": "schedule.max_lag",
    "max_off_policy_steps": "schedule.max_lag",
    "async_generation_ratio": "schedule.max_lag",
    "async_train": "schedule.max_lag: 1 on groups apart",
    "partial_rollout": "schedule.partial_rollout",
    "trigger_parameter_sync_step": "schedule.stream.mini_batches",
    "require_batches": "data.prompts_per_step / schedule.stream.mini_batches prompt groups per "
                       "mini-batch (with ppo_mini_batch_size)",
    "in_flight_weight_updates": "inflight: true on a generate node of engine native; with engine "
                                "sglang, the one-step-off graph (max_lag) prices the same step",
    "gpu_memory_utilization": "memory_fraction on the generate node",
    "mem_fraction_static": "memory_fraction on the generate node",
    "train_mb_tokens": "micro_tokens of the train node",
    "logprob_mb_tokens": "micro_tokens of the logp / ref_logp nodes",
    # placement
    "sperated_node_tasks": "groups.<name>.tasks",
    "sperated_node_ratios": "groups.<name>.share",
    "hybrid_engine": FIELD_ONE_GROUP,
    "colocate": FIELD_ONE_GROUP,
    "colocate_all": FIELD_ONE_GROUP,
    "colocate_all_models": FIELD_ONE_GROUP,
    "colocated": FIELD_ONE_GROUP + "; colocated.enabled false: a group each",
    "allocation_mode": "groups.<name>.share (sglang.d96+d32: rollout 0.75, trainer 0.25)",
    "device_mapping": "groups.<name>.tasks and share",
    "rollout_num_gpus": "groups.<name>.share of the group holding generate",
    "vllm_num_engines": "groups.<name>.share of the generate group (engines x tp GPUs)",
    "num_inference_engines": "groups.<name>.share of the generate group (engines x tp GPUs)",
    "n_gpus": "groups.<name>.share (its GPUs / all GPUs)",
    "colocated.resources": "groups.<name>.share of the generate group (its GPUs / all GPUs)",
    "n_gpus_per_node": "cluster.gpus_per_node",
    "gpus_per_node": "cluster.gpus_per_node",
    "actor_num_gpus_per_node": "cluster.gpus_per_node (and the trainer group's share)",
    "nnodes": "cluster.nodes",
    "num_nodes": "cluster.nodes",
    # batch shape
    "train_batch_size": "data.prompts_per_step",
    "num_prompts_per_step": "data.prompts_per_step",
    "rollout_batch_size": "data.prompts_per_step",
    "n": "data.samples_per_prompt",
    "rollout.n": "data.samples_per_prompt",
    "num_generations_per_prompt": "data.samples_per_prompt",
    "n_samples_per_prompt": "data.samples_per_prompt",
    "n_samples": "data.samples_per_prompt",
    "num_return_sequences_in_group": "data.samples_per_prompt",
    "rollouts_per_example": "data.samples_per_prompt",
    "attempts": "data.samples_per_prompt",
    "max_prompt_length": "data.prompt_len (the mean prompt length, not the cap)",
    "prompt_max_len": "data.prompt_len (the mean prompt length, not the cap)",
    "rollout_max_prompt_len": "data.prompt_len (the mean prompt length, not the cap)",
    "max_response_length": "data.response_len.max (and the stated mean: response_len.mean)",
    "max_new_tokens": "data.response_len.max (and the stated mean: response_len.mean)",
    "generate_max_len": "data.response_len.max (and the stated mean: response_len.mean)",
    "rollout_max_response_len": "data.response_len.max (and the stated mean: "
                                "response_len.mean)",
    "max_total_sequence_length": "data.prompt_len + data.response_len.max",
    "sequence_length": "data.prompt_len + data.response_len.max",
    "seq_len": "data.prompt_len + data.response_len.max",
    "global_batch_size": "data.prompts_per_step x data.samples_per_prompt / mini_batches of "
                         "the train node",
    "train_global_batch_size": "data.prompts_per_step x data.samples_per_prompt / mini_batches "
                               "of the train node",
    "ppo_mini_batch_size": "mini_batches of the train node (train_batch_size / "
                           "ppo_mini_batch_size)",
    "policy_mini_batch_size": "mini_batches of the train node (train_batch_size / "
                              "policy_mini_batch_size)",
    "num_steps_per_rollout": "mini_batches of the train node",
    "ppo_epochs": "epochs of the train node",
    # model parallelism and passes
    "tensor_model_parallel_size": "tp of the node",
    "rollout.tensor_model_parallel_size": "tp of the generate node",
    "tensor_parallel_size": "tp of the node (the generate node for the engine's)",
    "vllm_tensor_parallel_size": "tp of the generate node",
    "rollout_num_gpus_per_engine": "tp of the generate node",
    "inference_engine_tensor_parallel_size": "tp of the generate node",
    "pipeline_model_parallel_size": "pp of the node",
    "expert_model_parallel_size": "ep of the node",
    "expert_parallel_size": "ep of the node",
    "context_parallel_size": "cp of the node (backend megatron)",
    "use_dynamic_bsz": "micro_tokens of the logp / train node",
    "ppo_max_token_len_per_gpu": "micro_tokens of the logp / train node",
    "log_prob_max_token_len_per_gpu": "micro_tokens of the logp node",
    "max_tokens_per_gpu": "micro_tokens of the logp / train node",
    "use_dynamic_batch_size": "micro_tokens of the logp / train node",
    "train_max_tokens_per_gpu": "micro_tokens of the train node",
    "dynamic_batching": "micro_tokens of the logp / train node",
    "enable_gradient_checkpointing": "activation_checkpointing of the train node",
    "gradient_checkpointing": "activation_checkpointing of the train node",
    "zero_stage": "sharding: fsdp of the train node",
    "dtensor_cfg": "sharding: fsdp of the train node (backend torch)",
    "megatron_cfg": "backend: megatron of the train node (tp, pp, ep)",
    "strategy": "backend (torch or megatron) and sharding (fsdp) of the train node",
    "recompute_logprob": "a logp node feeding train",
    "kl_coef": "algorithm.kl_coef (and a ref_logp node)",
    "use_kl_loss": "algorithm.kl_coef and a ref_logp node",
    "use_rollout_logprobs": "old_logp of the train node (no logp node)",
    # the system around them
    "use_remove_padding": "pricing.system (whether the system packs sequences)",
    "sequence_packing": "pricing.system (whether the system packs sequences); its micro-batch "
                        "tokens: micro_tokens of train / logp / ref_logp",
    "packing_samples": "pricing.system (whether the system packs sequences)",
    "use_sample_packing": "pricing.system (whether the system packs sequences)",
    "use_sequence_packing": "pricing.system (whether the system packs sequences)",
    "seq_packing": "pricing.system (whether the system packs sequences)",
    "offload": "pricing.system (the system's colocation switch prices its offload)",
    "param_update_preduce_bucket_size_mb": "bucket_mb.produce of the param_update node",
    "param_update_consume_bucket_size_mb": "bucket_mb.consume of the param_update node",
    # whole sections
    "rollout": "the generate node (engine, tp); rollout.n is data.samples_per_prompt",
    "actor_rollout_ref": "the generate, logp and train nodes and their groups",
    "vllm_cfg": "the generate node (engine, tp)",
    "grpo": "data.prompts_per_step, data.samples_per_prompt and schedule",
    "async_grpo": "schedule.max_lag (max_trajectory_age_steps)",
    "policy": "model and the train / generate nodes",
}
MAX_NESTED_HINTS = 4  # words named in one hint for a pasted section


def _nested_hints(value: Any, prefix: str = "") -> list[str]:
    """'rollout.n is data.samples_per_prompt' for the words of a pasted section (a mapping)
    that SEED_WORDS knows, by their dotted suffix or their last word."""
    out: list[str] = []
    if not isinstance(value, dict):
        return out
    for key, inner in value.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        tail = ".".join(dotted.split(".")[-2:])
        word = tail if tail in SEED_WORDS else str(key) if str(key) in SEED_WORDS else None
        if word and not isinstance(inner, dict):
            out.append(f"{dotted} is {SEED_WORDS[word]}")
        out += _nested_hints(inner, dotted)
    return out


def _unknown_key_hint(key: Key, raw: dict[str, Any]) -> str | None:
    """did-you-mean among the keys allowed there, the other frameworks' vocabulary (and the
    words of a section pasted whole), or the allowed keys."""
    model = _model_at(key[:-1], raw)
    allowed = list(model.model_fields) if model else []
    word = str(key[-1])
    value: Any = raw
    for part in key:
        value = value.get(part) if isinstance(value, dict) else None
    nested = _nested_hints(value, word)[:MAX_NESTED_HINTS]
    if word in SEED_WORDS and SEED_WORDS[word] not in allowed:
        said = f"in rlgraph, {word} is {SEED_WORDS[word]}"
        return "; ".join([said, *nested])
    if nested:
        return "in rlgraph, " + "; ".join(nested)
    return did_you_mean(word, allowed) or (
        f"allowed here: {', '.join(allowed)}" if allowed else None)


def _you_wrote(value: Any) -> str | None:
    """`you wrote 'half'` for a scalar the user typed (None for mappings and lists)."""
    if isinstance(value, dict | list) or value is None:
        return None
    text = repr(value)
    return f"you wrote {text if len(text) <= 80 else text[:77] + '...'}"


def _first_error(exc: ValidationError, raw: dict[str, Any]) -> SpecError:
    """The first pydantic error as a SpecError with a key and a hint.

    An unknown key goes first: a misspelt key also makes its real key look missing.
    """
    errors = exc.errors(include_url=False)
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    key = _clean_loc(err["loc"])
    kind, msg = err["type"], err["msg"]
    hint = None
    if kind == "extra_forbidden":
        hint = _unknown_key_hint(key, raw)
        msg = f"unknown key '{key[-1]}'"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        tag = err.get("ctx", {}).get("tag", "")
        hint = did_you_mean(tag, KINDS) or f"kinds: {', '.join(KINDS)}"
        msg = f"unknown node kind '{tag}'" if tag else "node has no 'kind'"
        key = (*key, "kind")
    elif kind == "missing":
        msg = f"required key '{key[-1]}' is missing"
    elif kind == "value_error":
        msg = msg.removeprefix("Value error, ")
    elif kind == "dict_type":
        hint = "write a mapping (name: value, one per line), not a list or a scalar"
    else:
        hint = _you_wrote(err.get("input"))
    return SpecError(msg, key, hint)


def validate_spec(data: dict[str, Any], source: SourceMap) -> Spec:
    """Plain data -> Spec, or the first problem as a located SpecError."""
    try:
        refuse_surrogates(data)
        spec = Spec.model_validate(data)
    except SpecError as err:
        err.source = source
        raise
    except ValidationError as exc:
        err = _first_error(exc, data)
        err.source = source
        raise err from None
    spec._source = source
    return spec


def load_spec(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> Spec:
    """Read, override and validate a graph.yaml."""
    data, source = read_graph(path)
    try:
        apply_overrides(data, overrides, source)
    except SpecError as err:
        err.source = source
        raise
    spec = validate_spec(data, source)
    if spec.model.path is not None:
        try:
            spec.model.path = resolve_model_path(spec.model.path, Path(path).parent)
        except SpecError as err:
            err.source = source
            raise
    return spec


def resolve_model_path(path: str, graph_dir: Path) -> str:
    """`model.path` as an absolute folder: a relative one resolves against the graph's folder
    (like data and reward files), else the working directory; a Hugging Face hub id
    (owner/name) that is no local folder resolves to its snapshot in the hub cache
    (`rlgraph.model.hub`); a folder without config.json is the user's error."""
    given = Path(path).expanduser()
    tries = [given] if given.is_absolute() else [graph_dir / given, given]
    for folder in tries:
        if (folder / "config.json").is_file():
            return str(folder.resolve())
    owner = Path(path).parts[0] if Path(path).parts else path
    if not given.is_absolute() and not any((t / owner).exists() for t in (graph_dir, Path())):
        from rlgraph.model.hub import looks_like_hub_id, resolve_hub_id

        if looks_like_hub_id(path):  # owner/name, and no local folder named owner
            return resolve_hub_id(path)
    where = "" if given.is_absolute() else \
        f"; a relative path resolves against the graph's folder {graph_dir.resolve()}"
    raise SpecError(f"no Hugging Face model folder at '{path}' (no config.json there{where})",
                    ("model", "path"), hint="point model.path at a Hugging Face model folder "
                    "with config.json, weights and tokenizer files, or give a hub id "
                    "(owner/name)")
