"""`backend: megatron`: the policy / reference as a megatron-core GPTModel (tensor parallel).

`build_megatron_policy(config, state)` turns the transformers model the workspace built (same
seed, same warm start) into a GPTModel of megatron-core's local layer spec (no Transformer
Engine) with the same weights, wrapped so that it is called like the transformers policy:
`policy(input_ids=..., attention_mask=..., logits_to_keep=k).logits`, hence
`engines.cpu_decode.token_logp` works unchanged. Its `state_dict()` / `load_state_dict()` speak
the transformers layout (tensor-parallel shards gathered), so weight sync to the generate
engine, digests, checkpoints and warm starts do not change.

Two parts of the local spec are replaced because they only run on CUDA and are slower than
torch's own: core attention is torch's scaled_dot_product_attention (flash / memory-efficient
kernels on GPU, GQA native), and off CUDA the rotary table stays on the parameters' device.
megatron-core's RoPE ignores position ids (position = index in the row), so the wrapper moves
each row's real tokens to the front (positions then equal transformers' `cumsum(mask) - 1`),
runs causal attention without a padding mask, and puts the logits back in place.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from rlgraph.backends.megatron_layout import (
    MegatronLayout,
    hf_to_megatron,
    layout_of,
    megatron_to_hf,
    merge_tp,
    split_tp,
)
from rlgraph.errors import SpecError


def megatron_missing() -> str | None:
    """Why megatron-core cannot be used here (None when it imports)."""
    try:
        with warnings.catch_warnings():  # it warns that Apex / Transformer Engine are absent
            warnings.simplefilter("ignore")
            from megatron.core.models.gpt import GPTModel  # noqa: F401
    except Exception as exc:  # ImportError, or a missing optional dependency such as triton
        return f"megatron-core does not import: {type(exc).__name__}: {exc}"
    return None


def init_parallel(tp: int = 1, pp: int = 1, ep: int = 1) -> None:
    """Megatron's process groups for tp x pp (x ep); a one-process world when this process has
    no default group and no torchrun environment."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        if "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        else:
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                                    store=dist.HashStore(), rank=0, world_size=1)
    if parallel_state.model_parallel_is_initialized():
        have = (parallel_state.get_tensor_model_parallel_world_size(),
                parallel_state.get_pipeline_model_parallel_world_size())
        if have != (tp, pp):
            raise SpecError(f"this process already runs megatron with tp, pp = {have}, "
                            f"not {(tp, pp)}", ("nodes",),
                            hint="give logp, ref_logp and train of one group the same tp/pp")
        return
    if dist.get_world_size() % (tp * pp):
        raise SpecError(f"tp * pp = {tp * pp} does not divide the {dist.get_world_size()} "
                        "processes of this group", ("nodes",), hint="match tp * pp to the GPUs")
    parallel_state.initialize_model_parallel(tp, pp, expert_model_parallel_size=ep)
    if torch.cuda.is_available():
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(0)


def transformer_config(lay: MegatronLayout, dtype: torch.dtype, tp: int = 1, pp: int = 1,
                       ep: int = 1) -> Any:
    """megatron-core's TransformerConfig of a layout: RMSNorm, SwiGLU, GQA, no dropout, no
    fused CUDA kernels, weights made on the host and not initialised (they are loaded)."""
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=lay.layers, hidden_size=lay.hidden, num_attention_heads=lay.heads,
        num_query_groups=lay.kv_heads, kv_channels=lay.head_dim, ffn_hidden_size=lay.ffn,
        normalization="RMSNorm", layernorm_epsilon=lay.norm_eps, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, add_qkv_bias=lay.qkv_bias,
        qk_layernorm=lay.qk_norm, hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        expert_model_parallel_size=ep, params_dtype=dtype, pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16, use_cpu_initialization=True,
        perform_initialization=False, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        persist_layer_norm=False)


class SdpaAttention(torch.nn.Module):
    """Core attention by torch's scaled_dot_product_attention, causal, GQA; megatron-core's
    interface: q [sq, b, heads, d], k and v [sk, b, groups, d] -> [sq, b, heads * d]."""

    def __init__(self, config: Any, layer_number: int, attn_mask_type: Any,
                 attention_type: str, softmax_scale: float | None = None, **_: Any):
        super().__init__()
        self.scale = softmax_scale

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, *_: Any, **__: Any) -> torch.Tensor:
        """Causal attention over the whole row (the wrapper has moved padding to the end)."""
        if attention_mask is not None:
            raise ValueError("SdpaAttention is causal only; pass attention_mask=None")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.scale, enable_gqa=k.shape[1] != q.shape[1])
        return out.permute(2, 0, 1, 3).flatten(2)


