"""A plan runs on the engine it names: `engine: sglang` builds the sglang adapter or is
refused in one line before anything starts, and the adapter's calls are what
tools/check_sglang_api.py checks against sglang's wheel."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from rlgraph.cli.main import main
from rlgraph.config.load import load_spec
from rlgraph.engines.sglang_engine import refuse_unrunnable
from rlgraph.errors import SpecError

ROOT = Path(__file__).resolve().parents[3]
GPU_GRAPH = ROOT / "bench" / "graphs_gpu" / "split-one-step-off.yaml"
HAS_SGLANG = importlib.util.find_spec("sglang") is not None


def test_run_refuses_sglang_on_cpu_in_one_line(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    status = main(["run", str(ROOT / "graphs" / "quickstart.yaml"),
                   "nodes.generate.engine=sglang", "-o", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert "nodes.generate.engine" in err and "CPU" in err and "engine: native" in err
    assert not out.exists(), "a refused run leaves no run dir behind"


@pytest.mark.skipif(HAS_SGLANG, reason="sglang is installed: the adapter is built instead")
def test_missing_sglang_is_refused_naming_the_package() -> None:
    spec = load_spec(GPU_GRAPH, ["nodes.generate.engine=sglang"])
    with pytest.raises(SpecError, match="sglang package is not installed") as info:
        refuse_unrunnable(spec)
    assert info.value.key == ("nodes", "generate", "engine")


@pytest.mark.parametrize(("override", "key"), [("schedule.partial_rollout=true", "engine"),
                                               ("nodes.generate.forced_lengths=true",
                                                "forced_lengths"),
                                               ("nodes.generate.tp=2", "tp")])
def test_what_the_adapter_does_not_run_is_refused(override: str, key: str) -> None:
    spec = load_spec(GPU_GRAPH, ["nodes.generate.engine=sglang", override])
    with pytest.raises(SpecError) as info:
        refuse_unrunnable(spec)
    assert info.value.key == ("nodes", "generate", key)


def test_native_plans_are_not_touched() -> None:
    refuse_unrunnable(load_spec(GPU_GRAPH))


def test_api_check_sees_every_call_the_adapter_makes() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import check_sglang_api as check
    finally:
        sys.path.pop(0)
    calls = check.adapter_calls(check.ADAPTER.read_text())
    assert {"model_path", "tp_size", "random_seed", "skip_tokenizer_init"} <= calls.engine_kwargs
    assert calls.methods["generate"][1] == {"input_ids", "sampling_params", "return_logprob"}
    assert {"update_weights_from_tensor", "release_memory_occupation",
            "resume_memory_occupation", "shutdown"} <= set(calls.methods)
    assert {"pause_generation", "continue_generation"} <= calls.optional
    assert {"max_new_tokens", "temperature", "top_p", "stop_token_ids"} == calls.sampling_keys
    assert "output_token_logprobs" in calls.output_keys
