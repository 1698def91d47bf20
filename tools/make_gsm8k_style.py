"""Write graphs/data/gsm8k-style/{train,test}.parquet: one- and two-step word problems in
verl's GSM8K parquet layout (the columns `examples/data_preprocess/gsm8k.py` writes).

    python tools/make_gsm8k_style.py [--train 2000] [--test 200] [--seed 0]

Each row: `data_source` "openai/gsm8k", `prompt` [{role: user, content: question + verl's
instruction}], `ability` "math", `reward_model` {style: rule, ground_truth: "<number>"},
`extra_info` {split, index, answer, question}; `answer` is a worked solution ending in
`#### <number>`, as GSM8K's. The problems are generated (seeded) from templates over small
numbers, lower case (the character tokenizer of the tiny preset has no capitals), so the
set ships with the repository and the tiny model can learn some of it on a CPU.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

NAMES = ["ann", "bob", "cal", "dee", "eli", "fay", "gus", "ivy", "jon", "kim"]
THINGS = ["apples", "books", "coins", "pens", "cards", "eggs", "shells", "stamps"]
INSTRUCTION = " answer after ####."  # verl: "Let's think step by step and output ..."


def problem(rng: random.Random) -> tuple[str, str, int]:
    """(question, worked answer ending in '#### n', n) of one random template."""
    name, other = rng.sample(NAMES, 2)
    thing = rng.choice(THINGS)
    kind = rng.randrange(4)
    if kind == 0:
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        q = f"{name} has {a} {thing} and gets {b} more. how many {thing} does {name} have?"
        return q, f"{a}+{b}={a + b}. #### {a + b}", a + b
    if kind == 1:
        a = rng.randint(2, 9)
        b = rng.randint(1, a)
        q = f"{name} has {a} {thing} and gives {b} to {other}. how many are left?"
        return q, f"{a}-{b}={a - b}. #### {a - b}", a - b
    if kind == 2:
        a, b = rng.randint(1, 5), rng.randint(1, 4)
        q = f"{name} buys {a} bags with {b} {thing} each. how many {thing} is that?"
        return q, f"{a}*{b}={a * b}. #### {a * b}", a * b
    a, b, c = rng.randint(1, 5), rng.randint(1, 5), rng.randint(1, 5)
    q = f"{name} has {a} {thing}, {other} has {b} and {c} more are found. how many in all?"
    return q, f"{a}+{b}+{c}={a + b + c}. #### {a + b + c}", a + b + c


def rows(split: str, count: int, seed: int) -> list[dict[str, Any]]:
    """`count` rows of one split in verl's layout (seeded by split and index)."""
    out = []
    for index in range(count):
        question, answer, number = problem(random.Random(f"{seed}:{split}:{index}"))
        out.append({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": question + INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(number)},
            "extra_info": {"split": split, "index": index, "answer": answer,
                           "question": question},
        })
    return out


def main() -> None:
    """Write both splits."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--test", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent.parent / "graphs/data/gsm8k-style")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", args.train), ("test", args.test)):
        path = args.out / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(rows(split, count, args.seed)), path)
        print(f"wrote {path} ({count} rows)")


if __name__ == "__main__":
    main()
