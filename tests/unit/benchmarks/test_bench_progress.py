"""bench.common.mirrored: a benchmark cut off mid-mode keeps the steps it finished."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from bench_support import bench_module

bench_common = bench_module("common")
mirrored = bench_common.mirrored


def test_a_mode_cut_off_keeps_its_finished_steps(tmp_path: Path) -> None:
    src, dst = tmp_path / "metrics.jsonl", tmp_path / "out" / "mode.metrics.jsonl"
    dst.parent.mkdir()
    with pytest.raises(KeyboardInterrupt), mirrored(src, dst, every_s=0.02):
        src.write_text('{"step": 0}\n')
        deadline = time.time() + 5
        while time.time() < deadline and not (  # copied while it runs (whole: a copy may
                dst.is_file() and dst.read_text() == '{"step": 0}\n'):  # catch a half write)
            time.sleep(0.01)
        assert dst.read_text() == '{"step": 0}\n'
        src.write_text('{"step": 0}\n{"step": 1}\n')
        raise KeyboardInterrupt  # a device call's time limit
    assert dst.read_text().count("step") == 2  # the last finished step is kept


def test_a_completed_mode_leaves_no_progress_file(tmp_path: Path) -> None:
    src, dst = tmp_path / "metrics.jsonl", tmp_path / "mode.metrics.jsonl"
    with mirrored(src, dst, every_s=0.01):
        src.write_text('{"step": 0}\n')
        time.sleep(0.05)
    assert not dst.exists()  # its figures are in the result file
