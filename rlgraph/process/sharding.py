"""`sharding: fsdp`: a group's data-parallel ranks hold the policy (and the reference) sharded
with torch's FSDP2 (`torch.distributed.fsdp.fully_shard`), as verl's `strategy: fsdp2` does.

Each decoder layer is one FSDP unit (its parameters all-gathered just before its forward and
its backward, freed after), the root holds the embeddings, final norm and head. Parameters,
gradients and AdamW states are fp32 and sharded over the group's processes; on GPUs the
layers compute in bf16 (`MixedPrecisionPolicy`: parameters cast to bf16 after the all-gather,
gradients reduce-scattered in fp32). FSDP averages gradients over the ranks; train scales
each rank's loss by the whole mini-batch's token count (as its replicated path does) and by
the rank count (`gradient_scale`: the average of the scaled ones is their sum; gloo has no
pre-multiplied sum), so every rank takes the step one process would.
With `activation_checkpointing` (sharded or not) each layer's forward runs under
non-reentrant `torch.utils.checkpoint` (its activations recomputed in the backward).

FSDP's all-gathers are collectives: every rank runs as many forwards (and backwards) as the
others, so a rank with fewer passes than the busiest runs extra ones that add nothing
(`even_passes`). Reading the whole weights (param_update, digests, checkpoints) gathers one
bucket of tensors at a time on the device (`gathered_buckets`): never the whole model on one
GPU; every rank of the group takes part in the same order.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

from rlgraph.errors import SpecError

CHECKPOINT_BUCKET_BYTES = 256 << 20  # gather size when a whole copy goes to the host


def sharded_models(spec: Any, tasks: list[str]) -> dict[str, bool]:
    """Which of the group's models its tasks shard: {"policy": ..., "reference": ...}. The
    policy's users (logp, train) must agree; the reference follows ref_logp."""
    models: dict[str, dict[str, str]] = {"policy": {}, "reference": {}}
    for task in tasks:
        node = spec.nodes[task]
        if not hasattr(node, "sharding"):  # generate: checked by the workspace
            continue
        for model in spec.kind_of(task).models:
            models[model][task] = getattr(node, "sharding", "none")
    chosen = {}
    for model, users in models.items():
        values = set(users.values())
        if len(values) > 1:
            first = next(t for t, v in users.items() if v == "fsdp")
            other = next(t for t, v in users.items() if v != "fsdp")
            raise SpecError(f"'{other}' shares the {model} with '{first}' but not its "
                            "sharding", ("nodes", other, "sharding"),
                            hint=f"give '{other}' sharding: fsdp too (or neither)")
        chosen[model] = values == {"fsdp"}
    return chosen


def check_group(spec: Any, tasks: list[str]) -> dict[str, bool]:
    """`sharded_models` of a group, refused where a task holds a sharded policy but runs no
    sequence passes (generate: the decode engine runs a whole model)."""
    sharded = sharded_models(spec, tasks)
    if not sharded["policy"]:
        return sharded
    decoding = [t for t in tasks if "policy" in spec.kind_of(t).models
                and not hasattr(spec.nodes[t], "sharding")]
    if decoding:
        user = next(t for t in tasks if getattr(spec.nodes[t], "sharding", "none") == "fsdp")
        raise SpecError(f"sharding: fsdp cannot share a group with '{decoding[0]}' (the "
                        "decode engine runs a whole model)", ("nodes", user, "sharding"),
                        hint="give generate its own group, or write sharding: none")
    return sharded


def checkpointing_of(spec: Any, tasks: list[str]) -> bool:
    """Whether any model task of the group asks for activation checkpointing."""
    return any(getattr(spec.nodes[t], "activation_checkpointing", False) for t in tasks)


