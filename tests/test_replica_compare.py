"""The pure comparison behind ``runnel replicas verify`` (runnel/replica_compare.py), on
synthetic batch lists: what counts, what diverges, and how it is described."""

from __future__ import annotations

import dataclasses

from support import assert_imports_none_of

from runnel.replica_compare import (
    BatchMeta,
    Divergence,
    ReplicaBatches,
    compacted_end,
    compare_batches,
    compare_replicas,
    comparison_range,
)


def batches(count: int, *, start: int = 0, records: int = 2, epoch: int = 1) -> list[BatchMeta]:
    """``count`` batches of ``records`` offsets each from ``start``; a made-up CRC from the
    base offset (the epoch is not covered by a batch's CRC), a size from the record count."""
    out = []
    for i in range(count):
        base = start + i * records
        out.append(BatchMeta(base, base + records - 1, epoch, 0xC0DE0000 + base, 61 + 20 * records))
    return out


def replica(
    broker_id: int, metas: list[BatchMeta], *, hw: int | None = None, start: int = 0
) -> ReplicaBatches:
    end = metas[-1].last_offset + 1 if metas else start
    return ReplicaBatches(broker_id, start, end if hw is None else hw, metas)


def only(divergences: tuple[Divergence, ...]) -> Divergence:
    (divergence,) = divergences
    return divergence


def test_equal_replicas_agree_and_every_batch_in_range_is_counted() -> None:
    same = batches(10)
    result = compare_replicas([replica(1, same), replica(2, same), replica(3, same)], 1)
    assert (result.start_offset, result.end_offset, result.batches_compared) == (0, 20, 10)
    assert result.divergences == ()


def test_a_different_crc_at_one_offset_is_reported_with_both_values() -> None:
    theirs = batches(10)
    theirs[4] = theirs[4]._replace(crc=0xDEADBEEF)
    divergence = only(
        compare_replicas([replica(1, batches(10)), replica(2, theirs)], 1).divergences
    )
    assert (divergence.reference, divergence.replica, divergence.offset) == (1, 2, 8)
    assert divergence.fields == ("crc",)
    assert divergence.detail == "batch at 8: crc 0xc0de0008 on 1, 0xdeadbeef on 2"


def test_a_different_leader_epoch_is_a_divergence_and_only_the_first_is_reported() -> None:
    theirs = batches(3) + batches(7, start=6, epoch=2)
    divergence = only(
        compare_replicas([replica(1, batches(10)), replica(2, theirs)], 1).divergences
    )
    assert divergence.offset == 6 and divergence.fields == ("leader_epoch",)
    assert divergence.detail == "batch at 6: leader_epoch 1 on 1, 2 on 2"


def test_missing_and_extra_batches_name_the_replica_that_has_them() -> None:
    full = batches(10)
    ours = full[:2] + full[3:]  # the reference lacks 4-5
    fewer = full[:2] + full[4:]  # lacks 4-5 and 6-7
    result = compare_replicas([replica(1, ours), replica(2, full), replica(3, fewer)], 1)
    more, missing = result.divergences
    assert (more.replica, more.offset, more.fields) == (2, 4, ("extra",))
    assert more.detail == "batch 4-5 of 2 is not on 1"
    assert (missing.replica, missing.offset, missing.fields) == (3, 6, ("missing",))
    assert missing.detail == "batch 6-7 of 1 is missing on 3"


def test_a_replica_missing_the_tail_below_its_claimed_high_watermark_diverges() -> None:
    short = replica(2, batches(6), hw=20)  # it says 20 is committed, but holds up to 11
    divergence = only(compare_replicas([replica(1, batches(10)), short], 1).divergences)
    assert (divergence.offset, divergence.fields) == (12, ("missing",))


def test_a_replica_with_a_lower_high_watermark_bounds_the_range_and_is_no_divergence() -> None:
    lagging = replica(2, batches(10), hw=9)  # 8-9 holds the HW: batches up to 6-7 count
    result = compare_replicas([replica(1, batches(10)), lagging], 1)
    assert (result.end_offset, result.batches_compared, result.divergences) == (9, 4, ())
    behind = replica(3, batches(2), hw=4)  # has not even fetched what follows
    result = compare_replicas([replica(1, batches(10)), behind], 1)
    assert (result.end_offset, result.batches_compared, result.divergences) == (4, 2, ())


