"""Produce and InitProducerId.

How this works. Produce appends each partition's record batches, as the client sent them
(any codec; the log validates framing and CRC and stamps offsets and the leader epoch), while
the request is being handled, so the appends of a connection's pipelined requests happen in
order. Every partition gets its own error code; a bad partition never fails the others.
acks=0 sends no response: on an error the connection is closed instead (as Kafka does), which
is the only way such a producer can learn of it. acks=-1 completes when the high watermark
passes the batch: in this issue a partition is served by its leader alone, whose high
watermark moves with each append (replication/partition.py), so it completes at once.

InitProducerId hands out a producer id (from blocks the controller allocates) at epoch 0.
Transactions are not supported: a transactional id is refused.
"""

from __future__ import annotations

import logging
from typing import Any

from broker.context import BrokerContext
from broker.handlers.common import Reply, error_code_of, lookup_partition
from broker.producer_ids import ProducerIdBlockError
from broker.protocol import ErrorCode, RequestHeader
from broker.server import CloseConnection
from replication.errors import ReplicationError
from replication.partition import Partition

__all__ = ["init_producer_id", "produce"]

_log = logging.getLogger(__name__)
VALID_ACKS = (-1, 0, 1)
INVALID_RECORD_FROM = 8  # the first Produce version that knows INVALID_RECORD


def _failed(index: int, code: int, message: str | None = None) -> dict[str, Any]:
    return {
        "index": index,
        "error_code": code,
        "base_offset": -1,
        "log_append_time_ms": -1,
        "log_start_offset": -1,
        "error_message": message,
    }


def _append(
    partition: Partition, index: int, records: Any, acks: int, version: int
) -> dict[str, Any]:
    if records is None:
        return _failed(index, ErrorCode.CORRUPT_MESSAGE, "no records")
    try:
        info = partition.append_as_leader(records, acks)
    except ReplicationError as e:
        # INVALID_RECORD exists from Produce v8; older clients know it as CORRUPT_MESSAGE.
        legacy = getattr(e, "legacy_code", None)
        code = legacy if legacy is not None and version < INVALID_RECORD_FROM else e.code
        return _failed(index, code, str(e))
    except Exception as e:  # a bug: logged; the other partitions still get their answer
        return _failed(index, error_code_of(e))
    return {
        "index": index,
        "error_code": ErrorCode.NONE,
        "base_offset": info.first_offset,
        "log_append_time_ms": info.log_append_time_ms,
        "log_start_offset": partition.log_start_offset,
    }


def produce(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    acks = request.acks
    image = context.image()
    refuse: tuple[int, str] | None = None
    if acks not in VALID_ACKS:
        refuse = (ErrorCode.INVALID_REQUIRED_ACKS, f"acks must be -1, 0 or 1, not {acks}")
    elif request.transactional_id is not None:
        refuse = (ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "transactions unsupported")
    responses = []
    failures = 0
    for topic in request.topic_data:
        partitions = []
        for data in topic.partition_data:
            if refuse is not None:
                result = _failed(data.index, *refuse)
            else:
                found = lookup_partition(context, image, topic.name, data.index)
                if isinstance(found, Partition):
                    result = _append(found, data.index, data.records, acks, header.api_version)
                else:
                    result = _failed(data.index, found)
            failures += result["error_code"] != ErrorCode.NONE
            partitions.append(result)
        responses.append({"name": topic.name, "partition_responses": partitions})
    if acks == 0:
        if failures:
            raise CloseConnection(f"acks=0 produce failed for {failures} partition(s)")
        return None
    return {"responses": responses, "throttle_time_ms": 0}


def init_producer_id(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    if request.transactional_id is not None:
        return {
            "error_code": ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            "producer_id": -1,
            "producer_epoch": -1,
        }
    return _new_producer_id(context)


async def _new_producer_id(context: BrokerContext) -> dict[str, Any]:
    try:
        producer_id = await context.producer_ids.next_id()
    except ProducerIdBlockError as e:
        _log.warning("no producer id for InitProducerId: %s", e)
        # Kafka's answer while it has no block; clients retry it.
        code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if e.retriable else e.code
        return {"error_code": code, "producer_id": -1, "producer_epoch": -1}
    return {"error_code": ErrorCode.NONE, "producer_id": producer_id, "producer_epoch": 0}
