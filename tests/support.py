"""Helpers shared by the tests: a settable clock and a compact batch builder."""

from __future__ import annotations

from storage.batch import CompressionType
from storage.records import RecordInput, build_batch


class FakeClock:
    """A settable millisecond clock so time-based behaviour is deterministic."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


def make_batch(
    values: list[bytes],
    *,
    timestamp_ms: int = 1_700_000_000_000,
    base_offset: int = 0,
    keys: list[bytes | None] | None = None,
    compression: CompressionType = CompressionType.NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
) -> bytes:
    keys = keys or [None] * len(values)
    return build_batch(
        [
            RecordInput(k, v, timestamp_ms + i)
            for i, (k, v) in enumerate(zip(keys, values, strict=True))
        ],
        base_offset=base_offset,
        compression=compression,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        partition_leader_epoch=partition_leader_epoch,
    )
