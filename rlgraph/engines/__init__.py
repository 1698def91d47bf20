"""Generate engines: `static_decode` (a decode loop we control, torch + transformers, with
`fusion` for fused projections) and `sglang_engine` (an adapter over sglang's offline Engine).
Importing this package imports neither torch nor sglang; import the submodule you need."""
