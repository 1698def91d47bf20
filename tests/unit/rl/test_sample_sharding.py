"""Rows are sharded by sample: every data-parallel rank gets a contiguous share within one
row of the others, GRPO group ids travel unchanged, and the joined batch is the batch."""

from __future__ import annotations

import torch

from rlgraph.rl.batch import concat_rows, sample_rows, take_rows
from rlgraph.rl.loss import grpo_advantages


def _batch(prompts: int, samples: int) -> dict:
    rows = prompts * samples
    return {"group": torch.arange(prompts).repeat_interleave(samples),
            "rewards": torch.arange(rows, dtype=torch.float32) % 3,
            "response_mask": torch.ones(rows, 4, dtype=torch.long),
            "prompt_uid": [f"p{i // samples}" for i in range(rows)], "prompt_len": 0}


def test_one_sample_per_rank_suffices_and_groups_survive_the_round_trip() -> None:
    batch = _batch(prompts=3, samples=4)  # 12 samples, fewer prompts than ranks
    for world in (1, 4, 5, 12):
        shares = [sample_rows(batch, rank, world) for rank in range(world)]
        sizes = [s.stop - s.start for s in shares]
        assert sum(sizes) == 12 and max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
        parts = [take_rows(batch, s, regroup=False) for s in shares]
        joined = concat_rows(parts, regroup=False)
        assert torch.equal(joined["group"], batch["group"])
        assert joined["prompt_uid"] == batch["prompt_uid"]
        assert torch.equal(grpo_advantages(joined["rewards"], joined["group"]),
                           grpo_advantages(batch["rewards"], batch["group"]))
