"""Bounded channels between nodes: one per data edge, capacity from `Plan.channels`.

A channel holds the outputs (in the Ray runtime: object references, never the data itself)
of a producer's steps until the consumer takes them, at most `capacity` at a time. A full
channel keeps its producer in WAITING_OUTPUT, which is how back pressure bounds how far a
fast node can run ahead and how much memory in-flight batches hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class ChannelError(RuntimeError):
    """A put into a full channel or a take of a step that is not there: a runtime bug."""


@dataclass
class Channel:
    """A bounded FIFO of (step, payload) from `src` to `dst`."""

    src: str
    dst: str
    capacity: int
    items: dict[int, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ChannelError(f"channel {self.src}->{self.dst} needs capacity >= 1")

    @property
    def name(self) -> str:
        """`src->dst`, the key used in `Plan.channels`."""
        return f"{self.src}->{self.dst}"

    def has_room(self) -> bool:
        """True when one more step fits."""
        return len(self.items) < self.capacity

    def put(self, step: int, payload: Any) -> None:
        """Add step `step`'s payload; the caller checked `has_room`."""
        if not self.has_room():
            raise ChannelError(f"channel {self.name} is full ({self.capacity})")
        if step in self.items:
            raise ChannelError(f"channel {self.name} already holds step {step}")
        self.items[step] = payload

    def has(self, step: int) -> bool:
        """True when step `step`'s payload is waiting."""
        return step in self.items

    def take(self, step: int) -> Any:
        """Remove and return step `step`'s payload."""
        if step not in self.items:
            raise ChannelError(f"channel {self.name} has no step {step}")
        return self.items.pop(step)

    def __len__(self) -> int:
        return len(self.items)
