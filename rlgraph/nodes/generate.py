"""`generate`: sample responses for the step's prompts with the current policy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from rlgraph.envs.spec import EnvSpec
from rlgraph.nodes.base import MAX_PARALLEL, MAX_TOKENS, NodeKind, NodeSpec, no_inputs
from rlgraph.pricing.sampling import algorithm_generate_cost

if TYPE_CHECKING:
    from rlgraph.process.workspace import Workspace
    from rlgraph.rl.batch import Batch


class GenerateSpec(NodeSpec):
    """Rollout engine settings (verl: actor_rollout_ref.rollout.*)."""

    kind: Literal["generate"] = "generate"
    engine: Literal["native", "sglang"] = "native"
    tp: int = Field(default=1, ge=1, le=MAX_PARALLEL,
                    description="tensor-parallel size of one engine replica")
    temperature: float = Field(default=1.0, ge=1e-3, le=100)
    top_p: float = Field(default=1.0, ge=1e-6, le=1)
    oversample: float = Field(default=2.0, ge=1, le=64,
                              description="partial rollout: prompt groups "
                              "in flight per prompt of a batch (supplementation)")
    stale: Literal["drop", "restart", "finish"] = Field(
        default="drop", description="partial rollout: a cached sample whose oldest token would "
        "exceed max_lag is dropped with its group, or restarted from no tokens; finish: a "
        "round does not end while a group that would go stale is open (no length bias)")
    forced_lengths: bool = Field(
        default=False, description="benchmark mode (rlgraph/bench_mode.py): each sample's "
        "response length is drawn "
        "from data.response_len (seeded by data position and sample) and eos is ignored "
        "until it, as serving benchmarks do (a random-init model stops anywhere)")
    inflight: bool = Field(
        default=False, description="in-flight weight updates (with schedule.partial_rollout "
        "or schedule.stream): a staged policy version is swapped in between two decode steps "
        "and decoding goes on; unfinished rows keep their slot across calls and finished rows "
        "are refilled inside the call (engines/inflight.py); with env, each trajectory keeps "
        "its slot and KV across calls and swaps (envs/engine_round.py)")
    kv: Literal["keep", "recompute"] = Field(
        default="keep", description="inflight: at a version change rows keep their KV cache "
        "(keep), or re-encode it under the new weights (recompute: the exact behaviour policy)")
    memory_fraction: float | None = Field(
        default=None, ge=0.05, le=1.0, description="engine sglang: the share of each GPU's "
        "memory the engine takes for its weights and KV cache (SGLang's mem_fraction_static, "
        "vLLM's gpu_memory_utilization: NeMo-RL 0.6 where vLLM shares the GPUs with "
        "training); none: SGLang's 0.8 when rlgraph runs it, 0.9 when priced")
    sync_every: int = Field(default=8, ge=1, le=MAX_TOKENS, description="static engine: "
                            "decode steps between the host's checks for finished rows")
    cuda_decode: Literal["compiled", "graphs", "dynamic"] = Field(
        default="compiled", description="engine native on a GPU: the static decoder "
        "(rlgraph.engines.static_decode) run through torch.compile and CUDA graphs, CUDA graphs "
        "only (no compile warm-up), or transformers' dynamic KV cache (as on CPU); a multi-turn "
        "node (env) defaults to graphs")
    env: EnvSpec | None = Field(
        default=None, description="multi-turn rollout: an environment the policy acts in "
        "(docs/how-to/agentic-rollouts.md); each trajectory keeps its KV cache across turns "
        "(engines/turn_decode.py; cuda_decode: dynamic re-encodes it every turn instead)")

    @model_validator(mode="before")
    @classmethod
    def _env_decodes_on_graphs(cls, data: Any) -> Any:
        """A multi-turn node decodes on the turn engine with CUDA graphs, uncompiled (each
        observation's prefill is eager; no compile warm-up): its default `cuda_decode`."""
        if isinstance(data, dict) and data.get("env") is not None and "cuda_decode" not in data:
            data = {**data, "cuda_decode": "graphs"}
        return data

    @model_validator(mode="after")
    def _env_engine(self) -> GenerateSpec:
        if self.env is not None and self.engine != "native":
            raise ValueError("env: multi-turn rollouts run on engine native (remove "
                             "engine: sglang)")
        if self.env is not None and self.inflight and self.cuda_decode == "dynamic":
            raise ValueError("inflight: multi-turn rollouts keep their KV across calls on the "
                             "turn engine, which cuda_decode: dynamic replaces (turns "
                             "re-encoded in waves); remove one of them")
        return self

    def model_parallel(self) -> int:
        """GPUs one engine replica spans."""
        return self.tp


def use_static_engine(node: GenerateSpec, device: str) -> bool:
    """Whether generate decodes with the static decoder: engine native on a CUDA device (the
    synchronous batch and partial rollout's rounds alike); a multi-turn node (`env`) has its
    own engine (`GenerateWorker._turn_engine`)."""
    return (node.engine == "native" and node.cuda_decode != "dynamic" and node.env is None
            and device.split(":")[0] == "cuda")


KIND = NodeKind(
    name="generate",
    spec=GenerateSpec,
    cost=algorithm_generate_cost,
    uses_gpu=True,
    default_edges=no_inputs,
    worker="rlgraph.nodes.generate:GenerateWorker",
    samples=True,
    colour="#59a14f",
    doc="sample responses with the current policy",
    models=frozenset({"policy"}),
)


class GenerateWorker:
    """Samples `samples_per_prompt` responses to each prompt of the step with the policy,
    recording every token's behaviour log-prob and the policy version that sampled it. With
    `schedule.partial_rollout` the batch comes from a rollout cache (engines/partial_rollout.py):
    unfinished samples carry over to later steps, new prompts keep the batch full. With
    `schedule.stream` the same cache emits one mini-batch of complete groups per call and
    keeps the whole batch's groups in flight (continuous batching). On a CUDA
    device both decode with the static decoder (rlgraph.engines.static_rollout, `cuda_decode`);
    on CPU through `sampling.Decoder`. Among a group's replicas each samples its `share` of
    every step's prompts (and keeps its own rollout cache).

    Streaming in a group that also trains (colocated): train updates the policy in place at
    every mini-batch, so the engine samples from `snapshot`, a second copy of the policy on
    the same device, refreshed in place (`refresh_snapshot`) by the group's param_update once
    per version: every token is sampled by exactly the version it is tagged with."""

    SNAPSHOTS = 8  # cache states kept by step, for a checkpoint taken while generate runs on
    DATA_PARALLEL = "whole"  # each replica samples its own share of the step's prompts

    def __init__(self, name: str, node: GenerateSpec, workspace: Workspace):
        from rlgraph.rl.batch import shard_bounds
        from rlgraph.rl.data import DataSource

        self.name, self.node, self.ws = name, node, workspace
        self.data = DataSource(workspace.spec.data, "train", workspace.base_dir)
        replicas, prompts = workspace.replicas, workspace.spec.data.prompts_per_step
        self.share = shard_bounds(prompts, replicas.dp_rank, replicas.dp_world)  # [lo, hi)
        self.cache = None
        self.static: Any = None  # rlgraph.engines.static_rollout.StaticRollout, built once
        self.inflight: Any = None  # rlgraph.engines.inflight.InflightDecode (inflight: true)
        self.sglang: Any = None  # engine: sglang: rlgraph.engines.sglang_engine.SGLangRollout
        self.snapshots: dict[int, dict[str, Any]] = {}
        self.env_spans: list[tuple[float, float]] = []  # env calls since the last summary
        self.agent: Any = None  # rlgraph.envs.rollout.AgentRollout of a multi-turn node
        if node.env is not None:
            from rlgraph.bench_mode import forced_turn_length
            from rlgraph.envs.rollout import AgentRollout

            data = workspace.spec.data
            self.agent = AgentRollout(
                node.env, workspace.tokenizer, data.response_len.max,
                str(workspace.base_dir) if workspace.base_dir else None, name,
                turn_length=(lambda key, turn: forced_turn_length(
                    data.seed, key, turn, data.response_len, node.env.mean_turns()))
                if node.forced_lengths else None)
            if node.inflight:  # the turn engine keeps trajectories' slots across calls
                self.agent.kv = node.kv
        schedule = workspace.spec.schedule
        # colocated streaming: the engine's own copy of the weights (see the class docstring)
        self.snapshot: Any = None
        self.snapshot_version = workspace.policy_version
        if schedule.stream is not None and workspace.optimizer is not None:
            import copy

            self.snapshot = copy.deepcopy(workspace.policy).requires_grad_(False).eval()
        if schedule.partial_rollout or schedule.stream is not None:
            from functools import partial

            from rlgraph.engines.partial_rollout import RolloutCache
            from rlgraph.envs.rollout import AgentCache

            data, k = workspace.spec.data, schedule.mini_batches
            prompts = self.share[1] - self.share[0]
            if prompts % k:
                raise ValueError(f"{name}: this replica samples {prompts} prompts a step, which "
                                 f"schedule.stream.mini_batches {k} does not divide; use "
                                 f"prompts_per_step divisible by mini_batches x the group's "
                                 f"replicas")
            # streaming: a call emits one mini-batch and keeps the whole batch's groups in
            # flight (continuous batching), oversampled as well with partial rollout
            oversample = k * (node.oversample if schedule.partial_rollout else 1.0)
            cache = RolloutCache if self.agent is None else partial(
                AgentCache, key_of=lambda position: self.data.example(
                    self._data_position(position)).uid)
            self.cache = cache(
                prompts_per_step=prompts // k,
                samples_per_prompt=data.samples_per_prompt, oversample=oversample,
                max_lag=schedule.max_lag, stale=node.stale, stride=k,
                mix_versions=schedule.partial_rollout or node.inflight,
                # one GPU: generate time-shares it with train (the workspace trains)
                shares_device=node.inflight and workspace.optimizer is not None,
                max_new_tokens=data.response_len.max,
                prompt_of=lambda position: self._encode(self.data.example(
                    self._data_position(position))),
                length_of=(lambda position, k: self._forced(self._data_position(position), k))
                if node.forced_lengths else None)

    def _data_position(self, own: int) -> int:
        """Data position of this replica's `own`-th prompt: its share of every step's
        prompts, in step order (the identity for a lone replica)."""
        lo, hi = self.share
        step, index = divmod(own, hi - lo)
        return step * self.ws.spec.data.prompts_per_step + lo + index

    def _forced(self, position: int, sample: int) -> int:
        """The forced length of sample `sample` of the prompt at data position `position`."""
        from rlgraph.bench_mode import forced_length

        data = self.ws.spec.data
        return forced_length(data.seed, position, sample, data.response_len)

    def _encode(self, example: Any) -> list[int]:
        """The example's prompt token ids; a prompt longer than prompt_len is refused."""
        from rlgraph.errors import SpecError

        ids = self.ws.tokenizer.encode_prompt(example.prompt)
        limit = self.ws.spec.data.prompt_len
        if len(ids) > limit:
            err = SpecError(f"prompt {example.where} has {len(ids)} tokens, more than prompt_len "
                            f"{limit}", ("data", "prompt_len"), hint=f"raise it to {len(ids)}")
            err.source = self.ws.spec.source  # the user's graph file and line
            raise err
        return ids

    def prompts(self, step: int) -> tuple[list[Any], list[list[int]]]:
        """This replica's share of the step's examples and their token ids; a prompt longer
        than prompt_len is refused."""
        examples = self.data.batch(step)[slice(*self.share)]
        return examples, [self._encode(ex) for ex in examples]

    def _static_engine(self) -> Any:
        """The workspace's static decoder (GPU), built on first use and sized from the spec
        (partial rollout: a slot for every row in flight); None where generate decodes
        through `sampling.Decoder`."""
        if self.static is None and use_static_engine(self.node, self.ws.device):
            from rlgraph.engines.static_rollout import StaticRollout

            data = self.ws.spec.data
            prompts = self.share[1] - self.share[0] if self.cache is None else self.cache.in_flight
            slots = prompts * data.samples_per_prompt
            if not self.ws.spec.cluster.local:  # as many as the compiler's memory pass holds
                from rlgraph.compiler.memory import native_engine_slots

                slots = min(slots, native_engine_slots(self.ws.spec, self.name,
                                                       self.ws.replicas.world))
            self.static = StaticRollout(
                self.sampling_model, slots=slots,
                max_len=data.prompt_len + data.response_len.max, eos_id=self.ws.tokenizer.eos_id,
                compile=self.node.cuda_decode == "compiled" and self.ws.device != "cpu",
                top_p=self.node.top_p, sync_every=self.node.sync_every)
        return self.static

    def _turn_engine(self) -> Any:
        """A multi-turn node's engine (engines/turn_decode.TurnDecoder: a trajectory keeps
        its KV across turns), built once, a slot for every trajectory in flight (at most what
        the memory pass holds); on the CPU the same decoder eager. None with
        `cuda_decode: dynamic` (turns re-encoded in waves on `cpu_decode.Decoder`)."""
        if self.node.cuda_decode == "dynamic" or self.agent is None:
            return None
        if self.agent.engine is None:
            from rlgraph.engines.turn_decode import TurnDecoder

            data = self.ws.spec.data
            prompts = self.share[1] - self.share[0] if self.cache is None else self.cache.in_flight
            slots = prompts * data.samples_per_prompt
            if not self.ws.spec.cluster.local:  # as many as the compiler's memory pass holds:
                from rlgraph.compiler.memory import native_engine_slots

                # the others wait for a trajectory to end and free its slot
                slots = min(slots, native_engine_slots(self.ws.spec, self.name,
                                                       self.ws.replicas.world))
            compile = self.node.cuda_decode == "compiled" and self.ws.device != "cpu"
            engine = TurnDecoder(self.sampling_model, max_batch=slots,
                                 max_len=data.prompt_len + data.response_len.max,
                                 eos_token_id=self.ws.tokenizer.eos_id,
                                 sync_every=self.node.sync_every, compile=compile,
                                 timing=True, compact=not compile)
            engine.warmup(use_top_p=self.node.top_p < 1.0)
            self.agent.engine = engine
        return self.agent.engine

    def _inflight(self) -> Any:
        """The rows decoding across calls (engines/inflight.py), on the static engine, also
        on the CPU (run eagerly there); None without `inflight`."""
        if not self.node.inflight:
            return None
        if self.inflight is None:
            from rlgraph.engines.inflight import InflightDecode
            from rlgraph.engines.static_rollout import StaticRollout

            engine = self._static_engine()
            if engine is None:  # the CPU: the same decoder, eager (no graphs, no compile)
                data = self.ws.spec.data
                engine = self.static = StaticRollout(
                    self.sampling_model, slots=self.cache.in_flight * data.samples_per_prompt,
                    max_len=data.prompt_len + data.response_len.max,
                    eos_id=self.ws.tokenizer.eos_id, compile=False, top_p=self.node.top_p,
                    sync_every=self.node.sync_every)
            self.inflight = InflightDecode(engine, self.node.kv)
        return self.inflight

    def _sglang_rollout(self) -> Any:
        """The sglang engine of `engine: sglang`, built on first use (the runner has refused
        the plans it cannot run: `sglang_engine.refuse_unrunnable`)."""
        if self.sglang is None:
            from rlgraph.engines.sglang_engine import SGLangRollout

            share = ({"mem_fraction_static": self.node.memory_fraction}
                     if self.node.memory_fraction is not None else {})
            self.sglang = SGLangRollout(self.sampling_model, seed=self.ws.spec.data.seed,
                                        eos_id=self.ws.tokenizer.eos_id, **share)
        return self.sglang

    def _swap(self) -> int | None:
        """Adopt a policy version staged by param_update, if one is complete (contract W)."""
        return self.ws.swap_if_staged()

    @property
    def sampling_model(self) -> Any:
        """The weights the engine decodes with: the snapshot where the group streams and
        trains, else the workspace's policy."""
        return self.ws.policy if self.snapshot is None else self.snapshot

    def sampling_version(self) -> int:
        """The policy version of `sampling_model`."""
        return self.ws.policy_version if self.snapshot is None else self.snapshot_version

    def refresh_snapshot(self) -> int:
        """Copy the trained policy into the snapshot in place (the captured CUDA graphs stay
        valid) and return the version it now holds; the live version where there is none."""
        import torch

        with self.ws.lock, torch.no_grad():
            if self.snapshot is not None:
                for mine, trained in zip(self.snapshot.state_dict().values(),
                                         self.ws.policy.state_dict().values(), strict=True):
                    mine.copy_(trained)
            self.snapshot_version = self.ws.policy_version
        return self.snapshot_version

    def summary(self, out: Batch) -> dict[str, Any]:
        """What the driver reads of a rollout beside its metrics: the policy version that
        sampled it, its response tokens, and how long swaps paused generation since the last."""
        summary: dict[str, Any] = {"policy_version": int(out.get("policy_version", 0)),
                                   "metrics": {"generate/pause_s": self.ws.take_pause_s()}}
        if self.env_spans:  # the timeline's env lane
            summary["env_spans"], self.env_spans = self.env_spans, []
        if "response_mask" in out:
            summary["response_tokens"] = int(out["response_mask"].sum())
        return summary

    def run(self, step: int, inputs: dict[str, Batch] | None = None) -> Batch:
        """Sample the batch of train step `step` (prompts deterministic in (seed, step), or in
        (seed, position) with partial rollout). With `algorithm.dynamic_sampling` it keeps
        drawing prompt batches until enough groups have unequal rewards (`dynamic_batch`);
        ReMax adds each prompt's greedy response (`baseline_response_text`)."""
        if self.cache is not None:
            return self._partial(step)
        if self.agent is not None:
            return self._multi_turn(step)
        algo = self.ws.spec.algorithm
        if algo.dynamic_sampling.enable:
            from rlgraph.nodes.dynamic_sampling import dynamic_batch

            batch = dynamic_batch(self, step)
        else:
            batch = self.draw(step, step, (self.name, step))
        if algo.advantage == "greedy_baseline":
            batch["baseline_response_text"] = self._greedy_texts(batch)
        return batch

    def draw(self, step: int, index: int, seed: tuple[Any, ...]) -> Batch:
        """One batch of `step`: this replica's share of prompt batch `index` of the data
        stream (the step's own without dynamic sampling), sampled with an RNG seeded by
        `seed`."""
        import torch

        from rlgraph.engines.cpu_decode import sample

        data, tok = self.ws.spec.data, self.ws.tokenizer
        examples, ids = self.prompts(index)
        n = data.samples_per_prompt
        prompts = [p for p in ids for _ in range(n)]
        positions = [index * data.prompts_per_step + self.share[0] + i
                     for i in range(len(examples))]
        lengths = ([self._forced(p, k) for p in positions for k in range(n)]
                   if self.node.forced_lengths else None)
        metrics = None
        with self.ws.lock, torch.no_grad():
            engine = self._static_engine()
            self._swap()
            version = self.sampling_version()
            generator = self.ws.generator(*seed, *self.ws.replicas.tag)
            if self.node.engine == "sglang":
                rollout = self._sglang_rollout().sample(
                    self.sampling_model, version, prompts, max_new_tokens=data.response_len.max,
                    temperature=self.node.temperature, top_p=self.node.top_p, pad_id=tok.pad_id)
            elif engine is not None:
                rollout, metrics = engine.sample(
                    prompts, max_new_tokens=data.response_len.max, pad_id=tok.pad_id,
                    policy_version=version, temperature=self.node.temperature,
                    top_p=self.node.top_p, seed=generator.initial_seed(), lengths=lengths)
            else:  # forced lengths: an eos id no token has, and a budget per row
                rollout = sample(self.sampling_model, prompts, max_new_tokens=data.response_len.max,
                                 eos_id=tok.eos_id if lengths is None else -1,
                                 pad_id=tok.pad_id, policy_version=version,
                                 temperature=self.node.temperature, top_p=self.node.top_p,
                                 generator=generator, budgets=lengths)
        batch = self._batch(step, version, examples, positions, rollout)
        if metrics is not None:
            batch["metrics"] = metrics
        return batch

    def _greedy_texts(self, batch: Batch) -> list[str]:
        """ReMax's baseline: each prompt's greedy response with the weights that sampled the
        batch, decoded once per prompt and repeated over its rows."""
        import torch

        from rlgraph.engines.cpu_decode import sample

        tok, n = self.ws.tokenizer, self.ws.spec.data.samples_per_prompt
        prompts = [tok.encode_prompt(p) for p in batch["prompt"][::n]]
        with self.ws.lock, torch.no_grad():
            rollout = sample(self.sampling_model, prompts,
                             max_new_tokens=self.ws.spec.data.response_len.max,
                             eos_id=tok.eos_id, pad_id=tok.pad_id, greedy=True)
        texts = [tok.decode(r) for r in rollout.responses.tolist()]
        return [t for t in texts for _ in range(n)]

    def _multi_turn(self, step: int) -> Batch:
        """Batch `step` of trajectories: every sample of the step's prompts acts in its own
        environment until it ends (rlgraph.envs.rollout)."""
        import torch

        from rlgraph.envs.rollout import Row, batch_fields, prompt_text, round_metrics, sample_dict
        from rlgraph.envs.trajectory import Trajectory, pack_trajectories

        data, tok = self.ws.spec.data, self.ws.tokenizer
        examples, ids = self.prompts(step)
        n = data.samples_per_prompt
        positions = [step * data.prompts_per_step + self.share[0] + i
                     for i in range(len(examples))]
        rows = [Row(p, Trajectory(key=f"{ex.uid}#{k}"), prompt_text(ex.prompt),
                    sample_dict(ex, k, f"{ex.uid}#{k}"))
                for ex, p in zip(examples, ids) for k in range(n)]
        with self.ws.lock, torch.no_grad():
            self._turn_engine()
            self._swap()
            version = self.sampling_version()
            stats = self.agent.run_round(
                rows, self.sampling_model, version, step, lambda: None, None,
                eos_id=-1 if self.node.forced_lengths else tok.eos_id, pad_id=tok.pad_id,
                temperature=self.node.temperature, top_p=self.node.top_p,
                generator=self.ws.generator(self.name, step, *self.ws.replicas.tag))
        trajectories = [r.trajectory for r in rows]
        rollout = pack_trajectories([r.prompt for r in rows], trajectories, tok.pad_id)
        batch = self._batch(step, version, examples, positions, rollout)
        batch.update(batch_fields(trajectories, tok))
        metrics, spans = round_metrics(self.agent, trajectories, stats)
        self.env_spans += spans
        batch["metrics"] = metrics
        return batch

    def _partial(self, step: int) -> Batch:
        """Batch `step` from the rollout cache (partial_rollout.generate_round), decoded on
        the static engine where `_static_engine` gives one."""
        import torch

        from rlgraph.engines.cpu_decode import pack
        from rlgraph.engines.partial_rollout import generate_round

        tok = self.ws.tokenizer
        if self.agent is not None:
            return self._partial_multi_turn(step)
        with self.ws.lock, torch.no_grad():
            engine = self._static_engine()
            inflight = self._inflight()
            self._swap()
            version = self.sampling_version()
            swap = self._swap if self.cache.mix_versions and self.snapshot is None \
                else lambda: None
            groups, metrics = generate_round(
                self.cache, step, self.sampling_model, version, swap, engine, inflight,
                eos_id=tok.eos_id, pad_id=tok.pad_id, temperature=self.node.temperature,
                top_p=self.node.top_p,
                generator=self.ws.generator(self.name, step, *self.ws.replicas.tag))
        self.snapshots[step] = self.cache.state_dict()
        for old in sorted(self.snapshots)[:-self.SNAPSHOTS]:
            del self.snapshots[old]
        samples = [s for g in groups for s in g.samples]
        rollout = pack([g.prompt for g in groups for _ in g.samples], [s.tokens for s in samples],
                       [s.logps for s in samples], [s.versions for s in samples], tok.pad_id)
        positions = [self._data_position(g.position) for g in groups]
        batch = self._batch(step, version, [self.data.example(p) for p in positions], positions,
                            rollout)
        batch["metrics"] = metrics
        return batch

    def _partial_multi_turn(self, step: int) -> Batch:
        """Batch `step` of trajectories from the rollout cache (rlgraph.envs.rollout.agent_round):
        open trajectories, mid-turn or waiting for their environment, carry to later steps."""
        import torch

        from rlgraph.envs.rollout import (
            Row,
            agent_round,
            batch_fields,
            prompt_text,
            round_metrics,
            sample_dict,
        )
        from rlgraph.envs.trajectory import pack_trajectories

        tok = self.ws.tokenizer

        def row_of(group: Any, k: int, trajectory: Any) -> Any:
            example = self.data.example(self._data_position(group.position))
            return Row(group.prompt, trajectory, prompt_text(example.prompt),
                       sample_dict(example, k, trajectory.key))

        with self.ws.lock, torch.no_grad():
            self._turn_engine()
            self._swap()
            version = self.sampling_version()
            swap = self._swap if self.cache.mix_versions and self.snapshot is None \
                else lambda: None
            groups, metrics = agent_round(
                self.cache, self.agent, step, self.sampling_model, version, swap, row_of,
                eos_id=-1 if self.node.forced_lengths else tok.eos_id, pad_id=tok.pad_id,
                temperature=self.node.temperature, top_p=self.node.top_p,
                generator=self.ws.generator(self.name, step, *self.ws.replicas.tag))
        self.snapshots[step] = self.cache.state_dict()
        for old in sorted(self.snapshots)[:-self.SNAPSHOTS]:
            del self.snapshots[old]
        trajectories = [s for g in groups for s in g.samples]
        rollout = pack_trajectories([g.prompt for g in groups for _ in g.samples],
                                    trajectories, tok.pad_id)
        positions = [self._data_position(g.position) for g in groups]
        batch = self._batch(step, version, [self.data.example(p) for p in positions], positions,
                            rollout)
        batch.update(batch_fields(trajectories, tok))
        env_metrics, spans = round_metrics(self.agent, trajectories)
        self.env_spans += spans
        batch["metrics"] = {**metrics, **env_metrics}
        return batch

    def _batch(self, step: int, version: int, examples: list[Any], positions: list[int],
               rollout: Any) -> Batch:
        """The batch layout of rlgraph.rl.batch: one row per sample, grouped by prompt."""
        import torch

        tok, n = self.ws.tokenizer, self.ws.spec.data.samples_per_prompt
        rows = [ex for ex in examples for _ in range(n)]
        return {
            "step": step,
            "policy_version": version,
            "temperature": self.node.temperature,
            "prompt_uid": [ex.uid for ex in rows],
            "data_position": [p for p in positions for _ in range(n)],
            "group": torch.arange(len(examples)).repeat_interleave(n),
            "prompt": [ex.prompt for ex in rows],
            "data_source": [ex.data_source for ex in rows],
            "ground_truth": [ex.ground_truth for ex in rows],
            "extra_info": [ex.extra_info for ex in rows],
            "response_text": [tok.decode(r) for r in rollout.responses.tolist()],
            "sequences": rollout.sequences.cpu(),
            "attention_mask": rollout.attention_mask.cpu(),
            "prompt_len": rollout.prompt_len,
            "response_mask": rollout.response_mask.cpu(),
            "behavior_logp": rollout.behavior_logp.cpu(),
            "token_version": rollout.token_version.cpu(),
        }

    # ------------------------------------------------------------ checkpoints

    def cache_state(self, step: int) -> dict[str, Any] | None:
        """The rollout cache as it was after generate(`step`) (what a checkpoint whose
        rollout buffer ends at `step` must keep); None without partial rollout."""
        if self.cache is None or step < 0:
            return None
        if step not in self.snapshots:
            raise RuntimeError(f"{self.name}: no rollout cache state after step {step} (kept: "
                               f"{sorted(self.snapshots)})")
        return self.snapshots[step]

    def load_cache_state(self, state: dict[str, Any] | None) -> None:
        """Restore the rollout cache of a checkpoint (a resumed run goes on where it was)."""
        if self.cache is not None and state is not None:
            self.cache.load_state_dict(state)
            if self.inflight is not None:  # rows in the engine belong to the old cache
                self.inflight.reset()
            if self.agent is not None and self.agent.engine is not None:
                self.agent.engine.release_all()  # trajectories' slots, likewise
