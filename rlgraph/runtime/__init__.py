"""Ray runtime: runs a compiled plan with actors per group, bounded channels, versioned
weight sync, measured traces, metrics and checkpoints (`rlgraph run`).

Modules, one idea each: `state_machine` (node states and transitions), `channels` (bounded
queues), `pipeline` (the Ray-free scheduler), `cluster` (Ray start / join, placement
groups), `actors` (group actors), `weight_sync` (param_update), `executor` (tasks on
actors), `tracing` / `metrics` / `checkpoint` (what a run writes), `runner` (the loop) and
`launch` (the CLI command).
"""
