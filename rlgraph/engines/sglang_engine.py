"""`engine: sglang`: the generate node over sglang's offline `Engine` (in-process, no HTTP).

Written against sglang's offline Engine API (`sglang.Engine`, python/sglang/srt/entrypoints/
engine.py): `generate(input_ids=..., sampling_params=..., return_logprob=True)`,
`update_weights_from_tensor` (tensors on this GPU, handed over by CUDA IPC),
`release_memory_occupation` / `resume_memory_occupation` (colocated train and generate), and
pause / continue generation through its tokenizer manager (partial rollout: `mode="retract"`
returns running requests to the queue, KV recomputed on continue).

Weights move in with `load_tensors` (the policy's tensors on this GPU).

sglang is optional (`pip install rlgraph[sglang]`) and needs a CUDA GPU; constructing the
adapter without it raises MissingDependencyError. Importing this module never imports sglang.

In `rlgraph run`, a generate node with `engine: sglang` decodes on this adapter
(`SGLangRollout`: sglang loads the policy's weights whenever its version changed, then samples
the step's batch), or the run is refused before anything starts, in one line naming the key
(`refuse_unrunnable`): where sglang is not installed, on a local CPU cluster, and for what
the adapter does not run (partial rollout, streaming, forced lengths, tp > 1 in one replica).
`python tools/check_sglang_api.py` checks every call here against sglang's released wheel.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rlgraph.errors import MissingDependencyError, SpecError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from rlgraph.config.schema import Spec
    from rlgraph.engines.cpu_decode import Rollout


def require_sglang() -> Any:
    """Import sglang or raise MissingDependencyError saying how to get it."""
    try:
        return importlib.import_module("sglang")
    except ImportError as err:
        raise MissingDependencyError(
            f"engine: sglang needs the sglang package, which is not installed ({err}); "
            "install it with `pip install rlgraph[sglang]` on a CUDA machine, or use "
            "engine: native") from err


def refuse_unrunnable(spec: Spec) -> None:
    """A SpecError naming the key where a generate node asks for `engine: sglang` and this
    machine or this plan cannot run it; nothing where every engine the plan names can run."""
    for name, node in spec.nodes.items():
        if getattr(node, "engine", "native") != "sglang":
            continue
        problem, key, hint = None, "engine", "write engine: native"
        if spec.cluster.local:
            problem = "sglang decodes on CUDA GPUs, and this plan runs on local CPU slots"
        elif spec.schedule.partial_rollout or spec.schedule.stream is not None:
            problem = ("the sglang adapter samples whole synchronous batches; partial rollout "
                       "and streaming run on engine native")
        elif getattr(node, "forced_lengths", False):
            problem, key = "forced_lengths is a mode of engine native", "forced_lengths"
            hint = "write forced_lengths: false"
        elif getattr(node, "tp", 1) > 1:
            problem, key = ("each generate replica holds one GPU in this runtime, so an sglang "
                            "engine cannot span tp > 1 of them"), "tp"
            hint = "write tp: 1"
        else:
            try:
                require_sglang()
            except MissingDependencyError as err:
                problem = f"the sglang package is not installed here ({err.__cause__})"
                hint = "pip install 'rlgraph[sglang]' on a CUDA machine, or write engine: native"
        if problem:
            err = SpecError(f"engine: sglang cannot run: {problem}", ("nodes", name, key), hint)
            err.source = spec.source
            raise err


class SGLangEngine:
    """One sglang Engine (one generate replica, `tp` GPUs) with rlgraph's generate contract."""

    def __init__(self, model_path: str, *, tp: int = 1, dtype: str = "bfloat16",
                 mem_fraction_static: float = 0.8, enable_memory_saver: bool = True,
                 seed: int = 0, **server_args: Any):
        sgl = require_sglang()
        self.engine = sgl.Engine(
            model_path=model_path, tp_size=tp, dtype=dtype,
            mem_fraction_static=mem_fraction_static,
            enable_memory_saver=enable_memory_saver, random_seed=seed, **server_args)
        self.policy_version = 0

    # ---------------------------------------------------------------- generate

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0,
                 stop_token_ids: Iterable[int] | None = None) -> list[dict[str, Any]]:
        """Sample one response per prompt (token ids in, token ids + log-probs out).

        Each result: {"tokens", "logprobs", "version", "finish_reason"}; finish_reason is
        sglang's ("stop", "length", or "abort" for a request cut off by `pause("abort")`).
        """
        params = {"max_new_tokens": max_new_tokens, "temperature": temperature,
                  "top_p": top_p}
        if stop_token_ids is not None:
            params["stop_token_ids"] = list(stop_token_ids)
        outs = self.engine.generate(input_ids=[list(p) for p in prompts],
                                    sampling_params=params, return_logprob=True)
        return [self._result(o) for o in (outs if isinstance(outs, list) else [outs])]

    def _result(self, out: dict[str, Any]) -> dict[str, Any]:
        meta = out.get("meta_info", {})
        # output_token_logprobs: [(logprob, token_id, text-or-None), ...]
        pairs = meta.get("output_token_logprobs") or []
        tokens = out.get("output_ids") or [int(p[1]) for p in pairs]
        reason = meta.get("finish_reason")
        if isinstance(reason, dict):
            reason = reason.get("type")
        return {"tokens": list(tokens), "logprobs": [float(p[0]) for p in pairs],
                "version": self.policy_version, "finish_reason": reason}

    # ---------------------------------------------------------------- pause / continue

    def pause(self, mode: str = "retract") -> None:
        """Stop generating: "abort" returns running requests cut off, "retract" requeues them
        (KV recomputed under the new weights on continue), "in_place" keeps their KV."""
        engine = self.engine
        if hasattr(engine, "pause_generation"):
            engine.pause_generation(mode=mode)
            return
        io = importlib.import_module("sglang.srt.managers.io_struct")
        tm = engine.tokenizer_manager
        engine.loop.run_until_complete(tm.pause_generation(io.PauseGenerationReqInput(mode=mode)))

    def resume(self) -> None:
        """Continue generating after `pause`."""
        engine = self.engine
        if hasattr(engine, "continue_generation"):
            engine.continue_generation()
            return
        io = importlib.import_module("sglang.srt.managers.io_struct")
        tm = engine.tokenizer_manager
        engine.loop.run_until_complete(tm.continue_generation(io.ContinueGenerationReqInput()))

    # ---------------------------------------------------------------- memory

    def release_memory(self, tags: list[str] | None = None) -> None:
        """Free weights and KV cache (e.g. while train runs on these GPUs); `tags` narrows it
        to "weights" or "kv_cache"."""
        self.engine.release_memory_occupation(tags=tags)

    def resume_memory(self, tags: list[str] | None = None) -> None:
        """Take the memory back (same virtual addresses, so captured graphs stay valid)."""
        self.engine.resume_memory_occupation(tags=tags)

    # ---------------------------------------------------------------- weights

    def load_tensors(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load tensors that live on this GPU (CUDA IPC into sglang's scheduler)."""
        ok, msg = _ok(self.engine.update_weights_from_tensor(list(named), flush_cache=True))
        if not ok:
            raise RuntimeError(f"sglang failed to load weights version {version}: {msg}")
        self.policy_version = version

    def shutdown(self) -> None:
        """Stop sglang's scheduler and detokenizer processes."""
        self.engine.shutdown()


class SGLangRollout:
    """generate's synchronous batch on an SGLangEngine: before sampling, sglang loads the
    policy's weights whenever their version changed since it last did (CUDA IPC, tensors on
    this GPU), so every token is sampled by the version it is tagged with."""

    def __init__(self, policy: Any, *, seed: int, eos_id: int, **server_args: Any):
        import tempfile

        self.folder = tempfile.mkdtemp(prefix="rlgraph-sglang-")
        policy.save_pretrained(self.folder)  # architecture and initial weights for sglang
        self.adapter = SGLangEngine(self.folder, seed=seed, skip_tokenizer_init=True,
                                   **server_args)
        self.eos_id, self.loaded = eos_id, None

    def sample(self, policy: Any, version: int, prompts: list[list[int]], *,
               max_new_tokens: int, temperature: float, top_p: float, pad_id: int) -> Rollout:
        """One response per prompt, sampled by `policy` at `version`, in the batch layout."""
        from rlgraph.engines.cpu_decode import pack

        if self.loaded != version:
            self.adapter.load_tensors(((n, t.detach()) for n, t in policy.state_dict().items()),
                                     version)
            self.loaded = version
        outs = self.adapter.generate(prompts, max_new_tokens, temperature, top_p,
                                    stop_token_ids=[self.eos_id])
        tokens = [o["tokens"] for o in outs]
        return pack(prompts, tokens, [o["logprobs"] for o in outs],
                    [[version] * len(t) for t in tokens], pad_id)

    def shutdown(self) -> None:
        """Stop sglang's processes."""
        self.adapter.shutdown()


def _ok(result: Any) -> tuple[bool, str]:
    """sglang answers (success, message) tuples, or a dict with those keys, by version."""
    if isinstance(result, tuple) and result:
        return bool(result[0]), str(result[1]) if len(result) > 1 else ""
    if isinstance(result, dict):
        return bool(result.get("success", True)), str(result.get("message", ""))
    return True, ""
