"""What a group's process holds: its `Workspace` (model, optimizer, tokenizer, data, dual
buffer), the warm start, data-parallel replicas and FSDP sharding inside a group, and the
child processes that run user code (`isolated`). A node kind's worker (`rlgraph.nodes`)
runs its tasks on this state; the Ray actor around it is `rlgraph.runtime.actors.GroupActor`."""
