"""Memory pass: the bytes every group needs per GPU (the refusal where a group does not fit:
`rlgraph.compiler.memory_check`).

A group's GPUs hold, for the whole run, the model state its tasks keep (`resident`): the
policy's weights, its gradients and AdamW states where the group trains, the frozen
reference, the receiver's second buffer of a weight sync. On top, one task at a time runs
(tasks of a group never overlap) and adds what it allocates while it runs (`transient`):
train's saved activations and log-prob head, a forward's working set, generate's KV cache.
A group needs resident + the largest transient, per GPU. Where the plan prices verl's hybrid
engine (engine sglang), its torch passes are counted as verl runs them (`as_verl_runs_it`:
FSDP, activation checkpointing, passes of ppo_max_token_len_per_gpu tokens), and in a group
that also generates verl offloads the state of the task that is not running, so the group
needs the largest of (a task's own state + its transient).

Counted as rlgraph's runtime allocates it, so a plan this pass accepts does not run out of
memory (on a local CPU cluster nothing is checked):

- `backend: torch`, `sharding: none`: every data-parallel rank holds the whole model in bf16,
  bf16 gradients (kept between steps: `zero_grad` runs at the start of an update) and
  torch AdamW's two states in the parameters' dtype: 8 bytes a parameter. tp and pp do not
  shard it (the torch backend runs them as data-parallel replicas).
- `sharding: fsdp` (torch FSDP2): fp32 master weights, fp32 gradients and fp32 AdamW
  states, 16 bytes a parameter, divided by the data-parallel size (GPUs / (tp x pp)); while
  a pass runs, the root module (embeddings, head) and two decoder layers are gathered in bf16
  (the one computing and the one prefetched) and a layer's fp32 gradients wait for their
  reduce-scatter.
- `backend: megatron`: tp x pp shard the model (routed experts also over ep); activations of
  the tensor-parallel parts are divided by tp.
- Activations of a training pass: every decoder layer saves 12 h + 8 q + 8 i bytes a token
  for its backward (counted from the tensors a transformers Llama / Qwen2 layer keeps: two
  RMSNorms' fp32 input and bf16 output, the projections' inputs, rotated q and the k / v
  that SDPA with a padding mask repeats to every query head, the attention output, the
  SwiGLU's gate, up, activation and product; h hidden, q query width, i intermediate width,
  a MoE layer's routed top_k and shared experts' widths); with activation checkpointing a
  layer keeps only its input (2 h) and one layer is recomputed at a time. A pass holds
  `micro_tokens` tokens (at least one whole sequence), else its rows at prompt + max
  response; the padding mask is a [rows, 1, S, S] bf16 bias.
- The log-prob head (`engines.cpu_decode.token_logp`): bf16 logits, their fp32 copy scaled by
  the temperature and the fp32 log_softmax alive at once, 10 bytes a logit (12 with the
  backward's gradient of the log_softmax); priced as verl's hybrid engine, the bf16 logits
  alone (its fused log-prob kernels).
- generate, engine native: the static decoder allocates every slot's KV cache at prompt +
  max response (a replica's samples of a step; with partial rollout the groups in flight),
  20 bytes a slot position for its outputs, and prefills in chunks of PREFILL_TOKENS;
  engine sglang: its weights / tp and the KV cache of one whole sequence (SGLang sizes its
  pool to the memory left and decodes longer batches in waves).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rlgraph.compiler.shapes import model_config, shape_of
from rlgraph.config.schema import Spec
from rlgraph.nodes import KINDS
from rlgraph.presets.gpus import GPU_PRESETS
from rlgraph.presets.models import ModelShape
from rlgraph.pricing.constants import COSTS
from rlgraph.pricing.system import hybrid_engine_priced

GB = 1e9
BF16, FP32 = 2, 4
TORCH_TRAIN_BYTES = {"weights": BF16, "gradients": BF16, "AdamW states": 2 * BF16}
FSDP_TRAIN_BYTES = 4 * FP32  # fp32 master weights + fp32 gradients + fp32 AdamW m and v
FSDP_PARAM_BYTES = FP32  # a sharded model's parameters (fp32 master copy)
LOGIT_BYTES_FORWARD = 10  # bf16 logits + fp32 scaled copy + fp32 log_softmax (token_logp)
LOGIT_BYTES_BACKWARD = 12  # the saved log_softmax + its gradient + the scaled copy's
LOGIT_BYTES_FUSED = BF16  # the bf16 logits alone: verl's fused log-prob kernels (verl
# use_fused_kernels, flash-attn's cross_entropy) never hold an fp32 copy of the vocabulary
DECODE_OUTPUT_BYTES = 20  # static decoder: out_tok, out_ver (int64), out_logp (fp32)
PREFILL_TOKENS = 16384  # padded tokens of one prefill call (engines.static_decode; tested)
MASK_BYTES = BF16  # the padding mask's additive bias, per (row, query, key)


@dataclass
class TaskMemory:
    """What one task keeps (`state`, shared within a group by name) and allocates while it
    runs (`transient`), in bytes per GPU."""

    task: str
    state: dict[str, float] = field(default_factory=dict)
    transient: dict[str, float] = field(default_factory=dict)
    note: str = ""  # how the transient was sized (pass tokens, slots)


@dataclass
class GroupMemory:
    """A group's memory per GPU: what stays resident, each task's peak, the capacity."""

    group: str
    gpus: int
    gpu: str
    capacity: float  # usable bytes per GPU
    tasks: dict[str, TaskMemory]
    exclusive: bool = False  # verl hybrid engine: the task not running is offloaded

    @property
    def resident(self) -> dict[str, float]:
        """State kept across tasks: each named state once (its largest), none when
        exclusive."""
        if self.exclusive:
            return {}
        out: dict[str, float] = {}
        for task in self.tasks.values():
            for name, size in task.state.items():
                out[name] = max(out.get(name, 0.0), size)
        return out

    def peak_of(self, task: str, resident: float | None = None) -> float:
        """Bytes per GPU while `task` runs (`resident`: the resident total, when the caller
        has it already)."""
        mem = self.tasks[task]
        if self.exclusive:
            own = sum(mem.state.values())
        else:
            own = sum(self.resident.values()) if resident is None else resident
        return own + sum(mem.transient.values())

    @property
    def worst(self) -> str | None:
        """The task whose run needs the most memory (the resident total summed once: a
        group of hundreds of tasks is asked this for each of its tasks)."""
        if not self.tasks:
            return None
        resident = sum(self.resident.values())
        return max(self.tasks, key=lambda task: self.peak_of(task, resident))

    @property
    def need(self) -> float:
        """Bytes per GPU the group needs: its worst task's peak."""
        return self.peak_of(self.worst) if self.worst else 0.0

    @property
    def fits(self) -> bool:
        """Whether the group's need is within the usable memory of a GPU."""
        return self.need <= self.capacity

    def breakdown(self) -> str:
        """The worst task's peak as `name size + ...` in GB."""
        worst = self.worst
        if worst is None:
            return "nothing"
        mem = self.tasks[worst]
        terms = {**(mem.state if self.exclusive else self.resident), **mem.transient}
        text = " + ".join(f"{name} {size / GB:.1f}" for name, size in terms.items()
                          if size >= 0.05 * GB)
        return f"{worst}: {text or 'under 0.1 GB'}" + (f" ({mem.note})" if mem.note else "")

    def to_dict(self) -> dict[str, Any]:
        """The plan's `memory.groups[name]` entry, in GB per GPU."""
        return {
            "gpus": self.gpus, "capacity_gb": round(self.capacity / GB, 3),
            "need_gb": round(self.need / GB, 3), "fits": self.fits, "worst_task": self.worst,
            "offloads_idle_tasks": self.exclusive,
            "resident_gb": {k: round(v / GB, 3) for k, v in self.resident.items()},
            "tasks": {t: {"peak_gb": round(self.peak_of(t) / GB, 3),
                          "state_gb": {k: round(v / GB, 3) for k, v in m.state.items()},
                          "transient_gb": {k: round(v / GB, 3) for k, v in m.transient.items()},
                          "note": m.note}
                      for t, m in self.tasks.items()},
        }


