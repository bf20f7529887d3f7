"""ListOffsets and OffsetForLeaderEpoch.

How this works. ListOffsets answers each partition from its leader: -2 (earliest) the log
start offset, -1 (latest) the high watermark (consumers; the log end for a replica), -3 the
offset of the record with the largest timestamp (KIP-734), and a timestamp the first offset
whose record timestamp is at least that (the time index), or offset -1 (and leader epoch -1)
if none is. The client's current leader epoch is checked first (KIP-320). As in Kafka
(ReplicaManager.fetchOffset): a partition named twice is INVALID_REQUEST for each copy, a
special timestamp newer than the request's version (-3 needs v7; -4, -5 later versions than
runnel serves) or any other negative one is UNSUPPORTED_VERSION, and a new leader whose high
watermark has not reached its epoch's start answers a consumer OFFSET_NOT_AVAILABLE
(LEADER_NOT_AVAILABLE below v5) for "latest" and for a timestamp finding nothing below the
high watermark (``Partition.offsets_for_timestamp``). A found offset carries the leader
epoch that goes with it, not the partition's current one (a consumer validates its reset
position against it, KIP-320): for earliest the epoch of the log start offset, for latest
the current leader epoch, for a record the leader epoch of its batch.

OffsetForLeaderEpoch answers, for a leader epoch, the end offset of that epoch on the
leader (the start of the next larger epoch, or the log end): how a consumer (KIP-320) or a
follower (KIP-279) finds where its log diverges.
"""

from __future__ import annotations

from typing import Any

from broker.context import BrokerContext
from broker.handlers.common import Reply, error_code_of, lookup_partition
from broker.protocol import ErrorCode, RequestHeader
from controller.topics import repeated
from replication.errors import OffsetNotAvailable
from replication.partition import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIERED_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    Partition,
)

__all__ = ["list_offsets", "offset_for_leader_epoch"]

UNKNOWN = -1
OFFSET_NOT_AVAILABLE_FROM = 5  # older ListOffsets versions are answered LEADER_NOT_AVAILABLE
# The first ListOffsets version allowed each special timestamp (Kafka's
# ReplicaManager.timestampMinSupportedVersion); any other negative timestamp is refused.
TIMESTAMP_FROM_VERSION = {
    EARLIEST_TIMESTAMP: 1,
    LATEST_TIMESTAMP: 1,
    MAX_TIMESTAMP: 7,
    EARLIEST_LOCAL_TIMESTAMP: 8,
    LATEST_TIERED_TIMESTAMP: 9,
}


def _list_one(partition: Partition | int, p: Any, isolation: str, version: int) -> dict[str, Any]:
    if not isinstance(partition, Partition):
        return _not_listed(p, partition)
    try:
        partition.check_leader_epoch(getattr(p, "current_leader_epoch", -1))
        found = partition.offsets_for_timestamp(p.timestamp, isolation=isolation)
    except OffsetNotAvailable:
        legacy = version < OFFSET_NOT_AVAILABLE_FROM
        return _not_listed(p, OffsetNotAvailable.legacy_code if legacy else OffsetNotAvailable.code)
    except Exception as e:
        return _not_listed(p, error_code_of(e))
    if found is None:  # no such offset: Kafka's answer carries no leader epoch either
        return _not_listed(p, ErrorCode.NONE)
    return {
        "partition_index": p.partition_index,
        "error_code": ErrorCode.NONE,
        "offset": found.offset,
        "timestamp": found.timestamp,
        "leader_epoch": found.leader_epoch,
    }


def _not_listed(p: Any, code: int) -> dict[str, Any]:
    return {
        "partition_index": p.partition_index,
        "error_code": code,
        "timestamp": UNKNOWN,
        "offset": UNKNOWN,
        "leader_epoch": UNKNOWN,
    }


def _duplicates(request: Any) -> set[tuple[str, int]]:
    return repeated((t.name, p.partition_index) for t in request.topics for p in t.partitions)


def _unsupported_timestamp(timestamp: int, version: int) -> bool:
    return timestamp < 0 and version < TIMESTAMP_FROM_VERSION.get(timestamp, version + 1)


def list_offsets(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    image = context.image()
    version = header.api_version
    isolation = "log_end" if request.replica_id >= 0 else "high_watermark"
    twice = _duplicates(request)
    topics = []
    for topic in request.topics:
        partitions = []
        for p in topic.partitions:
            if (topic.name, p.partition_index) in twice:
                answer = _not_listed(p, ErrorCode.INVALID_REQUEST)
            elif _unsupported_timestamp(p.timestamp, version):
                answer = _not_listed(p, ErrorCode.UNSUPPORTED_VERSION)
            else:
                found = lookup_partition(context, image, topic.name, p.partition_index)
                answer = _list_one(found, p, isolation, version)
            partitions.append(answer)
        topics.append({"name": topic.name, "partitions": partitions})
    return {"throttle_time_ms": 0, "topics": topics}


def _epoch_one(partition: Partition | int, p: Any) -> dict[str, Any]:
    out = {"partition": p.partition, "leader_epoch": UNKNOWN, "end_offset": UNKNOWN}
    if not isinstance(partition, Partition):
        return out | {"error_code": partition}
    try:
        partition.check_leader_epoch(getattr(p, "current_leader_epoch", -1))
        epoch, end_offset = partition.end_offset_for_epoch(p.leader_epoch)
    except Exception as e:
        return out | {"error_code": error_code_of(e)}
    return out | {"error_code": ErrorCode.NONE, "leader_epoch": epoch, "end_offset": end_offset}


def offset_for_leader_epoch(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    image = context.image()
    topics = []
    for topic in request.topics:
        partitions = [
            _epoch_one(lookup_partition(context, image, topic.topic, p.partition), p)
            for p in topic.partitions
        ]
        topics.append({"topic": topic.topic, "partitions": partitions})
    return {"throttle_time_ms": 0, "topics": topics}
