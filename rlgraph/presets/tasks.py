"""The built-in prompt tasks graph.yaml names in `data.task`. Pure Python, seeded."""

from __future__ import annotations

import random
from collections.abc import Callable

from rlgraph.lengths import LengthModel

# Each task draws (prompt, answer) from a seeded RNG. Short, exact answers: a model of about
# a million parameters learns them in seconds of CPU time. A task also receives the graph's
# `data.response_len` as a `LengthModel` (None in the warm start); only `longtail` reads it.


def _arithmetic(rng: random.Random, lengths: LengthModel | None) -> tuple[str, str]:
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return f"{a}+{b}=", str(a + b)


def _add_small(rng: random.Random, lengths: LengthModel | None) -> tuple[str, str]:
    a, b = rng.randint(0, 4), rng.randint(0, 4)
    return f"{a}+{b}=", str(a + b)


def _add2(rng: random.Random, lengths: LengthModel | None) -> tuple[str, str]:
    a, b = rng.randint(0, 49), rng.randint(0, 49)
    return f"{a}+{b}=", str(a + b)


def _calc(rng: random.Random, lengths: LengthModel | None) -> tuple[str, str]:
    a, b = rng.randint(10, 99), rng.randint(2, 9)
    return f"{a}*{b}=", str(a * b)


def _letters(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 4)))


def _copy(rng: random.Random, lengths: LengthModel | None) -> tuple[str, str]:
    s = _letters(rng)
    return f"copy {s}:", s


def _reverse(rng: random.Random, lengths: LengthModel | None) -> tuple[str, str]:
    s = _letters(rng)
    return f"reverse {s}:", s[::-1]


# The long-tail task: the prompt names a target length n, drawn from a long-tailed
# distribution, and the answer is a countdown of exactly n characters in which every
# character says how many remain: r = n, n-1, ..., 1 is written as r's last digit, or as
# the decade's letter when r is a multiple of 10 (a = 10, b = 20, ...). n = 23 is prompted
# "len b3:" and answered "321b987654321a987654321". Each next character is a local rule (the
# previous digit minus one, or the letter before the last letter), so a tiny model learns it,
# and a synchronous batch waits for its longest answer as in real RL.
DECADES = "abcdefghijklmnopqrstuvwxyz"
LONGTAIL_MAX = 10 * len(DECADES) + 9  # the longest length the notation spells
WARM_START_MAX = 128  # the warm start (no response_len) covers 1..128 uniformly


def longtail_code(n: int) -> str:
    """n in the task's notation: its decade letter (if any) and its last digit."""
    tens, units = divmod(n, 10)
    return f"{DECADES[tens - 1] if tens else ''}{units}"


def longtail_answer(n: int) -> str:
    """The n-character countdown that answers target length n."""
    return "".join(DECADES[r // 10 - 1] if r % 10 == 0 else str(r % 10)
                   for r in range(n, 0, -1))


def _longtail(rng: random.Random, lengths: LengthModel | None) -> tuple[str, str]:
    # the warm start (no lengths) sees every length once in a while, the tail included
    n = rng.randint(1, WARM_START_MAX) if lengths is None else lengths.draw(rng, LONGTAIL_MAX)
    return f"len {longtail_code(n)}:", longtail_answer(n)


TaskFn = Callable[[random.Random, "LengthModel | None"], tuple[str, str]]

TASKS: dict[str, TaskFn] = {
    "add_small": _add_small,  # a+b with operands 0..4: 25 facts (the quickstart's task)
    "arithmetic": _arithmetic,  # a+b with one-digit operands: 100 facts
    "add2": _add2,  # a+b with operands below 50
    "calc": _calc,  # a*b, a two-digit, b one-digit: the calculator tool's task
    "copy": _copy,
    "reverse": _reverse,
    "longtail": _longtail,  # countdowns of long-tailed length (data.response_len)
}
