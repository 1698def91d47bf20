"""The sglang adapter: a clear error without sglang; a real engine only where sglang exists."""

from __future__ import annotations

import importlib.util

import pytest

from rlgraph.errors import MissingDependencyError

HAS_SGLANG = importlib.util.find_spec("sglang") is not None


def test_module_imports_without_sglang() -> None:
    import rlgraph.engines.sglang_engine as mod

    assert hasattr(mod, "SGLangEngine")


@pytest.mark.skipif(HAS_SGLANG, reason="checks the error raised when sglang is missing")
def test_missing_sglang_is_a_clear_error() -> None:
    from rlgraph.engines.sglang_engine import SGLangEngine

    with pytest.raises(MissingDependencyError, match=r"pip install rlgraph\[sglang\]"):
        SGLangEngine("any/model")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_SGLANG, reason="sglang is not installed (it cannot be on CI or on "
                    "the lent GPU machines); this test runs where it is")
def test_sglang_generate_pause_resume_and_reload() -> None:  # pragma: no cover
    import os

    import torch

    from rlgraph.engines.sglang_engine import SGLangEngine

    if not torch.cuda.is_available():
        pytest.skip("sglang needs a CUDA GPU")
    path = os.environ.get("RLGRAPH_SGLANG_TEST_MODEL")
    if not path:
        pytest.skip("set RLGRAPH_SGLANG_TEST_MODEL to a local HF model directory")
    eng = SGLangEngine(path, mem_fraction_static=0.3)
    try:
        (out,) = eng.generate([[1, 2, 3, 4]], max_new_tokens=8, temperature=0.0)
        assert len(out["tokens"]) == 8 and len(out["logprobs"]) == 8
        eng.pause("retract")
        eng.resume()
        eng.release_memory()
        eng.resume_memory()
        (again,) = eng.generate([[1, 2, 3, 4]], max_new_tokens=8, temperature=0.0)
        assert again["tokens"] == out["tokens"]
    finally:
        eng.shutdown()