def _host_rotary(kv_channels: int, base: float) -> torch.nn.Module:
    """megatron-core's RotaryEmbedding whose table stays on the device of its frequencies
    (the stock one moves them to CUDA on first use)."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    class HostRotaryEmbedding(RotaryEmbedding):
        def get_emb(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
            freqs = self.get_freqs_non_repeated(max_seq_len, offset)
            return torch.cat((freqs, freqs), dim=-1)[:, None, None, :]

    return HostRotaryEmbedding(kv_channels, 1.0, rotary_base=base, use_cpu_initialization=True)


@dataclass
class LogitsOutput:
    """What the wrapper returns: the `.logits` of a transformers causal-LM output."""

    logits: torch.Tensor


class MegatronPolicy(torch.nn.Module):
    """A megatron-core GPTModel called like a transformers causal LM; its state dict is in the
    transformers layout (see the module docstring)."""

    def __init__(self, gpt: torch.nn.Module, config: Any, lay: MegatronLayout,
                 build: dict[str, Any]):
        super().__init__()
        self.gpt, self.config, self.layout, self.build = gpt, config, lay, build
        self.tp = int(build["tp"])
        self.dtypes: dict[str, torch.dtype] = {}  # the transformers layout's, from load

    def __deepcopy__(self, memo: dict) -> MegatronPolicy:
        """A second policy with a copy of these weights (process groups cannot be copied,
        so it is built anew), e.g. the frozen reference next to the trained policy."""
        device = next(self.parameters()).device
        twin = build_megatron_policy(self.config, self.state_dict(),
                                     **{**self.build, "device": device})
        twin.train(self.training)
        for mine, theirs in zip(self.parameters(), twin.parameters()):
            theirs.requires_grad_(mine.requires_grad)
        return twin

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, logits_to_keep: int = 0,
                **_: Any) -> LogitsOutput:
        """Logits [B, S or logits_to_keep, vocab]; positions follow `attention_mask` (left or
        inner padding skipped, as transformers' `cumsum(mask) - 1`), `position_ids` unused."""
        if attention_mask is None or bool(attention_mask.all()):
            order = None
            ids = input_ids
        else:  # real tokens first, each row in its order; pads after them (causal: unseen)
            order = torch.argsort((attention_mask == 0).to(torch.int8), dim=1, stable=True)
            ids = input_ids.gather(1, order)
        pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        logits = self.gpt(ids, pos, None)
        if order is not None:
            where = torch.argsort(order, dim=1)  # original position -> compacted position
            if logits_to_keep:
                where = where[:, -logits_to_keep:]
            logits = logits.gather(1, where[..., None].expand(-1, -1, logits.shape[-1]))
        elif logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return LogitsOutput(logits[..., :self.layout.vocab])

    def megatron_state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's megatron tensors (no `_extra_state` entries)."""
        return {k: v for k, v in self.gpt.state_dict().items() if isinstance(v, torch.Tensor)}

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        """The weights in the transformers layout, tensor-parallel shards gathered (every rank
        of the tp group must call it); fresh tensors, not views of the parameters."""
        local = {k: v.detach() for k, v in self.megatron_state_dict().items()}
        state = megatron_to_hf(merge_tp(_gather_tp(local, self.tp)), self.layout)
        # megatron keeps some weights (norms) in fp32: send them as the receiver holds them
        return {k: v.to(self.dtypes.get(k, v.dtype)) for k, v in state.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor], strict: bool = True,  # type: ignore[override]
                        assign: bool = False) -> Any:
        """Load transformers-layout weights (this rank takes its shard)."""
        self.dtypes = {k: v.dtype for k, v in state.items()}
        shard = split_tp(hf_to_megatron(state, self.layout), self.tp)[_tp_rank(self.tp)]
        missing = set(self.megatron_state_dict()) - set(shard)
        if missing:
            raise KeyError(f"no tensors for {sorted(missing)[:3]}")
        with torch.no_grad():
            for name, tensor in self.megatron_state_dict().items():
                tensor.copy_(shard[name])
        return None

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """`clip_grad_norm_` over the whole model: with tp > 1 the squared norms of sharded
        gradients are summed over the tp group, replicated ones (norm weights) counted once."""
        params = [p for p in self.parameters() if p.grad is not None]
        if self.tp == 1:
            return torch.nn.utils.clip_grad_norm_(params, max_norm)
        import torch.distributed as dist
        from megatron.core import parallel_state

        sharded = [p.grad for p in params if getattr(p, "tensor_model_parallel", False)]
        replicated = [p.grad for p in params if not getattr(p, "tensor_model_parallel", False)]
        squares = torch.nn.utils.get_total_norm(sharded).float() ** 2
        dist.all_reduce(squares, group=parallel_state.get_tensor_model_parallel_group())
        norm = (squares + torch.nn.utils.get_total_norm(replicated).float() ** 2).sqrt()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return norm


