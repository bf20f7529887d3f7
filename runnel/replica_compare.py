"""Comparing the replicas of one partition by their batch metadata (``runnel replicas verify``).

How this works. Every replica of a partition must hold the same batches below the high
watermark: same base and last offsets, leader epoch, CRC and size (a follower copies the
leader's batches byte for byte). Replicas keep different amounts of history (retention runs
on each broker) and know different high watermarks, so only the range every replica claims
is compared (``comparison_range``): from the largest log start offset to the smallest high
watermark. A batch is in the range when its last offset is; a batch holding the largest log
start offset still exists whole on every replica, since logs are deleted a segment at a time.
Compaction runs on each broker on its own too: below a replica's ``compacted_below`` its
batches may have been rewritten or removed (by its cleaner, or its leader's), so two correct
replicas of a compacted partition may differ there in CRC and size, and either may lack a
batch the other holds. A cleaner never moves, splits or merges a batch, nor changes its
offsets or leader epoch, though: below the largest ``compacted_below`` batches are compared
by those alone (``first_compacted_difference``), above it byte for byte.

``compare_batches`` lines each replica's batches up against a reference replica's (the
leader, when it answered), in offset order, and reports the first place where each replica
differs: a batch missing, a batch the reference does not have, or the same base offset with
other fields. Past the first difference the two logs have forked and the pairing means
nothing, so nothing more is reported for that replica. ``compare_replicas`` does both steps
for complete lists; ``runnel replicas verify`` calls ``compare_batches`` on windows of the
lists instead, to bound its memory.

Everything here is pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import zip_longest
from typing import NamedTuple, Protocol

from storage.errors import InvariantViolation

__all__ = [
    "BatchMeta",
    "Comparison",
    "Divergence",
    "ReplicaBatches",
    "ReplicaOffsets",
    "compare_batches",
    "compacted_end",
    "compare_replicas",
    "comparison_range",
    "first_compacted_difference",
    "first_difference",
    "in_range",
]

COMPARED_FIELDS = ("last_offset", "leader_epoch", "crc", "size_bytes")
COMPACTED_FIELDS = ("last_offset", "leader_epoch")  # what compaction keeps of a batch


class BatchMeta(NamedTuple):
    """What a replica holds of one batch (``proto/replica.proto``'s BatchMeta)."""

    base_offset: int
    last_offset: int
    leader_epoch: int
    crc: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class ReplicaBatches:
    """One replica's offsets and its batches in offset order (from its log start, or any
    superset of the compared range)."""

    broker_id: int
    log_start_offset: int
    high_watermark: int
    batches: Sequence[BatchMeta]
    compacted_below: int = 0


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where ``replica`` first differs from ``reference``: at ``offset`` (a base offset),
    in ``fields`` ("missing": the reference has a batch the replica lacks, "extra": the
    other way round, else the names of the fields that differ), as ``detail`` says."""

    reference: int
    replica: int
    offset: int
    fields: tuple[str, ...]
    detail: str


@dataclass(frozen=True, slots=True)
class Comparison:
    """The outcome for one partition: batches in [start_offset, end_offset) compared."""

    start_offset: int
    end_offset: int
    batches_compared: int  # the reference's batches in the range
    divergences: tuple[Divergence, ...]


class ReplicaOffsets(Protocol):
    @property
    def log_start_offset(self) -> int: ...

    @property
    def high_watermark(self) -> int: ...

    @property
    def compacted_below(self) -> int: ...


def comparison_range(replicas: Iterable[ReplicaOffsets]) -> tuple[int, int]:
    """[largest log start offset, smallest high watermark): what every replica claims.
    Empty (start >= end) when a replica's log starts above another's high watermark."""
    replicas = list(replicas)
    if not replicas:
        return 0, 0
    start = max(r.log_start_offset for r in replicas)
    return start, min(r.high_watermark for r in replicas)


def compacted_end(replicas: Iterable[ReplicaOffsets]) -> int:
    """The largest ``compacted_below``: below it replicas are compared as compaction leaves
    them (``first_compacted_difference``)."""
    return max((r.compacted_below for r in replicas), default=0)


def in_range(batches: Iterable[BatchMeta], start: int, end: int) -> list[BatchMeta]:
    """The batches whose last offset lies in [start, end)."""
    return [b for b in batches if start <= b.last_offset < end]


Pair = tuple[BatchMeta | None, BatchMeta | None]  # (the reference's, the replica's)


def first_difference(reference: Sequence[BatchMeta], other: Sequence[BatchMeta]) -> Pair | None:
    """The first place ``other`` differs from ``reference`` (both in offset order): the two
    batches with the same base offset that differ, or a batch of one with None for the
    other, which lacks it. None when the lists are equal."""
    for ours, theirs in zip_longest(reference, other):
        if ours == theirs:
            continue
        if theirs is None or (ours is not None and ours.base_offset < theirs.base_offset):
            return ours, None
        if ours is None or theirs.base_offset < ours.base_offset:
            return None, theirs
        return ours, theirs
    return None


def first_compacted_difference(
    reference: Sequence[BatchMeta], other: Sequence[BatchMeta]
) -> tuple[BatchMeta, BatchMeta] | None:
    """Where ``other`` differs from ``reference`` (both in offset order) in a way compaction
    cannot explain: two batches with the same base offset but another last offset or leader
    epoch, or two batches that overlap without starting at the same offset. A batch only
    one of them holds is fine (the other's cleaner removed it), and so are other CRCs and
    sizes (rewritten). None when nothing such is found."""
    i = j = 0
    while i < len(reference) and j < len(other):
        ours, theirs = reference[i], other[j]
        if ours.base_offset == theirs.base_offset:
            if (ours.last_offset, ours.leader_epoch) != (theirs.last_offset, theirs.leader_epoch):
                return ours, theirs
            i, j = i + 1, j + 1
        elif ours.base_offset < theirs.base_offset:
            if ours.last_offset >= theirs.base_offset:
                return ours, theirs
            i += 1
        else:
            if theirs.last_offset >= ours.base_offset:
                return ours, theirs
            j += 1
    return None


def compare_batches(
    reference: int,
    batches: Mapping[int, Sequence[BatchMeta]],
    start: int,
    end: int,
    compacted_below: int = 0,
) -> tuple[int, list[Divergence]]:
    """Compare every replica's batches in [start, end) with ``reference``'s (a key of
    ``batches``, by broker id): those ending below ``compacted_below`` as compaction leaves
    them, the rest byte for byte. Returns (the reference's batches compared, divergences)."""
    ours = in_range(batches[reference], start, end)
    split = max(start, min(compacted_below, end))
    ours_compacted, ours_as_appended = in_range(ours, start, split), in_range(ours, split, end)
    divergences = []
    for broker_id in sorted(batches):
        if broker_id == reference:
            continue
        theirs = in_range(batches[broker_id], start, end)
        compacted = first_compacted_difference(ours_compacted, in_range(theirs, start, split))
        if compacted is not None:
            divergences.append(_compacted_divergence(reference, broker_id, *compacted))
            continue
        found = first_difference(ours_as_appended, in_range(theirs, split, end))
        if found is not None:
            divergences.append(_divergence(reference, broker_id, *found))
    return len(ours), divergences


def _divergence(
    reference: int, replica: int, ours: BatchMeta | None, theirs: BatchMeta | None
) -> Divergence:
    if ours is not None and theirs is not None:
        fields = tuple(f for f in COMPARED_FIELDS if getattr(ours, f) != getattr(theirs, f))
        shown = ", ".join(
            f"{f} {_show(f, ours)} on {reference}, {_show(f, theirs)} on {replica}" for f in fields
        )
        detail = f"batch at {ours.base_offset}: {shown}"
        return Divergence(reference, replica, ours.base_offset, fields, detail)
    if ours is not None:
        detail = f"batch {_span(ours)} of {reference} is missing on {replica}"
        return Divergence(reference, replica, ours.base_offset, ("missing",), detail)
    if theirs is not None:
        detail = f"batch {_span(theirs)} of {replica} is not on {reference}"
        return Divergence(reference, replica, theirs.base_offset, ("extra",), detail)
    raise InvariantViolation("a difference has a batch on one side at least")


def _compacted_divergence(
    reference: int, replica: int, ours: BatchMeta, theirs: BatchMeta
) -> Divergence:
    if ours.base_offset != theirs.base_offset:
        detail = (
            f"batch {_span(ours)} of {reference} overlaps batch {_span(theirs)} of {replica} "
            "(below where compaction reached)"
        )
        return Divergence(
            reference, replica, min(ours.base_offset, theirs.base_offset), ("overlap",), detail
        )
    fields = tuple(f for f in COMPACTED_FIELDS if getattr(ours, f) != getattr(theirs, f))
    shown = ", ".join(
        f"{f} {getattr(ours, f)} on {reference}, {getattr(theirs, f)} on {replica}" for f in fields
    )
    detail = f"batch at {ours.base_offset}: {shown} (below where compaction reached)"
    return Divergence(reference, replica, ours.base_offset, fields, detail)


def compare_replicas(replicas: Sequence[ReplicaBatches], reference: int) -> Comparison:
    """Compare complete lists: the range every replica claims, against ``reference``."""
    start, end = comparison_range(replicas)
    by_id = {r.broker_id: r.batches for r in replicas}
    compared, divergences = compare_batches(reference, by_id, start, end, compacted_end(replicas))
    return Comparison(start, end, compared, tuple(divergences))


def _span(batch: BatchMeta) -> str:
    return f"{batch.base_offset}-{batch.last_offset}"


def _show(field: str, batch: BatchMeta) -> str:
    value = getattr(batch, field)
    return f"{value:#010x}" if field == "crc" else str(value)