def ensure_process_group(device: str) -> None:
    """A one-process default group when this process has none (a group of one replica):
    FSDP needs a mesh even when nothing is split."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if device != "cpu":
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if device != "cpu" else "gloo", store=dist.HashStore(),
                            rank=0, world_size=1)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a transformers causal LM (`model.model.layers`)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise SpecError(f"sharding: fsdp needs a transformers decoder (model.layers); "
                        f"{type(model).__name__} has none", ("model",),
                        hint="use sharding: none for this model")
    return list(layers)


def _attention_backends() -> list[Any]:
    """The scaled-dot-product-attention kernels enabled now (a caller's `sdpa_kernel`)."""
    from torch.nn.attention import SDPBackend

    flags = torch.backends.cuda
    enabled = {SDPBackend.FLASH_ATTENTION: flags.flash_sdp_enabled(),
               SDPBackend.EFFICIENT_ATTENTION: flags.mem_efficient_sdp_enabled(),
               SDPBackend.MATH: flags.math_sdp_enabled(),
               SDPBackend.CUDNN_ATTENTION: flags.cudnn_sdp_enabled()}
    return [backend for backend, on in enabled.items() if on]


def _checkpointed(forward: Any) -> Any:
    """`forward` with its activations recomputed in the backward, under the attention kernels
    its forward ran with (the backward runs outside the caller's `sdpa_kernel`, and another
    kernel saves other tensors)."""
    from torch.nn.attention import sdpa_kernel
    from torch.utils.checkpoint import checkpoint

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # decode and log-prob forwards: nothing to keep
            return forward(*args, **kwargs)
        backends = _attention_backends()

        def contexts() -> tuple[Any, Any]:
            return contextlib.nullcontext(), sdpa_kernel(backends)

        return checkpoint(forward, *args, use_reentrant=False, context_fn=contexts, **kwargs)

    return run


def checkpoint_layers(model: torch.nn.Module) -> None:
    """Every decoder layer of `model` recomputes its activations in the backward (in place;
    names and weights unchanged)."""
    for layer in decoder_layers(model):
        layer.forward = _checkpointed(layer.forward)


def shard(model: torch.nn.Module, device: str, checkpointing: bool = False) -> torch.nn.Module:
    """`model` (fp32, whole, on the host) sharded over the default process group, each decoder
    layer a unit; on GPUs it computes in bf16 and its shards move to the GPU layer by layer."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    ensure_process_group(device)
    kind = "cpu" if device == "cpu" else "cuda"
    mesh = init_device_mesh(kind, (dist.get_world_size(),))
    precision = (MixedPrecisionPolicy() if kind == "cpu" else
                 MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    model = model.float()
    if checkpointing:
        checkpoint_layers(model)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=precision)
    fully_shard(model, mesh=mesh, mp_policy=precision)
    return model


def gradient_scale() -> float:
    """What a sharded policy's loss is multiplied by so that FSDP's averaged gradients are
    the ranks' sum: the rank count."""
    import torch.distributed as dist

    return float(dist.get_world_size())


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a shard (a collective: every rank calls it), else itself."""
    gather = getattr(tensor, "full_tensor", None)
    return gather() if gather is not None else tensor


def gathered_buckets(model: torch.nn.Module, produce_bytes: int, dtype: torch.dtype
                     ) -> Iterator[dict[str, torch.Tensor]]:
    """The model's whole weights (state-dict names and order), `dtype`, one bucket of at most
    `produce_bytes` at a time (a larger tensor alone), gathered on the model's device. Every
    rank must iterate to the end, in step."""
    state = model.state_dict()
    bucket: list[str] = []
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * dtype.itemsize
        if bucket and size + nbytes > produce_bytes:
            yield {n: full_tensor(state[n]).to(dtype) for n in bucket}
            bucket, size = [], 0
        bucket.append(name)
        size += nbytes
    if bucket:
        yield {n: full_tensor(state[n]).to(dtype) for n in bucket}


def weight_specs(model: torch.nn.Module, dtype: torch.dtype
                 ) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(name, whole shape, dtype) of every tensor `gathered_buckets` yields, in its order."""
    return [(name, tuple(t.shape), dtype) for name, t in model.state_dict().items()]


def host_state(model: torch.nn.Module, dtype: torch.dtype | None = None
               ) -> dict[str, torch.Tensor]:
    """The whole weights on the host (checkpoints, digests), gathered a bucket at a time;
    `dtype` None keeps each tensor's own (fp32 masters)."""
    out: dict[str, torch.Tensor] = {}
    state = model.state_dict()
    for name, tensor in state.items():
        whole = full_tensor(tensor)
        out[name] = whole.detach().to("cpu", dtype or whole.dtype, copy=True)
        del whole
    return out


def load_whole(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load whole (host) weights into the sharded model: each rank keeps its shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


def even_passes(passes: list[tuple[torch.Tensor, int]], fill: tuple[torch.Tensor, int],
                device: Any) -> tuple[list[tuple[torch.Tensor, int]], int]:
    """`passes` padded to the busiest rank's count with copies of `fill` (a one-row pass whose
    result the caller ignores), and how many are real. Every rank calls it at once."""
    import torch.distributed as dist

    count = torch.tensor([len(passes)], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return passes + [fill] * (int(count) - len(passes)), len(passes)


def optimizer_shard(optimizer: torch.optim.Optimizer) -> dict:
    """This rank's optimizer state with its DTensors as local (host) shards, for a checkpoint."""
    state = optimizer.state_dict()

    def local(value: Any) -> Any:
        if hasattr(value, "to_local"):
            return value.to_local().detach().to("cpu", copy=True)
        if isinstance(value, torch.Tensor):
            return value.detach().to("cpu", copy=True)
        if isinstance(value, dict):
            return {k: local(v) for k, v in value.items()}
        return value

    return {"state": local(state["state"]), "param_groups": state["param_groups"]}


def load_optimizer_shard(optimizer: torch.optim.Optimizer, shard_state: dict) -> None:
    """Restore what `optimizer_shard` saved on this rank (its shards back as DTensors of the
    parameters' mesh and placements)."""
    from torch.distributed.tensor import DTensor

    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, entry in shard_state["state"].items():
        param = params[int(index)]
        state[index] = {
            k: (DTensor.from_local(v.to(param.device), param.device_mesh, param.placements,
                                   shape=param.shape, stride=param.stride())
                if isinstance(v, torch.Tensor) and v.dim() > 0 else v)
            for k, v in entry.items()}
    optimizer.load_state_dict({"state": state, "param_groups": shard_state["param_groups"]})
