"""ListOffsets' answers where Apache Kafka's rules are easy to miss: a new leader whose high
watermark lags its epoch's start, special timestamps per version, a partition named twice,
and the leader epoch of an answer: the one that goes with the offset, not the current one
(or -1 for "not found").

The in-process leader of dispatch_leader.py ("orders" partitions 0 and 1, led here, broker 2
following); acks=1 appends, and a follower fetch moves the high watermark.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dispatch_leader import FETCH_V, FOLLOWER, ME, TOPIC_ID, DispatchLeader

from broker.protocol import ApiKey, ErrorCode
from controller import records as rec
from controller.image import MetadataDelta, MetadataImage

BASE_MS = 1_700_000_000_000  # make_batch's first record timestamp


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[DispatchLeader]:
    made = DispatchLeader(tmp_path / "data", partitions=2)
    yield made
    made.logs.shutdown()


def list_offsets(
    leader: DispatchLeader, asks: list[tuple[int, int]], *, version: int = 7
) -> list[tuple[int, int, int, int]]:
    """(error code, offset, timestamp, leader epoch) of each (partition, timestamp) asked."""
    partitions = [{"partition_index": p, "timestamp": t} for p, t in asks]
    body = {
        "replica_id": -1,
        "isolation_level": 0,
        "topics": [{"name": "orders", "partitions": partitions}],
    }
    (topic,) = leader.send(ApiKey.LIST_OFFSETS, version, body).topics
    return [(p.error_code, p.offset, p.timestamp, p.leader_epoch) for p in topic.partitions]


def each(
    leader: DispatchLeader, asks: list[tuple[int, int]], *, version: int = 7
) -> list[tuple[int, int, int, int]]:
    """``list_offsets`` of each ask in a request of its own (a partition may be named only
    once in a request)."""
    return [list_offsets(leader, [ask], version=version)[0] for ask in asks]


def follower_fetch(leader: DispatchLeader, offset: int, *, leader_epoch: int = 0) -> None:
    """The follower reads "orders" 0 from ``offset``: the leader learns it has everything
    below it (the high watermark may move)."""
    fields = {"fetch_offset": offset, "current_leader_epoch": leader_epoch}
    body = leader.fetch_body({0: fields}, replica_id=FOLLOWER)
    (topic,) = leader.send(ApiKey.FETCH, FETCH_V, body).responses
    assert topic.partitions[0].error_code == ErrorCode.NONE


def with_leader_epoch(epoch: int) -> MetadataImage:
    """ "orders" 0 and 1 led here again, at leader epoch ``epoch``."""
    records: list[Any] = [
        rec.register_broker(ME, 0, b"i" * 16, [("CLIENT", "127.0.0.1", 9092)], fenced=False),
        rec.register_broker(FOLLOWER, 0, b"j" * 16, [("CLIENT", "127.0.0.1", 9093)], fenced=False),
        rec.topic("orders", TOPIC_ID),
    ]
    records += [
        rec.partition(
            TOPIC_ID, p, [ME, FOLLOWER], [ME, FOLLOWER], leader=ME,
            leader_epoch=epoch, partition_epoch=epoch,
        )
        for p in range(2)
    ]  # fmt: skip
    delta = MetadataDelta(MetadataImage.EMPTY)
    for offset, record in enumerate(records):
        delta.replay(record, offset)
    return delta.apply()


def test_a_new_leader_below_its_epoch_start_answers_offset_not_available(
    leader: DispatchLeader,
) -> None:
    """Kafka's Partition.fetchOffsetForTimestamp: until the high watermark reaches the new
    epoch's start offset, a consumer's "latest", and a timestamp lookup finding nothing
    below the high watermark, are OFFSET_NOT_AVAILABLE (LEADER_NOT_AVAILABLE below v5);
    "earliest", and a lookup found below it, are answered."""
    leader.produce([b"a"], acks=1)
    follower_fetch(leader, 0)
    follower_fetch(leader, 1)  # HW 1
    leader.produce([b"b"], acks=1)  # offset 1, timestamp BASE_MS, not committed
    leader.image = with_leader_epoch(1)
    leader.replicas.apply(leader.image)  # epoch 1 starts at offset 2; the HW is still 1
    (partition, _) = sorted(leader.replicas.partitions(), key=lambda p: p.key)
    assert (partition.leader_epoch, partition.high_watermark) == (1, 1)
    lagging = ErrorCode.OFFSET_NOT_AVAILABLE
    assert each(leader, [(0, -1), (0, -2), (0, BASE_MS - 1), (0, BASE_MS + 1)]) == [
        (lagging, -1, -1, -1),
        (ErrorCode.NONE, 0, -1, 0),  # the log start's epoch
        (ErrorCode.NONE, 0, BASE_MS, 0),  # offset 0, below the HW, written at epoch 0
        (lagging, -1, -1, -1),  # nothing at or after it below the HW
    ]
    assert list_offsets(leader, [(0, -1)], version=4) == [
        (ErrorCode.LEADER_NOT_AVAILABLE, -1, -1, -1)
    ]
    assert list_offsets(leader, [(1, -1)]) == [(ErrorCode.NONE, 0, -1, 1)]  # empty: caught up
    follower_fetch(leader, 2, leader_epoch=1)  # the HW reaches the epoch's start
    assert each(leader, [(0, -1), (0, BASE_MS + 1)]) == [
        (ErrorCode.NONE, 2, -1, 1),
        (ErrorCode.NONE, -1, -1, -1),
    ]


def test_special_timestamps_are_checked_against_the_request_version(
    leader: DispatchLeader,
) -> None:
    """Kafka's ReplicaManager.isListOffsetsTimestampUnsupported: -3 from v7, -4 from v8, -5
    from v9 (above runnel's v7), and no other negative timestamp at all."""
    leader.produce([b"a"], acks=1)
    follower_fetch(leader, 0)
    follower_fetch(leader, 1)
    unsupported = (ErrorCode.UNSUPPORTED_VERSION, -1, -1, -1)
    asks = [(0, -3), (0, -4), (0, -5), (0, -6), (0, -7), (0, -2)]
    assert each(leader, asks) == [
        (ErrorCode.NONE, 0, BASE_MS, 0),
        unsupported,
        unsupported,
        unsupported,
        unsupported,
        (ErrorCode.NONE, 0, -1, 0),
    ]
    assert each(leader, [(0, -3), (0, -1)], version=6) == [
        unsupported,
        (ErrorCode.NONE, 1, -1, 0),
    ]


def test_a_partition_named_twice_is_invalid_request_for_each_copy(
    leader: DispatchLeader,
) -> None:
    """Kafka's ListOffsetsRequest.duplicatePartitions, answered before anything else."""
    assert list_offsets(leader, [(0, -1), (1, -2), (0, -2), (1, -9)]) == [
        (ErrorCode.INVALID_REQUEST, -1, -1, -1),
        (ErrorCode.INVALID_REQUEST, -1, -1, -1),
        (ErrorCode.INVALID_REQUEST, -1, -1, -1),
        (ErrorCode.INVALID_REQUEST, -1, -1, -1),
    ]
    assert list_offsets(leader, [(0, -1), (1, -1)]) == [
        (ErrorCode.NONE, 0, -1, 0),
        (ErrorCode.NONE, 0, -1, 0),
    ]


def test_an_offset_not_found_carries_no_leader_epoch(leader: DispatchLeader) -> None:
    """Kafka answers "no such offset" with buildErrorResponse(Errors.NONE): offset,
    timestamp and leader epoch all -1."""
    leader.produce([b"a"], acks=1)
    follower_fetch(leader, 0)
    follower_fetch(leader, 1)
    assert each(leader, [(0, BASE_MS + 10), (1, -3), (0, BASE_MS)]) == [
        (ErrorCode.NONE, -1, -1, -1),
        (ErrorCode.NONE, -1, -1, -1),  # an empty partition has no largest timestamp
        (ErrorCode.NONE, 0, BASE_MS, 0),
    ]


def test_a_found_offset_carries_the_leader_epoch_that_goes_with_it(
    leader: DispatchLeader,
) -> None:
    """Kafka (UnifiedLog.fetchOffsetByTimestamp, Partition.fetchOffsetForTimestamp): earliest
    answers the epoch of the log start offset, a record found (by timestamp or as the
    largest timestamp) the leader epoch of its batch, and latest the current leader epoch;
    a consumer validating its reset position (KIP-320) against the current epoch instead
    could miss a truncation."""
    leader.produce([b"a"], acks=1)  # offset 0 at epoch 0, timestamp BASE_MS
    leader.image = with_leader_epoch(1)
    leader.replicas.apply(leader.image)
    leader.produce([b"b", b"c"], acks=1)  # offsets 1, 2 at epoch 1: BASE_MS, BASE_MS + 1
    leader.image = with_leader_epoch(2)
    leader.replicas.apply(leader.image)  # nothing written at epoch 2
    follower_fetch(leader, 3, leader_epoch=2)  # the HW reaches the log end
    asks = [(0, -2), (0, BASE_MS), (0, BASE_MS + 1), (0, -3), (0, -1)]
    assert each(leader, asks) == [
        (ErrorCode.NONE, 0, -1, 0),
        (ErrorCode.NONE, 0, BASE_MS, 0),
        (ErrorCode.NONE, 2, BASE_MS + 1, 1),
        (ErrorCode.NONE, 2, BASE_MS + 1, 1),
        (ErrorCode.NONE, 3, -1, 2),
    ]


def test_earliest_of_a_log_without_epochs_carries_no_leader_epoch(
    leader: DispatchLeader,
) -> None:
    """An empty log's epoch cache is empty: Kafka's earliest answer has no epoch (-1), while
    latest still carries the current leader epoch."""
    leader.image = with_leader_epoch(3)
    leader.replicas.apply(leader.image)
    assert each(leader, [(1, -2), (1, -1)]) == [
        (ErrorCode.NONE, 0, -1, -1),
        (ErrorCode.NONE, 0, -1, 3),
    ]
