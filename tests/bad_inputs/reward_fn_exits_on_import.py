"""A reward module the compiler must parse, never run: importing it exits."""

raise SystemExit("rlgraph compile executed a reward module")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Never reached."""
    return 0.0