def test_history_only_some_replicas_keep_is_not_compared() -> None:
    trimmed = replica(2, batches(7, start=6), start=7)  # its log starts inside batch 6-7
    result = compare_replicas([replica(1, batches(10)), trimmed], 1)
    assert (result.start_offset, result.batches_compared, result.divergences) == (7, 7, ())


def test_nothing_is_compared_when_no_offset_is_claimed_by_every_replica() -> None:
    ahead = replica(2, batches(2, start=30), start=30)
    assert comparison_range([replica(1, batches(10)), ahead]) == (30, 20)
    result = compare_replicas([replica(1, batches(10)), ahead], 1)
    assert (result.batches_compared, result.divergences) == (0, ())


def test_below_where_a_replica_may_be_compacted_only_offsets_and_epochs_count() -> None:
    """Each replica compacts on its own: below the largest compacted_below a batch may be
    rewritten (other CRC and size) or gone on either side, and that is no divergence; its
    offsets and leader epoch never change, and batches never move, so those still count."""
    compacted = [b._replace(crc=0xC1EA0000 + b.base_offset, size_bytes=70) for b in batches(4)]
    compacted += batches(6, start=8)
    del compacted[1]  # 2-3: a batch the cleaner removed whole
    as_appended = ReplicaBatches(1, 0, 20, batches(10))
    cleaned = ReplicaBatches(2, 0, 20, compacted, compacted_below=8)
    assert comparison_range([as_appended, cleaned]) == (0, 20)
    assert compacted_end([as_appended, cleaned]) == 8
    result = compare_replicas([as_appended, cleaned], 1)
    assert (result.start_offset, result.batches_compared, result.divergences) == (0, 10, ())
    assert compare_replicas([cleaned, as_appended], 2).divergences == ()  # either way round

    def diverging(changed: list[BatchMeta]) -> Divergence:
        return only(
            compare_replicas(
                [as_appended, dataclasses.replace(cleaned, batches=changed)], 1
            ).divergences
        )

    # Above it a difference is still one, in any field.
    assert diverging([*compacted[:-1], compacted[-1]._replace(size_bytes=7)]).offset == 18
    # Below it another leader epoch, or other offsets, are a divergence.
    epoch = diverging([compacted[0], compacted[1]._replace(leader_epoch=2), *compacted[2:]])
    assert (epoch.offset, epoch.fields) == (4, ("leader_epoch",))
    assert "below where compaction reached" in epoch.detail
    last = diverging([compacted[0]._replace(last_offset=0), *compacted[1:]])
    assert (last.offset, last.fields) == (0, ("last_offset",))
    moved = [compacted[0], BatchMeta(3, 5, 1, 1, 61), *compacted[2:]]  # 3-5 across 2-3
    overlap = diverging(moved)
    assert (overlap.offset, overlap.fields) == (2, ("overlap",))
    assert overlap.detail == (
        "batch 2-3 of 1 overlaps batch 3-5 of 2 (below where compaction reached)"
    )
    moved_first = dataclasses.replace(cleaned, batches=moved)
    swapped = only(compare_replicas([moved_first, as_appended], 2).divergences)
    assert (swapped.offset, swapped.fields) == (2, ("overlap",))  # the other way round
    # The largest compacted_below counts.
    other = ReplicaBatches(3, 0, 20, batches(10), compacted_below=14)
    assert compacted_end([as_appended, cleaned, other]) == 14


def test_the_reference_is_whichever_replica_is_named() -> None:
    theirs = batches(10)
    theirs[0] = theirs[0]._replace(size_bytes=1)
    result = compare_replicas([replica(1, batches(10)), replica(2, theirs)], 2)
    divergence = only(result.divergences)
    assert (divergence.reference, divergence.replica) == (2, 1)
    assert divergence.detail == "batch at 0: size_bytes 1 on 2, 101 on 1"


def test_compare_batches_looks_only_at_batches_ending_in_the_range() -> None:
    ours, theirs = batches(10), batches(10)
    theirs[9] = theirs[9]._replace(crc=1)  # 18-19: outside [4, 18)
    compared, divergences = compare_batches(1, {1: ours, 2: theirs}, 4, 18)
    assert (compared, divergences) == (7, [])


def test_the_comparison_is_pure() -> None:
    assert_imports_none_of(
        ["runnel/replica_compare.py"], {"asyncio", "grpc", "os", "socket", "time", "random"}
    )
