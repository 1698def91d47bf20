"""rlgraph: a declarative dataflow-graph compiler and Ray runtime for asynchronous RL of
language models. `rlgraph compile` derives placement, a proven off-policy lag bound and an
overlapped schedule from graph.yaml; `rlgraph run` executes the plan on Ray.

Importing the package imports nothing heavy: the compiler stays free of torch and ray.
"""

__version__ = "0.1.0"
