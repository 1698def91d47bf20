"""The shared physics of the model-running kinds' passes: the compute-bound cost of a
forward (+ backward) over every token of the step, and what data and model parallelism,
a local CPU cluster, MoE experts and rlgraph's eager runtime add to it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rlgraph import lengths
from rlgraph.presets.models import PASS_WIDTH_BLOCK
from rlgraph.pricing.constants import COSTS, pass_efficiency
from rlgraph.pricing.context import CostContext
from rlgraph.pricing.sharding import fsdp_collectives, sharded
from rlgraph.pricing.system import system_of

if TYPE_CHECKING:
    from rlgraph.nodes.base import NodeSpec


def compute_units(ctx: CostContext) -> float:
    """GPUs of the node's group, or on a local CPU cluster its processes' worth of cores:
    each data-parallel replica past the first adds COSTS.local_extra_replica_efficiency of a
    core, and a replica's extra torch threads add nothing (a tiny model's ops are too small
    to split)."""
    if ctx.local:
        replicas = min(ctx.gpus, int(ctx.extra.get("replicas", 1)))
        return 1 + (replicas - 1) * COSTS.local_extra_replica_efficiency
    return float(ctx.gpus)


def threaded_process(ctx: CostContext) -> bool:
    """Whether the node's process on a local CPU cluster holds more than one slot: it then
    runs several torch threads (rlgraph.runtime.threads times one thread against one per slot
    on a forward + backward at start-up; on a quiet host the threads win for a step-sized
    pass)."""
    if not ctx.local:
        return False
    replicas = max(1, min(ctx.gpus, int(ctx.extra.get("replicas", 1))))
    return ctx.gpus // replicas > 1


def thread_slowdown(ctx: CostContext) -> float:
    """Time factor of a local CPU process's passes (1 on GPUs): a process of several slots
    runs them COSTS.local_multithread_pass_speedup faster on its threads, and a process that
    computes alone on a host of several cores (`sole_process_speedup`) runs uncontended,
    where the CPU figures are measured with every core busy."""
    if not ctx.local:
        return 1.0
    threads = 1 / COSTS.local_multithread_pass_speedup if threaded_process(ctx) else 1.0
    return threads / sole_process_speedup(ctx)


def thread_handoff(ctx: CostContext) -> float:
    """Seconds per layer a decode step of a threaded local process adds
    (COSTS.local_thread_handoff_seconds_per_layer: a decode step's ops are too small to
    split, and each hands off between the threads); 0 for a one-thread process or a GPU."""
    return COSTS.local_thread_handoff_seconds_per_layer if threaded_process(ctx) else 0.0


def sole_process_speedup(ctx: CostContext) -> float:
    """COSTS.local_sole_process_speedup where one process computes alone on a local host of
    more than one core: it runs every model pass and no reward runs in an actor of its own
    (ctx.extra host_processes, host_slots: the compiler's cost pass), else 1."""
    alone = (int(ctx.extra.get("host_processes", 0)) == 1
             and int(ctx.extra.get("host_slots", 1)) > 1)
    return COSTS.local_sole_process_speedup if alone else 1.0


def efficiency(ctx: CostContext, local_figure: float) -> float:
    """Fraction of peak a large-batch pass sustains on the node's hardware: on GPUs from the
    roofline (`pricing.constants.pass_efficiency`: GEMMs at their efficiency, the memory-bound rest
    at HBM speed); on a local CPU cluster the measured `local_figure` (COSTS.train_mfu, ...)."""
    if ctx.local:
        return local_figure
    return pass_efficiency(ctx.gpu.bf16_flops, ctx.gpu.hbm_bytes_per_s)


def moe_factor(ctx: CostContext) -> float:
    """COSTS.moe_pass_factor for a model with routed experts on GPUs (small grouped GEMMs,
    router, token permutation: a fine-grained MoE sustains less of the roofline figure than a
    dense model), or the system's own measured figure (`System.moe_pass_factor`), else 1 (a
    local CPU cluster's figure is measured as it is)."""
    if not ctx.shape.moe_layers or ctx.local:
        return 1.0
    own = system_of(ctx.spec).moe_pass_factor
    return COSTS.moe_pass_factor if own is None else own


def micro_batches(node: NodeSpec, ctx: CostContext, mini_batches: int = 1) -> int:
    """Micro-batches a data-parallel rank runs per update (optimizer step): its share of the
    update's sequences one at a time, or, where the system packs sequences and the node states
    `micro_tokens` (NeMo-RL: train_mb_tokens / logprob_mb_tokens, verl:
    ppo_max_token_len_per_gpu), its share of the update's tokens in packs of that many."""
    data = ctx.spec.data
    ranks = max(1, ctx.gpus // node.model_parallel())
    rows = max(1, data.samples_per_step() // max(1, mini_batches))
    budget = getattr(node, "micro_tokens", None)
    if budget and system_of(ctx.spec).packs_sequences:
        mean, _ = lengths.moments(lengths.of(data.response_len))
        tokens = rows * (data.prompt_len + mean) / ranks / max(1, getattr(node, "cp", 1))
        return max(1, math.ceil(tokens / budget))
    return max(1, rows // ranks)


def pipeline_bubble(node: NodeSpec, ctx: CostContext, mini_batches: int = 1) -> float:
    """Time factor of a pp-stage pipeline: (m + pp - 1) / m over the m micro-batches of each
    update (`micro_batches`), the pipeline filling and draining once per optimizer step."""
    pp = getattr(node, "pp", 1)
    if pp <= 1:
        return 1.0
    micro = micro_batches(node, ctx, mini_batches)
    return (micro + pp - 1) / micro


def data_parallel_imbalance(node: NodeSpec, ctx: CostContext, mini_batches: int = 1) -> float:
    """Slowest data-parallel rank over the mean one, per (mini-)batch: a rank's work is the
    tokens of its k sequences, so the slowest of D ranks carries about k * mu + z_D * sqrt(k) *
    sigma (z_D: expected largest of D standard normals), and never less than the longest
    sequence of the batch (E[max], clipped at max) beside k - 1 average ones. A pass over the
    whole batch at once (one mini-batch) is balanced by verl's `trainer.balance_batch` (True
    by default in verl/trainer/config/ppo_trainer.yaml: the batch is reordered so every rank
    gets about the same number of tokens), so only the longest sequence's bound is left."""
    data = ctx.spec.data
    ranks = max(1, ctx.gpus // node.model_parallel())
    if ranks <= 1:
        return 1.0
    model = lengths.of(data.response_len)
    mean, second = lengths.moments(model)
    mu = data.prompt_len + mean
    sigma = math.sqrt(max(0.0, second - mean * mean))
    size = max(1, data.samples_per_step() // mini_batches)
    k = size / ranks
    longest = data.prompt_len + lengths.expected_max(model, size)
    spread = 0.0 if mini_batches == 1 else lengths.expected_max_normal(ranks) * math.sqrt(k)
    slowest = max(k * mu + spread * sigma, longest + max(0.0, k - 1) * mu)
    return slowest / (k * mu)


def host_floor(node: NodeSpec, ctx: CostContext, passes: float, mini_batches: int = 1,
               per_layer: float = COSTS.native_decode_overhead_per_layer_s) -> float:
    """Host overhead of eager passes: every forward-equivalent pass of every micro-batch
    costs `per_layer` seconds per layer on the host (launches, Python), however few its
    tokens (rlgraph's runtime on GPUs: COSTS.eager_pass_host_seconds_per_layer, from
    bench/results/gpu-node-profile-h200x2.json). `passes`: 1 for a forward, 3 for forward +
    backward."""
    rows = ctx.spec.data.samples_per_step()
    ranks = max(1, ctx.gpus // node.model_parallel())
    if ctx.local:
        ranks = int(ctx.extra.get("replicas", 1))
    share = math.ceil(rows / mini_batches / ranks)
    micro = getattr(node, "micro_batch", None) or share
    return mini_batches * math.ceil(share / micro) * passes * ctx.shape.layers * per_layer


def eager_activation_traffic(ctx: CostContext, tokens: float, passes: float) -> float:
    """Seconds of the memory-bound work between the GEMMs of rlgraph's eager (unfused)
    transformers passes on a GPU: norms, rotary, residuals, activations, reshapes and their
    backward move COSTS.eager_activation_bytes_per_hidden bytes per hidden unit, token, layer
    and forward-equivalent pass at HBM speed (a replica's share); 0 where `runtime_pass_hbm`
    is None (a CPU cluster's measured MFU, verl's fused kernels in `pass_efficiency`)."""
    hbm = runtime_pass_hbm(ctx)
    if hbm is None:
        return 0.0
    shape = ctx.shape
    per_token = shape.layers * shape.hidden * COSTS.eager_activation_bytes_per_hidden
    return tokens * per_token * passes / hbm


def data_parallel_overhead(node: NodeSpec, ctx: CostContext, backward: bool, updates: int
                           ) -> float:
    """What rlgraph's data-parallel replicas add to a call on GPUs beyond their share of the
    work: the leader hands each follower its share through Ray and joins the results
    (COSTS.replica_dispatch_s a call), and a backward pass sums the gradients over the
    replicas after it (rlgraph.process.replicas.sum_gradients: not overlapped; a ring moves
    2 (W - 1) / W of the bf16 gradients per update over NVLink). 0 for one replica, on a CPU
    cluster or priced as verl."""
    ranks = max(1, ctx.gpus // node.model_parallel())
    if ranks <= 1 or runtime_pass_hbm(ctx) is None:
        return 0.0
    seconds = COSTS.replica_dispatch_s
    if backward and not sharded(node):  # FSDP reduce-scatters instead (pricing.sharding)
        gradient = 2 * ctx.shape.params / node.model_parallel()
        seconds += updates * 2 * (ranks - 1) / ranks * gradient / ctx.gpu.nvlink_bytes_per_s
    return seconds


def expert_all_to_all(node: NodeSpec, ctx: CostContext, tokens: float, passes: float
                      ) -> float:
    """Seconds of a MoE model's expert all-to-all over `tokens` (0 without experts or with
    ep 1): every MoE layer of every forward-equivalent pass sends each token's hidden state
    (bf16) to its top_k experts and back, (ep - 1) / ep of the copies to another GPU, over
    NVLink when the ep group fits in a node, else the network; not overlapped with compute
    (Megatron's default alltoall dispatcher waits for it)."""
    shape, ep = ctx.shape, getattr(node, "ep", 1)
    if ep <= 1 or not shape.moe_layers or ctx.local:
        return 0.0
    copies = tokens * shape.moe_layers * shape.top_k * 2 * (ep - 1) / ep
    per_gpu = copies * shape.hidden * 2 * passes / max(1, ctx.gpus)
    within = ep <= ctx.spec.cluster.gpus_per_node
    return per_gpu / (ctx.gpu.nvlink_bytes_per_s if within else ctx.gpu.network_bytes_per_s)


def driver_transfer(ctx: CostContext, response_bytes: int) -> float:
    """Seconds verl's single controller spends moving a pass's batch through Ray (priced only
    as verl's hybrid engine): its DataProto holds every row padded to prompt + max response,
    and the driver serializes the rows' input_ids, attention_mask and position_ids (int64,
    24 bytes a position) and responses (int64), and takes back or sends `response_bytes`
    more per response position (logp: log-probs and entropy, fp32; train: old log-probs,
    advantages, response mask), all through the object store at
    COSTS.object_store_bytes_per_s, however many GPUs compute."""
    data = ctx.spec.data
    width = data.prompt_len + data.response_len.max
    per_row = 24 * width + (8 + response_bytes) * data.response_len.max
    return data.samples_per_step() * per_row / COSTS.object_store_bytes_per_s


def runtime_pass_hbm(ctx: CostContext) -> float | None:
    """HBM bytes/s over which rlgraph's own passes move memory-bound data (a replica's
    share, `compute_units`); None on a local CPU cluster (inside its measured MFU) or priced
    as verl's hybrid engine (its own kernels)."""
    if ctx.local or not system_of(ctx.spec).runs_here:
        return None
    return ctx.gpu.hbm_bytes_per_s * COSTS.decode_hbm_efficiency * compute_units(ctx)


def logits_traffic(ctx: CostContext, tokens: float, flops_per_param: int) -> float:
    """Seconds of rlgraph's log-prob head over `tokens` positions on a GPU: `token_logp`
    writes the vocabulary's logits and reads and writes them again in fp32 (cast, temperature,
    log_softmax; COSTS.logits_bytes_forward per logit), and a backward pass
    (flops_per_param > 2) adds COSTS.logits_bytes_backward, all memory-bound at HBM speed,
    per replica's share of the tokens. 0 on a local CPU cluster (inside its measured MFU)
    and priced as verl's hybrid engine (its own log-prob kernels)."""
    hbm = runtime_pass_hbm(ctx)
    if hbm is None:
        return 0.0
    per_logit = COSTS.logits_bytes_forward + (COSTS.logits_bytes_backward
                                              if flops_per_param > 2 else 0.0)
    return tokens * ctx.shape.vocab * per_logit / hbm


def padding_mask(ctx: CostContext, model: lengths.LengthModel) -> bool:
    """Whether rlgraph's passes carry the padding mask's bias on a GPU: rows of different
    lengths give transformers a [rows, 1, S, S] bf16 additive mask, with which its SDPA path
    repeats the K/V heads and runs the memory-efficient kernel with a bias (not flash:
    transformers' `use_gqa_in_sdpa` takes GQA only without a mask). False with fixed lengths
    (no padding, no mask), on a local CPU cluster or priced as verl (which packs sequences)."""
    return runtime_pass_hbm(ctx) is not None and model.mean < model.max


def bias_attention_seconds(ctx: CostContext, square: float, backward: bool) -> float:
    """Seconds of attention in rlgraph's padded passes on a GPU (`padding_mask`): the
    memory-efficient kernel takes an arbitrary bias, so it evaluates every block of each
    row's length x length product, the causal half's included (twice `attention_flops` of
    the rows' summed squares, `square`), reading the bias as it goes, at its measured share
    of the group's bf16 peak: COSTS.bias_attention_forward_efficiency for the forward and
    COSTS.bias_attention_backward_efficiency for the backward's two forward-equivalents
    (both measured with the bias reads inside the kernels' time)."""
    forward = 2 * ctx.shape.attention_flops(1.0) * square
    peak = ctx.gpu.bf16_flops * compute_units(ctx)
    seconds = forward / (peak * COSTS.bias_attention_forward_efficiency)
    if backward:
        seconds += 2 * forward / (peak * COSTS.bias_attention_backward_efficiency)
    return seconds


def streamed_calls(ctx: CostContext) -> int:
    """Calls a version makes of a node that runs on batches: with streaming
    (`schedule.stream`) one per mini-batch, each over its `samples_per_step / mini_batches`
    rows alone (the runtime pads and length-sorts a call's rows among themselves), else 1."""
    schedule = ctx.spec.schedule
    rows = ctx.spec.data.samples_per_step()
    return max(1, min(rows, schedule.mini_batches)) if schedule.stream is not None else 1


def token_pass_cost(node: NodeSpec, ctx: CostContext, flops_per_param: int, mfu: float,
                    mini_batches: int = 1, response_bytes: int = 8, epochs: int = 1) -> float:
    """A compute-bound pass over the step's tokens: flops_per_param * N * tokens FLOPs (N: the
    matmul parameters a token touches, `ModelShape.matmul_active`) plus causal attention's
    (flops_per_param / 2 forward-equivalents of 2 x layers x width x length^2 per sequence;
    rlgraph's padded passes run the bias kernel at its own rate, `bias_attention_seconds`) at
    `efficiency(ctx, mfu)` of the group's peak (the roofline figure on GPUs, `mfu` on a local
    CPU cluster; times the pipeline bubble when pp > 1), plus a MoE model's expert all-to-all.
    rlgraph's runtime pads the step's batch to its longest response (tokens = rows x (prompt +
    E[max])), so every rank carries the same width, or with `micro_tokens` runs length-sorted
    passes each padded to its own longest (`lengths.sorted_pass_tokens`); a streamed version
    runs them per mini-batch call, over that call's rows (`streamed_calls`: a mini-batch's
    longest row pads, and sorts, only among its own); verl packs
    sequences (remove_padding: tokens = rows x (prompt + E[L]), attention over each sequence
    alone, so E[(P + L)^2]) and
    waits for the slowest data-parallel rank of each mini-batch, its driver moving the padded
    batch once (`driver_transfer`, `response_bytes` per response position beyond the inputs)
    however many `epochs` the passes repeat."""

    data = ctx.spec.data
    model = lengths.of(data.response_len)
    rows = data.samples_per_step()
    calls = streamed_calls(ctx)
    prompt = data.prompt_len
    if system_of(ctx.spec).packs_sequences:
        mean, second = lengths.moments(model)
        tokens, how = rows * (prompt + mean), "packed"
        square = rows * (prompt * prompt + 2 * prompt * mean + second)
        imbalance = data_parallel_imbalance(node, ctx, mini_batches)
    elif getattr(node, "micro_tokens", None):
        tokens, square = lengths.sorted_pass_tokens(model, rows // calls, prompt,
                                                    node.micro_tokens, PASS_WIDTH_BLOCK)
        tokens, square = tokens * calls, square * calls
        how, imbalance = f"length-sorted passes of {node.micro_tokens} tokens", 1.0
    else:
        longest = lengths.expected_max(model, rows // calls)
        tokens, how, imbalance = rows * (prompt + longest), "padded", 1.0
        square = rows * (prompt + longest) ** 2
    if calls > 1 and not system_of(ctx.spec).packs_sequences:
        how += f", in each of the version's {calls} streamed mini-batches"
    passes = flops_per_param / 2
    matmul = flops_per_param * ctx.shape.matmul_active * tokens
    attention = passes * ctx.shape.attention_flops(1.0) * square
    if runtime_pass_hbm(ctx) is not None:
        bias = bias_attention_seconds(ctx, square, flops_per_param > 2) \
            if padding_mask(ctx, model) else 0.0
        return runtime_pass_cost(node, ctx, flops_per_param,
                                 matmul + (0.0 if bias else attention), tokens, bias, how,
                                 mini_batches, epochs)
    mfu = efficiency(ctx, mfu) * moe_factor(ctx)
    peak = ctx.gpu.bf16_flops * mfu * compute_units(ctx)
    ctx.extra["detail"] = (f"{flops_per_param} x {ctx.shape.matmul_active:.3g} params x "
                           f"{tokens:.3g} tokens ({how}) + attention "
                           f"{attention / (matmul + attention):.0%} at {mfu:.0%} of "
                           f"{ctx.gpus} x {ctx.gpu.name}"
                           + (f", slowest DP rank {imbalance:.2f}x" if imbalance > 1.005
                              else ""))
    seconds = ((matmul + attention) / peak * pipeline_bubble(node, ctx, mini_batches)
               * imbalance
               * thread_slowdown(ctx))
    logits = logits_traffic(ctx, tokens, flops_per_param)
    if logits:
        seconds += logits
        ctx.extra["detail"] += f" + fp32 logits {logits:.3g} s"
    exchange = expert_all_to_all(node, ctx, tokens, passes)
    if exchange:
        ctx.extra["detail"] += f" + expert all-to-all {exchange:.3g} s"
    floor = host_floor(node, ctx, passes, mini_batches)
    ctx.extra["detail"] += f" + host floor {floor:.3g} s"
    driver = (driver_transfer(ctx, response_bytes) if system_of(ctx.spec).driver_transfer
              else 0.0)
    if driver:
        ctx.extra["detail"] += f" + {system_of(ctx.spec).name} driver transfer {driver:.3g} s"
    return (seconds + exchange + floor) * epochs + driver


def runtime_pass_cost(node: NodeSpec, ctx: CostContext, flops_per_param: int, flops: float,
                      tokens: float, bias: float, how: str, mini_batches: int,
                      epochs: int) -> float:
    """rlgraph's eager passes on GPUs: the device runs `flops` (matmuls, and attention where
    no mask pads the rows) at COSTS.gemm_efficiency of the group's peak (times the pipeline
    bubble), the padded rows' attention under the mask's bias (`bias`: seconds, from
    `bias_attention_seconds`), then the eager activation traffic and the fp32 log-prob head
    at HBM speed (and a MoE model's all-to-all), while the host launches them (`host_floor` at
    COSTS.eager_pass_host_seconds_per_layer); kernels run asynchronously, so a call lasts
    the longer of the two, plus the data-parallel replicas' dispatch and gradient sum. With
    `sharding: fsdp` the device also runs FSDP's collectives, overlapped with its compute
    (`pricing.sharding`)."""
    passes = flops_per_param / 2
    units = compute_units(ctx)
    compute = flops / (ctx.gpu.bf16_flops * COSTS.gemm_efficiency * units)
    bubble = pipeline_bubble(node, ctx, mini_batches)
    compute *= bubble
    terms = {"attention under the padding mask's bias": bias * bubble,
             "activations": eager_activation_traffic(ctx, tokens, passes),
             "fp32 logits": logits_traffic(ctx, tokens, flops_per_param),
             "expert all-to-all": expert_all_to_all(node, ctx, tokens, passes)}
    device = compute + sum(terms.values())
    collectives, exposed = fsdp_collectives(node, ctx, flops_per_param > 2, tokens,
                                            mini_batches)
    device = max(device, collectives) + exposed
    host = host_floor(node, ctx, passes, mini_batches, COSTS.eager_pass_host_seconds_per_layer)
    updates = mini_batches * epochs
    replicas = data_parallel_overhead(node, ctx, flops_per_param > 2, updates)
    ctx.extra["detail"] = (f"{flops_per_param} x {ctx.shape.matmul_active:.3g} params x "
                           f"{tokens:.3g} tokens ({how}) at {COSTS.gemm_efficiency:.0%} of "
                           f"{ctx.gpus} x {ctx.gpu.name} {compute:.3g} s"
                           + "".join(f" + {k} {v:.3g} s" for k, v in terms.items() if v)
                           + (f", FSDP all-gathers and reduce-scatters {collectives:.3g} s "
                              f"overlapped (+{exposed:.3g} s first gathers)" if collectives
                              else "")
                           + f" (device), host launches {host:.3g} s: the longer"
                           + (f" + replicas {replicas:.3g} s" if replicas else ""))
    return max(device, host) * epochs + replicas
