"""ListOffsets and OffsetForLeaderEpoch.

How this works. ListOffsets answers each partition from its leader: -2 (earliest) the log
start offset, -1 (latest) the high watermark (consumers; the log end for a replica), -3 the
offset of the record with the largest timestamp (KIP-734), and a timestamp the first offset
whose record timestamp is at least that (the time index), or offset -1 if none is. The
client's current leader epoch is checked first (KIP-320).

OffsetForLeaderEpoch answers, for a leader epoch, the end offset of that epoch on the
leader (the start of the next larger epoch, or the log end): how a consumer (KIP-320) or a
follower (KIP-279) finds where its log diverges.
"""

from __future__ import annotations

from typing import Any

from broker.context import BrokerContext
from broker.handlers.common import Reply, error_code_of, lookup_partition
from broker.protocol import ErrorCode, RequestHeader
from replication.partition import Partition

__all__ = ["list_offsets", "offset_for_leader_epoch"]

UNKNOWN = -1


def _list_one(partition: Partition | int, p: Any, isolation: str) -> dict[str, Any]:
    out = {"partition_index": p.partition_index, "timestamp": UNKNOWN, "offset": UNKNOWN}
    if not isinstance(partition, Partition):
        return out | {"error_code": partition, "leader_epoch": UNKNOWN}
    try:
        partition.check_leader_epoch(getattr(p, "current_leader_epoch", -1))
        found = partition.offsets_for_timestamp(p.timestamp, isolation=isolation)
    except Exception as e:
        return out | {"error_code": error_code_of(e), "leader_epoch": UNKNOWN}
    out["error_code"] = ErrorCode.NONE
    out["leader_epoch"] = partition.leader_epoch
    if found is not None:
        out["offset"], out["timestamp"] = found
    return out


def list_offsets(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    image = context.image()
    isolation = "log_end" if request.replica_id >= 0 else "high_watermark"
    topics = []
    for topic in request.topics:
        partitions = [
            _list_one(lookup_partition(context, image, topic.name, p.partition_index), p, isolation)
            for p in topic.partitions
        ]
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
