"""One type for a weight sync's `bucket_mb` (rlgraph.weights.BucketMiB) from graph.yaml through
the plan to the runtime, and the nccl divisibility rule checked when the graph compiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlgraph.compiler import compile_plan
from rlgraph.compiler.plan import Plan
from rlgraph.config.load import load_spec
from rlgraph.errors import SpecError
from rlgraph.runtime.weight_sync import Route
from rlgraph.weights import BucketMiB

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "graphs" / "quickstart.yaml"
GPU_GRAPH = ROOT / "bench" / "graphs_gpu" / "split-one-step-off.yaml"
UNEVEN = "nodes.param_update.bucket_mb={produce: 100, consume: 64}"


def test_spec_plan_and_runtime_hold_the_same_type() -> None:
    spec = load_spec(QUICKSTART, ["nodes.param_update.bucket_mb={produce: 2, consume: 0.5}"])
    plan = compile_plan(spec)
    written = spec.nodes["param_update"].bucket_mb
    routed = plan.weight_sync["param_update"].bucket_mb
    reread = Plan.from_json(plan.to_json()).weight_sync["param_update"].bucket_mb
    route = Route("param_update", None, None, routed)
    assert all(type(b) is BucketMiB for b in (written, routed, reread, route.bucket_mb))
    assert written == routed == reread == BucketMiB(2, 0.5)
    assert route.bucket_mb.consume_bytes == 2**19


@pytest.mark.parametrize(("graph", "overrides", "refused"), [
    (GPU_GRAPH, [UNEVEN], True),  # auto is nccl on GPUs
    (QUICKSTART, [UNEVEN], False),  # auto is the object store on a CPU cluster
    (QUICKSTART, [UNEVEN, "nodes.param_update.transport=nccl"], True),
    (GPU_GRAPH, ["nodes.param_update.bucket_mb={produce: 512, consume: 128}"], False),
])
def test_nccl_divisibility_is_checked_at_compile_time(graph: Path, overrides: list[str],
                                                       refused: bool) -> None:
    spec = load_spec(graph, overrides)
    if not refused:
        compile_plan(spec)
        return
    with pytest.raises(SpecError, match="not a multiple of consume 64 MiB") as info:
        compile_plan(spec)
    assert info.value.key == ("nodes", "param_update", "bucket_mb")


def test_graph_yaml_sizes_are_bounded_and_code_sizes_may_be_tiny() -> None:
    with pytest.raises(ValueError):
        BucketMiB.model_validate({"produce": 0.001})
    with pytest.raises(ValueError):
        BucketMiB.model_validate({"produce": 1, "consume": None})
    tiny = BucketMiB.of(0.005)  # a produce size built in code: whole tensors received
    assert tiny.consume is None and tiny.produce_bytes == int(0.005 * 2**20)
