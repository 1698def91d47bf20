"""What the runtime benchmarks share: where results go and which machine produced them."""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def machine() -> dict:
    """Where the figures come from."""
    return {"platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine()}


def device_info(dry: bool = False) -> dict:
    """Which GPUs ran a GPU benchmark (`dry`: a rehearsal on CPU)."""
    import torch

    if dry or not torch.cuda.is_available():
        return {"gpus": 0, "name": "cpu (dry run)" if dry else "cpu"}
    return {"gpus": torch.cuda.device_count(), "name": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "cuda": torch.version.cuda}


def quickstart_args(description: str, argv: list[str] | None, steps: int | None = None
                    ) -> argparse.Namespace:
    """The options every quickstart benchmark takes: the graph, a finished run to reuse
    instead of running, key=value overrides and (where it applies) the number of steps."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--graph", default=str(ROOT / "graphs" / "quickstart.yaml"))
    if steps is not None:
        parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--run-dir", help="use this finished run instead of running")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides")
    return parser.parse_args(argv)
