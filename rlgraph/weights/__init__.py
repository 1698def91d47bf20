"""Weight movement, one package and one unit (MiB, as users write `bucket_mb`): buckets and
digests, the receiver's dual buffer, NCCL transfer and its layout. torch only, no ray.

This file imports nothing heavy: the cost model (`rlgraph.pricing.param_update`) reads the unit
from here, so the price and the runtime count a bucket's bytes the same way.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

MIB = 2**20  # bytes in one MiB: the unit of every `bucket_mb` (graph.yaml, cost model, runtime)


def mib_to_bytes(mb: float) -> int:
    """Bytes in `mb` MiB (2^20 bytes each), at least 1."""
    return max(1, int(mb * MIB))


class BucketMiB(BaseModel):
    """Sender and receiver granularity in MiB (dots.rl: param_update_*_bucket_size_mb).

    The one type of a param_update's `bucket_mb`: graph.yaml's section, the plan's weight-sync
    route and the runtime's sender and receiver all hold this. `produce` is the sender's
    bucket (a larger tensor travels alone); `consume` the receiver's copy granularity, in
    which the nccl transport also broadcasts (so produce must be a multiple of it there: the
    compiler checks, `chunks_evenly`). Validated wherever it is built (bounds, no unknown
    key), except `of(number)`: a produce size built in code, whose `consume` is None (whole
    tensors received).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    produce: float = Field(default=512, ge=0.01, le=1e6)
    consume: float | None = Field(default=128, ge=0.01, le=1e6)

    def __init__(self, *sizes: float | None, **fields: Any) -> None:
        """`BucketMiB(produce, consume)` or by name; validated as graph.yaml is."""
        fields.update(zip(("produce", "consume"), sizes, strict=False))
        super().__init__(**fields)

    @field_validator("consume")
    @classmethod
    def _given(cls, value: float | None) -> float:
        if value is None:
            raise ValueError("give the receiver's bucket in MiB")
        return value

    @classmethod
    def of(cls, bucket_mb: BucketMiB | float | object) -> BucketMiB:
        """`bucket_mb` as a BucketMiB: one already, a number (the produce size; whole tensors
        received), or any object with `produce` and `consume`."""
        if isinstance(bucket_mb, BucketMiB):
            return bucket_mb
        if isinstance(bucket_mb, int | float):  # internal sizes, tiny in tests: unchecked
            return cls.model_construct(produce=float(bucket_mb), consume=None)
        return cls(produce=bucket_mb.produce, consume=getattr(bucket_mb, "consume", None))

    @property
    def produce_bytes(self) -> int:
        """The sender's bucket in bytes."""
        return mib_to_bytes(self.produce)

    @property
    def consume_bytes(self) -> int | None:
        """The receiver's copy granularity in bytes (None: whole tensors)."""
        return None if self.consume is None else mib_to_bytes(self.consume)

    def chunks_evenly(self) -> bool:
        """Whether the nccl transport can cut every produce bucket into consume chunks."""
        consume = self.consume_bytes or self.produce_bytes
        return self.produce_bytes >= consume and self.produce_bytes % consume == 0


def resolve_transport(transport: str, device: str) -> str:
    """`auto` -> `nccl` on GPUs, `object_store` on CPU; the others as written."""
    if transport == "auto":
        return "object_store" if device == "cpu" else "nccl"
    return transport
