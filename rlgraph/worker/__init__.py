"""What a worker process holds: its `Workspace` (model, optimizer, tokenizer, data, dual
buffer), the warm start, and data-parallel replicas inside a group."""
