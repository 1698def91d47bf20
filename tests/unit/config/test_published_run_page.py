"""docs/how-to/price-a-published-run.md stays true: its graphs compile as the page says, and
every key of its mapping table that a user may type into a graph names its rlgraph key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlgraph.compiler import compile_plan
from rlgraph.config.load import SEED_WORDS, load_spec
from rlgraph.pricing.system import SYSTEMS

PAGE = Path(__file__).resolve().parents[3] / "docs" / "how-to" / "price-a-published-run.md"
BLOCKS = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.S)
TYPED = re.compile(r"[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*")


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: re.search(r"name: (\S+)", b)[1])
def test_the_pages_graphs_compile_as_the_systems_they_name(block: str, tmp_path: Path) -> None:
    path = tmp_path / "graph.yaml"
    path.write_text(block)
    spec = load_spec(path)
    plan = compile_plan(spec)
    assert plan.schedule.period_s > 0 and spec.pricing.system in SYSTEMS
    assert plan.pricing.system == spec.pricing.system
    assert not any("rlgraph's defaults" in line for line in plan.trust.assumptions)  # stated


def test_the_page_walks_through_paired_runs_of_two_frameworks() -> None:
    names = [re.search(r"name: (\S+)", b)[1] for b in BLOCKS]
    assert len(set(names)) == len(names) >= 4
    for pair in ("verl-osp7b", "nemorl-llama8b"):
        assert {f"{pair}-sync", f"{pair}-async"} <= set(names)


def test_every_key_of_the_mapping_table_a_user_may_type_names_its_rlgraph_key() -> None:
    rows = [line for line in PAGE.read_text().splitlines() if line.startswith("| `")]
    assert len(rows) > 15
    typed = [word for row in rows for word in re.findall(r"`([^`]+)`", row.split("|")[1])
             if TYPED.fullmatch(word) and not word.endswith(".py")]
    assert len(typed) > 30
    missing = [w for w in typed if w not in SEED_WORDS and w.rsplit(".", 1)[-1] not in SEED_WORDS]
    assert missing == []
