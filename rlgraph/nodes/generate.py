"""`generate`: sample responses for the step's prompts with the current policy."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from rlgraph.nodes.base import CostContext, NodeKind, NodeSpec, no_inputs
from rlgraph.presets import COSTS

if TYPE_CHECKING:
    from rlgraph.batch import Batch
    from rlgraph.workspace import Workspace


class GenerateSpec(NodeSpec):
    """Rollout engine settings (verl: actor_rollout_ref.rollout.*)."""

    kind: Literal["generate"] = "generate"
    engine: Literal["native", "sglang"] = "native"
    tp: int = Field(default=1, ge=1, description="tensor-parallel size of one engine replica")
    temperature: float = Field(default=1.0, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1)

    def model_parallel(self) -> int:
        """GPUs one engine replica spans."""
        return self.tp


def generate_cost(node: NodeSpec, ctx: CostContext) -> float:
    """Prefill (compute-bound, 2*N*prompt tokens) plus decode (memory-bound: a step reads the
    weights and the live KV cache once, so it is nearly flat in batch). A synchronous batch
    decodes until its longest response ends (response_len.max steps); when the KV cache
    holds only C of a replica's n sequences, continuous batching streams them through it
    (n * mean / C steps) and still pays the tail (max - mean). Partial rollout keeps the
    batch full and carries unfinished samples over, so it pays n * mean / C steps only."""
    data, shape, gpu = ctx.spec.data, ctx.shape, ctx.gpu
    tp = node.tp
    batch = data.samples_per_step()
    replicas = max(1, ctx.gpus // tp)
    per_replica = math.ceil(batch / replicas)
    prefill = (2 * shape.active_params * batch * data.prompt_len
               / (gpu.bf16_flops * COSTS.prefill_mfu * ctx.gpus))
    weights = 2 * shape.params / tp  # bytes per GPU, read once per decode step
    kv_token = shape.kv_bytes_per_token() / tp
    mean, longest = data.response_len.mean, data.response_len.max
    free = gpu.memory_bytes * COSTS.usable_memory_fraction - weights
    seq_kv = kv_token * (data.prompt_len + mean)  # paged KV of a live sequence, on average
    concurrent = per_replica if free <= 0 else max(1, min(per_replica, int(free // seq_kv)))
    if ctx.spec.schedule.partial_rollout:
        steps = per_replica * mean / concurrent
        how = "partial rollout keeps the batch full: mean length"
    elif concurrent < per_replica:
        steps = per_replica * mean / concurrent + longest - mean
        how = "synchronous batch streamed through the KV cache, then its longest tail"
    else:
        steps = longest
        how = "synchronous batch: its longest response"
    kv_reads = per_replica * mean * (data.prompt_len + mean / 2) * kv_token
    bandwidth = gpu.hbm_bytes_per_s * COSTS.decode_hbm_efficiency
    per_layer = (COSTS.native_decode_overhead_per_layer_s if node.engine == "native"
                 else COSTS.sglang_decode_overhead_per_layer_s)
    decode = (steps * weights + kv_reads) / bandwidth + steps * per_layer * shape.layers
    waves = "" if concurrent >= per_replica else f"; KV holds {concurrent}/{per_replica}"
    ctx.extra["detail"] = (f"prefill {prefill:.3g} s + decode {steps:.0f} steps x "
                           f"{decode / max(steps, 1e-12) * 1e3:.3g} ms ({how}{waves})")
    if concurrent < per_replica:
        ctx.extra["note"] = (f"{ctx.name}: the KV cache holds {concurrent} of the {per_replica} "
                             f"sequences of each replica at a time; more GPUs (share) or a "
                             f"larger tp would decode them together")
    return prefill + decode


KIND = NodeKind(
    name="generate",
    spec=GenerateSpec,
    cost=generate_cost,
    uses_gpu=True,
    default_edges=no_inputs,
    worker="rlgraph.nodes.generate:GenerateWorker",
    doc="sample responses with the current policy",
)


class GenerateWorker:
    """Samples `samples_per_prompt` responses to each prompt of the step with the policy,
    recording every token's behaviour log-prob and the policy version that sampled it."""

    def __init__(self, name: str, node: GenerateSpec, workspace: Workspace):
        from rlgraph.data import DataSource

        self.name, self.node, self.ws = name, node, workspace
        self.data = DataSource(workspace.spec.data, "train", workspace.base_dir)

    def prompts(self, step: int) -> tuple[list[Any], list[list[int]]]:
        """The step's examples and their token ids; a prompt longer than prompt_len is refused."""
        from rlgraph.errors import SpecError

        examples = self.data.batch(step)
        ids = [self.ws.tokenizer.encode_prompt(ex.prompt) for ex in examples]
        limit = self.ws.spec.data.prompt_len
        for ex, p in zip(examples, ids):
            if len(p) > limit:
                raise SpecError(f"prompt {ex.uid} has {len(p)} tokens, more than prompt_len "
                                f"{limit}", ("data", "prompt_len"), hint=f"raise it to {len(p)}")
        return examples, ids

    def run(self, step: int, inputs: dict[str, Batch] | None = None) -> Batch:
        """Sample the batch of train step `step` (prompts deterministic in (seed, step))."""
        import torch

        from rlgraph.sampling import sample

        data, tok = self.ws.spec.data, self.ws.tokenizer
        examples, ids = self.prompts(step)
        n = data.samples_per_prompt
        rows = [ex for ex in examples for _ in range(n)]
        with self.ws.lock, torch.no_grad():
            version = self.ws.policy_version
            rollout = sample(self.ws.policy, [p for p in ids for _ in range(n)],
                             max_new_tokens=data.response_len.max, eos_id=tok.eos_id,
                             pad_id=tok.pad_id, policy_version=version,
                             temperature=self.node.temperature, top_p=self.node.top_p,
                             generator=self.ws.generator(self.name, step))
        responses = rollout.responses.tolist()
        return {
            "step": step,
            "policy_version": version,
            "temperature": self.node.temperature,
            "prompt_uid": [ex.uid for ex in rows],
            "data_position": [step * data.prompts_per_step + i // n for i in range(len(rows))],
            "group": torch.arange(len(examples)).repeat_interleave(n),
            "prompt": [ex.prompt for ex in rows],
            "data_source": [ex.data_source for ex in rows],
            "ground_truth": [ex.ground_truth for ex in rows],
            "extra_info": [ex.extra_info for ex in rows],
            "response_text": [tok.decode(r) for r in responses],
            "sequences": rollout.sequences.cpu(),
            "attention_mask": rollout.attention_mask.cpu(),
            "prompt_len": rollout.prompt_len,
            "response_mask": rollout.response_mask.cpu(),
            "behavior_logp": rollout.behavior_logp.cpu(),
            "token_version": rollout.token_version.cpu(),
        }
