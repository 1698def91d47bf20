"""Where every fact of a system's row (`rlgraph.pricing.system.SYSTEMS`) comes from: system
-> field (`refit.<path>` for a refit path) -> the code, issue, blog or measurement it is read
from."""

from __future__ import annotations

SOURCES: dict[str, dict[str, str]] = {
    "rlgraph": {
        "colocated_switch": "rlgraph.nodes.param_update.ParamUpdateWorker.local: a colocated "
                            "generate decodes with the policy train updates; nothing moves",
        "refit": "groups apart: param_update over NCCL into a second buffer "
                 "(rlgraph.pricing.param_update; bench/results/gpu4-nccl.json)",
        "batch_transfer": "inside rlgraph's measured node times (eager passes, "
                          "replica_dispatch_s: bench/results/gpu-longtail.json)",
    },
    "verl": {
        "colocated_switch": "verl's hybrid engine (ActorRolloutRefWorker): training and "
                            "rollout share the GPUs and switch every step; ../shared/published "
                            "README: gen - generate_sequences = 74 s (FSDP2) / 45 s (Megatron) "
                            "for 7B on 16 H20 (one_step_off_policy recipe)",
        "offload": "the switch moves the train state (16 B/param, ZeRO) to host and back over "
                   "PCIe, and the engine's weights (bf16 / tp) to sleep and back: "
                   "train_state_bytes_per_param, GPUPreset.host_bytes_per_s",
        "refit.per_tensor": "verl issue 2419: resharding Moonlight-16B-A3B (~32 GB bf16) into "
                            "the rollout engine took 175 s on 8 H20, 0.18 GB/s: the path of "
                            "verl releases before bucketed transfer",
        "refit.bucketed": "verl PR 2418 (same issue): 18 s for the same 32 GB with bucketed "
                          "transfer, 1.8 GB/s; current verl buckets by default "
                          "(rollout.checkpoint_engine.update_weights_bucket_megabytes, 512, "
                          "verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py)",
        "old_logp_always": "verl's ray_trainer computes old_log_prob on every batch (the "
                           "published tables' old_log_prob column)",
        "packs_sequences": "use_remove_padding (verl's DAPO recipes): sequences packed, "
                           "attention per sequence",
        "driver_transfer": "verl's single controller moves each DataProto through the Ray "
                           "object store (object_store_bytes_per_s, docs/measurements.md)",
        "activation_recompute": "enable_gradient_checkpointing: True in verl/trainer/config/"
                                "ppo_trainer.yaml and the published 7B DAPO scripts; a graph "
                                "that sets train's activation_checkpointing overrides it",
    },
    "areal": {
        "colocated_switch": "none: AReaL runs rollout (SGLang) and trainer on separate GPUs "
                            "(its allocation_mode, benchmark/verl_312a8cb/build_cmd.py), so "
                            "no group switches; weights go over NCCL after each update",
        "old_logp_always": "recompute_logprob: the trainer recomputes the old log-probs "
                           "(examples/arealite/configs/boba.yaml)",
        "packs_sequences": "AReaL packs each batch's sequences (blog/AReaL_v0_2.md)",
        "sync_apart": "synchronous AReaL is the same allocation at max_head_offpolicyness 0 "
                      "(examples/configs/v0.2-qwen2-math/README.md runs synchronous and "
                      "asynchronous on one allocation_mode; blog/AReaL_v0_3.md Table 2 "
                      "compares the two), so its baseline keeps the plan's groups",
        "batch_transfer": "no single controller: packed batches move over NCCL with "
                          "GPUDirect RDMA, 'below 3 seconds even in a 1,000-GPU cluster' "
                          "(blog/AReaL_v0_2.md), so no driver transfer is charged",
    },
    "slime": {
        "colocated_switch": "--colocate: training and the SGLang engines share the GPUs and "
                            "alternate (THUDM/slime docs/en/examples/qwen3-4B.md, 'Decoupled "
                            "Training and Inference'); without it they hold GPUs apart "
                            "(--rollout-num-gpus), which a graph says with its groups; "
                            "train_async.py asserts 'Colocation is not supported for async "
                            "training'",
        "offload": "--colocate turns on --offload-train and --offload-rollout "
                   "(slime/utils/arguments.py: 'This will always be true when --colocate is "
                   "set'): the Megatron state to host and back over PCIe, the engine's memory "
                   "released and resumed, priced as verl's switch terms",
        "refit.flattened": "colocated refit through update_weights_from_tensor (CUDA IPC) with "
                           "flattened buckets: Qwen3-30B-A3B (61.1 GB bf16) in ~6 s on 8 GPUs, "
                           "10 GB/s (pull request THUDM/slime#155, 'from ~10s to ~6s'; the 8 "
                           "H100 / H200 of THUDM/slime#132); THUDM/slime#67 measured "
                           "Qwen3-235B's update at 1 min (~470 GB, 7.8 GB/s) on its cluster",
        "refit.bucketed": "the same path with 512 MB buckets before flattening: ~16 s for the "
                          "30B MoE, 3.8 GB/s (zhaochenyang20/Awesome-ML-SYS-Tutorial#169, "
                          "'SLIME + SGLang ... ~16s for 30B MoE ... 512MB bucketing')",
        "old_logp_always": "Megatron recomputes the old log-probs before each update unless "
                           "--use-rollout-logprobs (slime/utils/arguments.py)",
        "packs_sequences": "'slime always trains the model using data packing' "
                           "(docs/en/examples/qwen3-4B.md, PERF_ARGS; --use-dynamic-batch-size "
                           "packs up to --max-tokens-per-gpu, a graph's micro_tokens)",
        "driver_transfer": "none charged: rollout data reaches the train actors once a step as "
                           "Ray object references of per-rank partitions of unpadded tokens "
                           "(docs/en/advanced/mooncake-dataproto-transfer.md: 'The default "
                           "transfer backend remains Ray'), with the log-probs computed inside "
                           "the Megatron actors, not verl's padded batch through the driver "
                           "per pass",
        "activation_recompute": "Megatron's default is no recompute; slime's scripts opt in "
                                "(--recompute-granularity full): say activation_checkpointing "
                                "on the train node as the script does",
    },
    "openrlhf": {
        "colocated_switch": "Hybrid Engine: --colocate_all_models with --vllm_enable_sleep "
                            "(OpenRLHF README, Features); --async_train places the vLLM "
                            "engines on GPUs apart (openrlhf/cli/train_ppo_ray.py: the shared "
                            "placement group only 'if args.colocate_all_models and not "
                            "args.async_train')",
        "offload": "--deepspeed_enable_sleep offloads the DeepSpeed (ZeRO) state and "
                   "--vllm_enable_sleep the engine (train_ppo_ray.py), the hybrid-engine "
                   "scripts' setting, priced as verl's switch terms",
        "refit.cuda_ipc": "DeepSpeed -> vLLM weight sync (--vllm_sync_backend nccl; CUDA IPC "
                          "in the hybrid engine: the vLLM blog 'Accelerating RLHF with vLLM, "
                          "Best Practice from OpenRLHF', 2025-04-23); no measured rate of "
                          "this path is cited, so the gathered bf16 weights move at the GPU "
                          "preset's NVLink bandwidth (physics, not a measurement). The one "
                          "measurement found is of its 2024 broadcast to vLLM on GPUs apart "
                          "(a graph's param_update): HybridFlow (arXiv 2409.19256) Figure 14, "
                          "over 80 s for a 70B model, quoted in OpenRLHF/OpenRLHF#647",
        "old_logp_always": "the experience maker runs the actor over every batch for "
                           "action_log_probs (openrlhf/trainer/ppo_utils/experience_maker.py, "
                           "make_experience)",
        "packs_sequences": "--packing_samples, in the README's Ray PPO example (and the 2025/4 "
                           "'Single Controller and Unified Packing Samples' refactor)",
        "driver_transfer": "a single controller (PPOTrainer.remote, train_ppo_ray.py: 'init "
                           "PPO trainer (Single controller)') moves the experience batches "
                           "through Ray, priced as verl's padded batch per pass",
        "activation_recompute": "--gradient_checkpointing in the README's examples (its CLI "
                                "default is off: a graph that sets train's "
                                "activation_checkpointing decides)",
    },
    "roll": {
        "colocated_switch": "actor_train and actor_infer on the same device_mapping share the "
                            "GPUs and switch every step (alibaba/ROLL roll/pipeline/rlvr/"
                            "rlvr_pipeline.py run(): offload_states / load_states around "
                            "model_update); async_generation_ratio > 0 runs rollout ahead",
        "offload": "rlvr_pipeline.py run(): actor_train.offload_states() before the "
                   "model_update, actor_infer.offload_states() after generate, priced as "
                   "verl's switch terms",
        "refit.model_update": "set_model_update_pair(actor_train -> actor_infer) every step; "
                              "no measured rate is cited, so the bf16 weights move at the GPU "
                              "preset's NVLink bandwidth (physics, not a measurement)",
        "old_logp_always": "off: enable_old_logprobs_recompute defaults to False and "
                           "set_old_logprobs_status turns it on only for more than one backward "
                           "step per rank or init_kl_coef > 0 (roll/pipeline/rlvr/"
                           "rlvr_config.py); else the loss takes the engine's infer_logprobs. "
                           "A graph of such a run states its logp node",
        "packs_sequences": "off: use_sequence_packing and dynamic batching are opt-in "
                           "(docs_roll 'RLVR Pipeline', Efficient Training Optimization)",
        "driver_transfer": "the pipeline driver gathers each DataProto (ray.get of the "
                           "generate schedulers, DataProto.concat) and sends it to "
                           "compute_log_probs and train, priced as verl's padded batch per pass",
    },
    "skyrl": {
        "colocated_switch": "generator.colocate_all: engines sleep() after generation and "
                            "wake_up() before the next round (NovaSky-AI/SkyRL docs/content/"
                            "docs/configuration/placement.mdx); one-step-off and fully async "
                            "need colocate_all=false (docs/.../tutorials/fully_async.mdx)",
        "offload": "colocate_all: policy_model.offload_to_cpu(offload_optimizer=True) before "
                   "the weight sync and backload_to_gpu() before its passes (skyrl trainer.py), "
                   "priced as verl's switch terms (16 B/param)",
        "refit.batched": "colocated CUDA IPC weight sync in 1 GB batches of tensors, one "
                         "load_weights call each (NovaSky-AI/SkyRL#161: 'a 14B model on a "
                         "8xH100 node (TP2) ... from around 4.4s to 1.6s'): 28 GB bf16 in "
                         "1.6 s, 17.5 GB/s; sync_policy_weights_to_inference_engines after "
                         "wake_up(tags=['weights'])",
        "refit.per_param": "the same path parameter by parameter, before that change: 4.4 s "
                           "for the 14B model, 6.4 GB/s (NovaSky-AI/SkyRL#161)",
        "old_logp_always": "fwd_logprobs_values_reward runs the policy forward for "
                           "action_log_probs on every batch (skyrl trainer.py)",
        "packs_sequences": "trainer.use_sample_packing: true (docs/.../configuration/config.mdx)",
        "driver_transfer": "RayPPOTrainer on the driver dispatches the padded TrainingInputBatch "
                           "to the workers through Ray for every pass, priced as verl's",
        "activation_recompute": "trainer.gradient_checkpointing: true "
                                "(docs/.../configuration/config.mdx)",
    },
    "prime-rl": {
        "colocated_switch": "none: trainer (FSDP2) and inference (vLLM server) are separate "
                            "processes on GPUs apart (PrimeIntellect-ai/prime-rl docs/"
                            "architecture/overview.md); a graph priced as prime-rl that "
                            "colocates train and generate is refused",
        "refit": "the weight broadcast (filesystem by default, or nccl: weight_broadcast.type) "
                 "after each step; a graph prices the NCCL broadcast with its param_update "
                 "node (transport nccl); the filesystem path has no rate here",
        "old_logp_always": "off: the loss takes the importance ratio against the inference "
                           "policy's log-probs (docs/architecture/async-rl.md, AIPO)",
        "packs_sequences": "the orchestrator 'assembles them into packed batches' "
                           "(docs/architecture/orchestrator.md)",
        "batch_transfer": "the orchestrator relays packed batches to the trainer, no Ray "
                          "single controller: none charged",
    },
    "pipelinerl": {
        "colocated_switch": "none: actor LLMs, preprocessor and trainer take GPU pools apart "
                            "(ServiceNow/PipelineRL README, WorldMap *_fraction); a graph "
                            "priced as pipelinerl that colocates train and generate is refused",
        "refit": "in-flight NCCL broadcast after every optimizer step "
                 "(receive_weight_update, weight_update_interval 1): a graph's param_update "
                 "node with transport nccl, and generate's inflight: true",
        "old_logp_always": "off: rollouts carry the sampler's log-probs (README, TrainingText)",
        "packs_sequences": "finetune.seq_packing: true (conf/finetune/base.yaml)",
        "activation_recompute": "finetune.gradient_checkpointing: true "
                                "(conf/finetune/base.yaml)",
        "batch_transfer": "streams through the filesystem or Redis, no Ray single controller: "
                          "none charged",
    },
    "nemo-rl": {
        "colocated_switch": "NVIDIA-NeMo/RL nemo_rl/algorithms/grpo.py: with "
                            "policy.generation.colocated.enabled (the default, "
                            "examples/configs/grpo_math_1B.yaml) the Megatron policy and vLLM "
                            "share the GPUs and hand them over every step "
                            "(refit_policy_generation; finish_generation puts vLLM to sleep); "
                            "colocated.enabled: false gives generation its own nodes, whose "
                            "weights arrive over NCCL (update_weights_from_collective)",
        "offload": "nemo_rl/models/policy/workers/megatron_policy_worker.py: "
                   "offload_before_refit moves the grad buffers and the optimizer state to "
                   "host memory, offload_after_refit the parameters too; "
                   "prepare_for_lp_inference reloads the parameters, prepare_for_training "
                   "parameters, grads and optimizer state: the train state "
                   "(train_state_bytes_per_param, sharded over the group) goes out and back "
                   "over PCIe every step",
        "sleep_wake": "nemo_rl/models/generation/vllm/vllm_worker.py sleep(): "
                      "llm.sleep(level=1) (weights to host memory, KV cache dropped) after "
                      "generation, wake_up(tags=['weights']) before the refit and "
                      "['kv_cache'] after it: a replica's bf16 weights out and back",
        "refit.ipc_zmq": "least squares over NeMo-RL's published colocated refits, bf16 "
                         "bytes against seconds: its v0.3 blog ('NeMo-RL V0.3: Scalable and "
                         "Performant Post-training ... via Megatron-Core', the Refit column: "
                         "Llama 3.1-8B 5 s, Qwen3-32B 7 s, Qwen3-30B-A3B 12 s, Llama 3.1-70B "
                         "14 s) and its refit blog ('Journey of Optimizing Weight Transfer in "
                         "Large MoE Models by 10x', NVIDIA-NeMo/RL discussions 1189, Table 1: "
                         "DeepSeek V3, 1.34 TB, 47.2 s in v0.3: gather 12.2 s, CUDA IPC "
                         "handles 33.5 s, vLLM load 1.5 s): 7.3 s + the weights at 33.4 GB/s "
                         "(residuals within 3 s); the handles go to vLLM over ZMQ today "
                         "(stream_weights_via_ipc_zmq / update_weights_via_ipc_zmq)",
        "refit_overhead_s": "the same least squares: 7.3 s of every colocated refit beside its "
                            "bytes (collective_rpc to every vLLM executor, IPC handle "
                            "packing, the weights' metadata)",
        "old_logp_always": "grpo.py computes policy.get_logprobs (prev_logprobs) and, with "
                           "reference_policy_kl_penalty 0.01 (grpo_math_1B.yaml), "
                           "get_reference_policy_logprobs on every batch, on the policy's "
                           "workers, before policy.train",
        "packs_sequences": "policy.sequence_packing.enabled: True in grpo_math_1B.yaml "
                           "(modified_first_fit_decreasing; the Megatron path packs), which "
                           "every performance recipe inherits",
        "driver_transfer": "a single controller: grpo.py's driver holds the batch "
                           "(BatchedDataDict, train_data.to('cpu')) and lm_policy shards it to "
                           "the policy workers through Ray for get_logprobs and train "
                           "(object_store_bytes_per_s)",
        "refit_gather_bytes_per_s": "the refit blog's Table 1 (above): step 1, the policy "
                                    "workers gathering DeepSeek V3's parameters from their "
                                    "model-parallel shards (training EP64 PP8), took 12.2 s "
                                    "of the 47.2 s, 110 GB/s of bf16 weights; GPUs apart "
                                    "gather the same way before the NCCL broadcast "
                                    "(megatron_policy_worker.broadcast_weights_for_collective "
                                    "exports whole tensors, then broadcasts them), so the "
                                    "param_update node pays it beside its transfer",
        "moe_pass_factor": "NVIDIA-NeMo/RL#966 ('SFT on Qwen3 30B-a3b is quite slow', "
                           "Megatron backend): Qwen3-30B-A3B on 4 nodes x 8 H200, sequences of "
                           "4k, global batch 512, micro batch 8, EP 8, TP 1: ~13 s an "
                           "iteration, at most 512 x 4096 tokens (4.8e16 FLOP with causal "
                           "attention: 116 TFLOP/s a GPU, 11.7% of peak); less the expert "
                           "all-to-all priced apart (1.5 s at NVLink speed), the passes ran "
                           "at 0.29 of the dense roofline figure on H200 (46%), against the "
                           "0.55 of Megatron-Bridge's tuned pretraining recipe "
                           "(COSTS.moe_pass_factor): NeMo-RL's defaults (grpo_math_1B.yaml: "
                           "moe_permute_fusion false, moe_router_dtype fp64, the alltoall "
                           "dispatcher) run every MoE pass of its policy worker",
        "activation_recompute": "megatron_cfg.activation_checkpointing: false in "
                                "grpo_math_1B.yaml; the recipes that turn it on say so (the "
                                "graph's activation_checkpointing)",
    },
}