def _tp_rank(tp: int) -> int:
    if tp == 1:
        return 0
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_rank()


def _gather_tp(local: dict[str, torch.Tensor], tp: int) -> list[dict[str, torch.Tensor]]:
    """Every tp rank's shard of `local` (all ranks of the tp group call this)."""
    if tp == 1:
        return [local]
    import torch.distributed as dist
    from megatron.core import parallel_state

    group = parallel_state.get_tensor_model_parallel_group()
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(tp)]
    for name, t in local.items():
        parts = [torch.empty_like(t) for _ in range(tp)]
        dist.all_gather(parts, t.contiguous(), group=group)
        for shard, part in zip(shards, parts):
            shard[name] = part
    return shards


def for_group(model: torch.nn.Module, spec: Any, tasks: list[str],
              device: str | torch.device) -> torch.nn.Module:
    """`model` as the group's model nodes run it: unchanged for `backend: torch`, converted
    to a MegatronPolicy when they say `backend: megatron` (then they must agree on tp, pp and
    ep, and the group must not generate: the native engine needs the transformers model)."""
    # the model nodes are those with a `backend` field (rlgraph.nodes.parallel_spec)
    nodes = {t: spec.nodes[t] for t in tasks if hasattr(spec.nodes[t], "backend")}
    chosen = {t: n for t, n in nodes.items() if n.backend == "megatron"}
    if not chosen:
        return model
    name, first = next(iter(chosen.items()))
    for other, node in nodes.items():
        if (node.backend, node.tp, node.pp, node.ep) != ("megatron", first.tp, first.pp,
                                                          first.ep):
            raise SpecError(f"'{other}' shares a group (and the model) with '{name}' but not "
                            "its backend / tp / pp / ep", ("nodes", other),
                            hint=f"give it backend: megatron, tp: {first.tp}, pp: {first.pp}, "
                            f"ep: {first.ep}")
    # a task that holds the policy but cannot run it through a backend (generate: the native
    # engine needs the transformers model)
    generate = [t for t in tasks if "policy" in spec.kind_of(t).models and t not in nodes]
    if generate:
        raise SpecError(f"backend megatron cannot share a group with '{generate[0]}'",
                        ("nodes", name, "backend"),
                        hint="give generate its own group, or use backend: torch here")
    return build_megatron_policy(model.config, model.state_dict(), tp=first.tp, pp=first.pp,
                                 ep=first.ep, device=device).train(model.training)


def build_megatron_policy(config: Any, state: dict[str, torch.Tensor], tp: int = 1,
                          pp: int = 1, ep: int = 1, device: str | torch.device = "cpu",
                          attention: str = "sdpa") -> MegatronPolicy:
    """A MegatronPolicy of transformers `config` holding the transformers-layout weights
    `state` (e.g. `hf_model.state_dict()`), in their dtype, on `device`. `attention="local"`
    keeps megatron-core's own core attention (CUDA only)."""
    reason = megatron_missing()
    if reason:
        raise SpecError(reason, ("nodes",), hint="pip install 'rlgraph[megatron]' or use "
                        "backend: torch")
    if pp > 1:
        raise SpecError(f"backend megatron runs pp=1 only (got pp={pp})", ("nodes",),
                        hint="use tp for model parallelism")
    if ep > 1 and not getattr(config, "num_experts", None):
        raise SpecError(f"ep={ep} needs a mixture-of-experts model; this one is dense",
                        ("nodes",), hint="set ep: 1")
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    lay = layout_of(config, tp)
    dtype = state["model.embed_tokens.weight"].dtype
    init_parallel(tp, pp, ep)
    spec = get_gpt_layer_local_spec(qk_layernorm=lay.qk_norm, normalization="RMSNorm")
    if attention == "sdpa":
        attn = spec.submodules.self_attention
        attn_sub = dataclasses.replace(attn.submodules, core_attention=SdpaAttention)
        spec = dataclasses.replace(spec, submodules=dataclasses.replace(
            spec.submodules, self_attention=dataclasses.replace(attn, submodules=attn_sub)))
    gpt = GPTModel(transformer_config(lay, dtype, tp, pp, ep), spec,
                   vocab_size=lay.padded_vocab,
                   max_sequence_length=int(getattr(config, "max_position_embeddings", 4096)),
                   parallel_output=False, share_embeddings_and_output_weights=lay.tied,
                   position_embedding_type="rope", rotary_base=lay.rope_theta)
    if torch.device(device).type != "cuda":
        gpt.rotary_pos_emb = _host_rotary(lay.head_dim, lay.rope_theta)
    build = {"tp": tp, "pp": pp, "ep": ep, "attention": attention}
    policy = MegatronPolicy(gpt, config, lay, build)
    policy.load_state_dict(state)
    return policy.to(device)
