"""Weight movement, one package and one unit (MiB, as users write `bucket_mb`): buckets and
digests, the receiver's dual buffer, NCCL transfer and its layout. torch only, no ray.

This file imports nothing heavy: the cost model (`rlgraph.pricing.param_update`) reads the unit
from here, so the price and the runtime count a bucket's bytes the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 2**20  # bytes in one MiB: the unit of every `bucket_mb` (graph.yaml, cost model, runtime)


def mib_to_bytes(mb: float) -> int:
    """Bytes in `mb` MiB (2^20 bytes each), at least 1."""
    return max(1, int(mb * MIB))


@dataclass(frozen=True)
class BucketMiB:
    """A param_update's `bucket_mb`, in MiB: `produce`, the sender's bucket (a larger tensor
    travels alone), and `consume`, the receiver's copy granularity (None: whole tensors; the
    nccl transport then broadcasts whole produce buckets)."""

    produce: float
    consume: float | None = None

    @classmethod
    def of(cls, bucket_mb: BucketMiB | float | object) -> BucketMiB:
        """`bucket_mb` as a BucketMiB: one already, a number (the produce size), or any
        object with `produce` and `consume` (the spec's `bucket_mb` section)."""
        if isinstance(bucket_mb, BucketMiB):
            return bucket_mb
        if isinstance(bucket_mb, int | float):
            return cls(float(bucket_mb))
        consume = getattr(bucket_mb, "consume", None)
        return cls(float(bucket_mb.produce), None if consume is None else float(consume))

    @property
    def produce_bytes(self) -> int:
        """The sender's bucket in bytes."""
        return mib_to_bytes(self.produce)

    @property
    def consume_bytes(self) -> int | None:
        """The receiver's copy granularity in bytes (None: whole tensors)."""
        return None if self.consume is None else mib_to_bytes(self.consume)