# ----------------------------------------------------------------------------- model sizes


def expert_params(spec: Spec, shape: ModelShape) -> float:
    """Parameters of the routed experts (what expert parallelism splits); 0 for a dense
    model."""
    if not shape.moe_layers:
        return 0.0
    config = model_config(spec)
    experts = int(config.get("n_routed_experts") or config.get("num_experts") or 0)
    return float(shape.moe_layers * experts * 3 * shape.hidden
                 * int(config.get("moe_intermediate_size", 0)))


def model_parallel_shard(spec: Spec, node: Any, shape: ModelShape) -> float:
    """Parameters one GPU holds of the model `node` runs, before any FSDP sharding: megatron
    splits the dense part by tp x pp and the routed experts by pp x ep (expert tensor
    parallelism 1, megatron-core's default: ep takes the place of tp there), an sglang engine
    by tp, rlgraph's torch backend and native engine hold the whole model."""
    if getattr(node, "backend", "torch") == "megatron":
        experts = expert_params(spec, shape)
        return ((shape.params - experts) / (node.tp * node.pp)
                + experts / (node.pp * max(1, node.ep)))
    if getattr(node, "engine", None) == "sglang":
        return shape.params / node.tp
    return shape.params


def sharded(node: Any) -> bool:
    """Whether the node's model is sharded by FSDP over its data-parallel ranks."""
    return getattr(node, "sharding", "none") == "fsdp"


