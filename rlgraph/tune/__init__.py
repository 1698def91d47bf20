"""`rlgraph tune`: search the plan space (`space`: placements, shares, lag, replicas) and
rank candidates by the compiler's own period (`search`). Imports neither torch nor ray."""
