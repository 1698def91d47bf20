"""The shared maxima of graph.yaml's numbers. Every int and float key of every section declares a
lower and an upper bound, and no section accepts inf or NaN (`allow_inf_nan=False`), so a value
outside them is refused naming its key (tests/bad_inputs/test_hostile_inputs.py checks every
field). A leaf module: the spec sections of every package import it, and it imports nothing."""

MAX_COUNT = 1_000_000  # prompts, samples or sequences in one batch
MAX_STEPS = 10_000_000  # steps of a run
MAX_TOKENS = 1 << 20  # tokens of one prompt or response
MAX_PARALLEL = 1024  # tp / pp / ep / data-parallel replicas
MAX_SECONDS = 1e6  # one node's step (11 days)
MAX_SEED = 2**32 - 1  # numpy's and CUDA's seed range
