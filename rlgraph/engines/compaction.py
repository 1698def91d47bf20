"""Slot compaction for the static decoder: decode only as many slots as are occupied.

A static-shape decode step computes (and attends) for every slot it covers, finished ones
included. In a long-tailed batch most slots finish early and the last rows decode for
thousands of steps at the cost of the full batch. `SlotWidths` picks, per decode call, the
smallest *width* (a power of two, or all slots) that holds the occupied slots, and the moves
that bring occupied slots at or beyond that width down into free slots below it; the decoder
then runs (and captures as a CUDA graph) the step over slots [0, width) only. Widths are
powers of two so the captured shapes stay few; a narrower width attends in coarser length
blocks (`block`), so that padding costs at most what it costs at full width and the number
of (width, attention length) graphs stays about twice that of one width.
"""

from __future__ import annotations


class SlotWidths:
    """The decode widths of an engine of `slots` slots and `max_len` positions."""

    def __init__(self, slots: int, max_len: int, attn_block: int, min_width: int = 16,
                 enabled: bool = True):
        self.slots, self.max_len, self.attn_block = slots, max_len, attn_block
        widths = {slots}
        w = max(1, min_width)
        while enabled and w < slots:
            widths.add(w)
            w *= 2
        self.widths = sorted(widths)

    def width_for(self, occupied: int) -> int:
        """The narrowest width that holds `occupied` slots."""
        return next(w for w in self.widths if w >= occupied)

    def block(self, width: int) -> int:
        """Attention-length granularity at `width`: attn_block times the largest power of two
        <= slots / width (the padded K/V a step reads stays at most that of full width)."""
        ratio = 1
        while ratio * 2 * width <= self.slots:
            ratio *= 2
        return min(self.max_len, self.attn_block * ratio)

    def attn_len(self, width: int, need: int) -> int:
        """Positions a step at `width` attends over when the longest live row needs `need`."""
        b = self.block(width)
        return min(self.max_len, -(-need // b) * b)

    def keys(self) -> list[tuple[int, int]]:
        """Every (width, attention length) a decoder of these widths can run."""
        out = []
        for w in self.widths:
            b = self.block(w)
            out += [(w, min(self.max_len, k * b)) for k in range(1, -(-self.max_len // b) + 1)]
        return sorted(set(out))

    @staticmethod
    def moves(occupied: list[int], width: int) -> list[tuple[int, int]]:
        """(from, to) slot moves that bring every occupied slot below `width` (into the lowest
        free slots); empty when they already are. `occupied` must fit in `width`."""
        taken = set(occupied)
        high = sorted(b for b in occupied if b >= width)
        free = [b for b in range(width) if b not in taken]
        if len(high) > len(free):
            raise ValueError(f"{len(occupied)} occupied slots do not fit in width {width}")
        return list(zip(high, free))