def data_parallel(node: Any, gpus: int) -> int:
    """Data-parallel ranks of `node` on `gpus` GPUs: GPUs / (tp x pp), at least 1."""
    mp = node.model_parallel() if hasattr(node, "model_parallel") else 1
    return max(1, gpus // mp)


def layer_params(shape: ModelShape) -> float:
    """Parameters of one decoder layer (all experts included)."""
    return (shape.params - shape.embedding_params - shape.vocab * shape.hidden) / shape.layers


def _widths(shape: ModelShape) -> tuple[float, float, float]:
    """(h, q, i): hidden, query and the MLP's active intermediate width per layer (a MoE
    layer's routed top_k and shared experts), from the parameter counts."""
    h = shape.hidden
    q = (shape.heads or shape.kv_heads) * shape.head_dim
    kv = shape.kv_heads * shape.head_dim
    attention = h * (2 * q + 2 * kv)
    embed = shape.vocab * h + shape.embedding_params
    active_mlp = (shape.active_params - embed) / shape.layers - attention
    return float(h), float(q), max(0.0, active_mlp / (3 * h))


def saved_bytes_per_token(shape: ModelShape, tp: int = 1) -> float:
    """Bytes one decoder layer saves for its backward per token (see the module)."""
    h, q, i = _widths(shape)
    return 12 * h + (8 * q + 8 * i) / tp


# ----------------------------------------------------------------------------- passes


@dataclass(frozen=True)
class Pass:
    """The largest forward (+ backward) pass a task runs on one GPU."""

    tokens: float  # padded tokens of the pass
    rows: float
    width: float  # prompt + response positions of its rows
    how: str


def largest_pass(spec: Spec, node: Any, gpus: int) -> Pass:
    """Rows and tokens of the largest pass of `node` (train, logp, ref_logp) on one GPU: a
    data-parallel rank's share of an update's rows (train: of a mini-batch; streaming: of a
    stream mini-batch), cut into `micro_tokens` passes (one sequence at least) or
    `micro_batch` rows (train)."""
    data = spec.data
    width = data.prompt_len + data.response_len.max
    updates = spec.schedule.mini_batches * getattr(node, "mini_batches", 1)
    rows = math.ceil(data.samples_per_step() / updates)
    share = math.ceil(rows / data_parallel(node, gpus))
    budget = getattr(node, "micro_tokens", None)
    if budget:
        per_pass = min(share, max(1, budget // width))
        return Pass(per_pass * width, per_pass, width, f"micro_tokens {budget}: {per_pass:g} "
                    f"rows x {width} positions")
    micro = getattr(node, "micro_batch", None) or share
    per_pass = min(micro, share)
    what = "micro_batch" if getattr(node, "micro_batch", None) else "no micro_tokens"
    return Pass(per_pass * width, per_pass, width, f"{what}: {per_pass:g} rows x {width} "
                f"positions a pass")


def _gathered(shape: ModelShape, backward: bool) -> float:
    """FSDP2's unsharded working set while a pass runs: the root module (embeddings, head)
    and two decoder layers in bf16, and in the backward one layer's fp32 gradients before
    their reduce-scatter."""
    root = shape.params - shape.layers * layer_params(shape)
    out = BF16 * (root + 2 * layer_params(shape))
    return out + (FP32 * layer_params(shape) if backward else 0.0)


def _pass_terms(spec: Spec, node: Any, shape: ModelShape, gpus: int, backward: bool
                ) -> tuple[dict[str, float], str]:
    """Transient bytes of a forward (+ backward) task's largest pass."""
    p = largest_pass(spec, node, gpus)
    megatron = getattr(node, "backend", "torch") == "megatron"
    tp = node.tp if megatron else 1
    layers = shape.layers
    per_layer = saved_bytes_per_token(shape, tp)
    h = shape.hidden
    terms: dict[str, float] = {}
    if backward and getattr(node, "activation_checkpointing", False):
        terms["activations"] = p.tokens * (layers * BF16 * h + per_layer)
    elif backward:
        terms["activations"] = p.tokens * layers * per_layer
    else:  # no_grad: the residual stream and one layer's working set
        terms["activations"] = p.tokens * (2 * BF16 * h + per_layer)
    response = spec.data.response_len.max
    logits = p.rows * (response + 1) * shape.vocab / tp
    if hybrid_engine_priced(spec):  # verl / AReaL: bf16 logits into a fused log-prob kernel
        terms["log-prob head"] = logits * LOGIT_BYTES_FUSED
    else:
        terms["log-prob head"] = logits * (LOGIT_BYTES_BACKWARD if backward
                                           else LOGIT_BYTES_FORWARD)
    if not megatron:  # megatron's wrapper runs causal attention without a padding mask
        terms["padding mask"] = p.rows * p.width ** 2 * MASK_BYTES
    if sharded(node):
        terms["fsdp gathered layers"] = _gathered(shape, backward)
    return terms, p.how


# ----------------------------------------------------------------------------- tasks


def _generate_slots(spec: Spec, node: Any, gpus: int) -> int:
    """Slots of one replica's static decoder: its prompts of a step (partial rollout or
    streaming: the groups it keeps in flight) x samples per prompt."""
    data, schedule = spec.data, spec.schedule
    replicas = max(1, gpus // node.tp)
    prompts = math.ceil(data.prompts_per_step / replicas)
    k = schedule.mini_batches
    if schedule.partial_rollout or schedule.stream is not None:
        per_call = max(1, prompts // k)
        oversample = k * (node.oversample if schedule.partial_rollout else 1.0)
        prompts = max(per_call, math.ceil(oversample * per_call))
    return prompts * data.samples_per_prompt


def _generate(spec: Spec, name: str, node: Any, shape: ModelShape, gpus: int) -> TaskMemory:
    data = spec.data
    width = data.prompt_len + data.response_len.max
    shard = model_parallel_shard(spec, node, shape)
    if node.engine == "sglang":
        kv = shape.kv_bytes_per_gpu_token(node.tp) * width
        return TaskMemory(name, {"engine weights": BF16 * shard}, {"KV cache": kv},
                          "sglang: weights / tp + one whole sequence's KV cache")
    slots = _generate_slots(spec, node, gpus)
    h, _, _ = _widths(shape)
    prefill = max(PREFILL_TOKENS, width)
    transient = {
        "prefill": prefill * (2 * BF16 * h + saved_bytes_per_token(shape)),
        "decode logits": slots * shape.vocab * 3 * FP32,
    }
    state = {"weights": BF16 * shard, ENGINE_SLOTS: slots * slot_bytes(spec, shape)}
    return TaskMemory(name, state, transient, f"native engine: {slots} slots x {width} "
                      f"positions")


ENGINE_SLOTS = "KV cache + decode outputs"  # the native engine's slots, kept between calls


def slot_bytes(spec: Spec, shape: ModelShape) -> float:
    """Bytes one slot of the native engine holds: the KV cache and the outputs of prompt +
    max response positions."""
    width = spec.data.prompt_len + spec.data.response_len.max
    return width * (shape.kv_bytes_per_token() + DECODE_OUTPUT_BYTES)


def _fit_engine_slots(mem: GroupMemory, spec: Spec, shape: ModelShape) -> None:
    """The native engine keeps as many slots as the memory left holds, the rest of a step's
    rows waiting in its queue (decoded in waves), one slot at least."""
    # the largest transient (slots change only state): peak = resident + it, exactly the
    # largest resident + transient_t (rounding is monotone), without asking every task
    transient = max((sum(t.transient.values()) for t in mem.tasks.values()), default=0.0)
    for task in mem.tasks.values():
        if ENGINE_SLOTS not in task.state:
            continue
        wanted = task.state[ENGINE_SLOTS]
        task.state[ENGINE_SLOTS] = 0.0
        if mem.exclusive:
            peak = max(mem.peak_of(t) for t in mem.tasks)
        else:
            peak = sum(mem.resident.values()) + transient
        each = slot_bytes(spec, shape)
        held = max(1, min(round(wanted / each), math.floor((mem.capacity - peak) / each)))
        task.state[ENGINE_SLOTS] = held * each
        if held * each < wanted:
            task.note = (f"native engine: holds {held} of {round(wanted / each)} slots at "
                         f"once (the rest queue, decoded in waves)")


def _policy_state(spec: Spec, node: Any, shape: ModelShape, gpus: int, trains: bool
                  ) -> dict[str, float]:
    shard = model_parallel_shard(spec, node, shape)
    if sharded(node):
        dp = data_parallel(node, gpus)
        if trains:
            return {"fsdp weights + gradients + AdamW states": FSDP_TRAIN_BYTES * shard / dp}
        return {"fsdp weights + gradients + AdamW states": FSDP_PARAM_BYTES * shard / dp}
    if trains:
        return {k: b * shard for k, b in TORCH_TRAIN_BYTES.items()}
    return {"weights": BF16 * shard}


def task_memory(spec: Spec, name: str, shape: ModelShape, gpus: int) -> TaskMemory | None:
    """One task's state and transient bytes per GPU on a group of `gpus`; None for a task
    that holds no model (reward)."""
    node = spec.nodes[name]
    role = KINDS[node.kind]
    if not role.models and not role.trains:  # a critic holds a model of its own
        return None
    if role.samples:
        return _generate(spec, name, node, shape, gpus)
    trains = role.trains
    if "reference" in role.models:
        shard = model_parallel_shard(spec, node, shape)
        state = ({"fsdp reference": FSDP_PARAM_BYTES * shard / data_parallel(node, gpus)}
                 if sharded(node) else {"reference weights": BF16 * shard})
    else:
        state = _policy_state(spec, node, shape, gpus, trains)
    transient, how = _pass_terms(spec, node, shape, gpus, backward=trains)
    return TaskMemory(name, state, transient, how)


def _weight_sync_terms(spec: Spec, tasks: list[str], shape: ModelShape
                       ) -> dict[str, dict[str, float]]:
    """Per task of the group: the second buffer a receiver stages the next version in (a
    native engine fed from another group) and the bucket a sender gathers."""
    out: dict[str, dict[str, float]] = {}
    for node in spec.nodes.values():
        if not KINDS[node.kind].carries_weights:
            continue
        src_here, dst_here = node.src in tasks, node.dst in tasks
        if dst_here and not src_here and getattr(spec.nodes.get(node.dst), "engine",
                                                 "native") == "native":
            receiver = spec.nodes[node.dst]
            out.setdefault(node.dst, {})["second buffer"] = (
                BF16 * model_parallel_shard(spec, receiver, shape))
        if src_here and not dst_here:
            out.setdefault(node.src, {})["weight-sync bucket"] = node.bucket_mb.produce * 2**20
    return out


def with_nodes(spec: Spec, changes: dict[str, dict[str, Any]]) -> Spec:
    """`spec` with some nodes' fields changed (no revalidation: a what-if of the check)."""
    nodes = {n: node.model_copy(update=changes[n]) if n in changes else node
             for n, node in spec.nodes.items()}
    return spec.model_copy(update={"nodes": nodes})


VERL_TOKENS_PER_GPU = 16384  # verl ppo_max_token_len_per_gpu default (ppo_trainer.yaml)


def as_verl_runs_it(spec: Spec, tasks: list[str]) -> Spec:
    """Where the plan prices verl's hybrid engine, its torch passes as verl runs them (the
    pricing assumes the same system): FSDP (verl's default actor.strategy), activation
    checkpointing (enable_gradient_checkpointing, as `pricing.train` prices it) and passes
    of at most ppo_max_token_len_per_gpu tokens unless micro_tokens says otherwise."""
    if not hybrid_engine_priced(spec):
        return spec
    changes = {t: {"sharding": "fsdp", "activation_checkpointing": True,
                   "micro_tokens": spec.nodes[t].micro_tokens or VERL_TOKENS_PER_GPU}
               for t in tasks if KINDS[spec.nodes[t].kind].sequence_passes
               and getattr(spec.nodes[t], "backend", "torch") == "torch"}
    return with_nodes(spec, changes) if changes else spec


def group_memory(spec: Spec, group: str, tasks: list[str], gpus: int, gpu: Any,
                 shape: ModelShape | None = None) -> GroupMemory:
    """The memory per GPU of a group of `gpus` GPUs holding `tasks`."""
    shape = shape or shape_of(spec)
    spec = as_verl_runs_it(spec, tasks)
    found = {t: task_memory(spec, t, shape, gpus) for t in tasks}
    mems = {t: m for t, m in found.items() if m is not None}
    for task, extra in _weight_sync_terms(spec, tasks, shape).items():
        if task not in mems:
            continue
        if "second buffer" in extra:
            mems[task].state["second buffer"] = extra["second buffer"]
        if "weight-sync bucket" in extra:
            mems[task].transient["weight-sync bucket"] = extra["weight-sync bucket"]
    roles = [KINDS[spec.nodes[t].kind] for t in tasks]
    exclusive = (hybrid_engine_priced(spec) and any(r.samples for r in roles)
                 and any(r.advances_policy for r in roles))
    capacity = gpu.memory_bytes * COSTS.usable_memory_fraction
    mem = GroupMemory(group, gpus, gpu.name, capacity, mems, exclusive)
    _fit_engine_slots(mem, spec, shape)
    return mem


def engine_slots(task: TaskMemory, spec: Spec, shape: ModelShape) -> int | None:
    """Slots the native engine of a task holds (None: not a native engine)."""
    if ENGINE_SLOTS not in task.state:
        return None
    return max(1, round(task.state[ENGINE_SLOTS] / slot_bytes(spec, shape)))


def native_engine_slots(spec: Spec, task: str, gpus: int) -> int:
    """Slots the native engine of `task` allocates on a GPU of its group (`gpus` GPUs): a
    replica's rows of a step, or as many as the memory left holds (`group_memory`)."""
    group = spec.group_of(task)
    tasks = list(spec.groups[group].tasks) if group else [task]
    shape = shape_of(spec)
    mem = group_memory(spec, group or task, tasks, gpus, GPU_PRESETS[spec.cluster.gpu], shape)
    return engine_slots(mem.tasks[task], spec, shape) or 1
