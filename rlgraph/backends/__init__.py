"""Model backends other than plain torch/transformers for the logp, ref_logp and train nodes.

`megatron_layout` converts weights between the transformers layout (what the generate
engine, checkpoints and weight sync use) and megatron-core's (fused qkv, fused gate/up, tensor
parallel shards); it needs only torch. `megatron` builds a megatron-core GPTModel that runs
like the transformers policy (`forward(...).logits`) and imports megatron-core lazily.
"""
