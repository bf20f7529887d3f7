"""Produce and InitProducerId.

How this works. Produce appends each partition's record batches, as the client sent them
(any codec; the log validates framing and CRC and stamps offsets and the leader epoch), while
the request is being handled, so the appends of a connection's pipelined requests happen in
order. Every partition gets its own error code; a bad partition never fails the others.
Invalid acks (not -1, 0 or 1) append nothing and are answered in Kafka's order: an unknown
partition UNKNOWN_TOPIC_OR_PARTITION, records the request may not carry their error, the rest
INVALID_REQUIRED_ACKS.
acks=0 sends no response: on an error the connection is closed instead (as Kafka does), which
is the only way such a producer can learn of it. acks=-1 completes when the high watermark
passes every partition's batch (the ISR has it: ``Partition.await_commit``); a partition whose
wait fails answers its error (NOT_ENOUGH_REPLICAS_AFTER_APPEND, NOT_LEADER_OR_FOLLOWER), and
one still waiting after the request's ``timeout_ms`` (at most ``MAX_ACKS_TIMEOUT_MS``)
answers REQUEST_TIMED_OUT: the records may still be committed later, as in Kafka.
From Produce v10 (KIP-951) a partition answered NOT_LEADER_OR_FOLLOWER names the leader and
leader epoch of the broker's latest image (``current_leader``), and the answer lists those
leaders' addresses on the listener as Metadata would (``node_endpoints``), so that a client
can move to the new leader without asking for metadata first (Kafka's handleProduceRequest).

InitProducerId hands out a producer id (from blocks the controller allocates) at epoch 0.
Transactions are not supported: a transactional id is refused with
TRANSACTIONAL_ID_AUTHORIZATION_FAILED (an empty one, or a producer id without an epoch or the
reverse, is INVALID_REQUEST, as in Kafka).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import struct
from typing import Any, NamedTuple

from broker.context import BrokerContext
from broker.handlers.common import (
    Reply,
    current_leader,
    error_code_of,
    leader_endpoints,
    lookup_partition,
)
from broker.producer_ids import ProducerIdBlockError
from broker.protocol import ErrorCode, RequestHeader
from broker.server import CloseConnection
from controller.image import MetadataImage
from replication.errors import InvalidRecord, ReplicationError
from replication.partition import Partition
from storage.batch import (
    ATTR_COMPRESSION_MASK,
    ATTR_TRANSACTIONAL,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    CompressionType,
)
from storage.log import AppendInfo

__all__ = ["init_producer_id", "produce"]

_log = logging.getLogger(__name__)
VALID_ACKS = (-1, 0, 1)
MAX_ACKS_TIMEOUT_MS = 300_000  # the longest an acks=-1 produce waits, whatever it asks
_TIMED_OUT = "the in-sync replicas did not all have the records within the request's timeout"
INVALID_RECORD_FROM = 8  # the first Produce version that knows INVALID_RECORD
ZSTD_FROM = 7  # the first Produce version that may carry zstd batches (KIP-110)
LEADER_HINTS_FROM = 10  # the first Produce version that names the current leader (KIP-951)
_NO_TRANSACTIONS = "transactions unsupported: the request holds a transactional batch"
_INT32 = struct.Struct(">i")
_LENGTH_AT = 8  # a batch's int32 batch_length (storage.batch has the layout)
_MAGIC_AT = 16
_CODEC_AT = _ATTRIBUTES_LOW_BYTE_AT = 22  # attributes is the int16 at 21
HEADER_SIZE_UP_TO_MAGIC = 17  # Kafka's Records.HEADER_SIZE_UP_TO_MAGIC
_MIN_BATCH_LENGTH = 14  # Kafka's LegacyRecord.RECORD_OVERHEAD_V0: a shorter one is corrupt
_UNKNOWN_PARTITION = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def _failed(index: int, code: int, message: str | None = None) -> dict[str, Any]:
    return {
        "index": index,
        "error_code": code,
        "base_offset": -1,
        "log_append_time_ms": -1,
        "log_start_offset": -1,
        "error_message": message,
    }


class _Waiting(NamedTuple):
    """An acks=-1 append whose batch is not committed yet, and its answer to fill in."""

    partition: Partition
    info: AppendInfo
    result: dict[str, Any]


def _append(
    partition: Partition, index: int, records: Any, acks: int, version: int
) -> dict[str, Any] | _Waiting:
    if records is None:
        return _failed(index, ErrorCode.CORRUPT_MESSAGE, "no records")
    invalid = _invalid_records(records, version)
    if invalid is not None:
        return _failed(index, *invalid)
    try:
        info = partition.append_as_leader(records, acks)
    except ReplicationError as e:
        return _failed(index, _code_for(e, version), str(e))
    except Exception as e:  # a bug: logged; the other partitions still get their answer
        return _failed(index, error_code_of(e))
    result = {
        "index": index,
        "error_code": ErrorCode.NONE,
        "base_offset": info.first_offset,
        "log_append_time_ms": info.log_append_time_ms,
        "log_start_offset": partition.log_start_offset,
    }
    if acks == -1 and info.last_offset >= partition.high_watermark:
        return _Waiting(partition, info, result)
    return result


def _code_for(error: ReplicationError, version: int) -> int:
    # INVALID_RECORD exists from Produce v8; older clients know it as CORRUPT_MESSAGE.
    legacy = getattr(error, "legacy_code", None)
    return legacy if legacy is not None and version < INVALID_RECORD_FROM else error.code


def produce(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    acks = request.acks
    image = context.image()
    version = header.api_version
    refuse: tuple[int, str] | None = None
    by_partition, transactional = _by_partition(request)
    if transactional:  # Kafka checks this before anything else
        refuse = (ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, _NO_TRANSACTIONS)
    elif acks not in VALID_ACKS:  # never 0: always answered
        return _invalid_acks(context, image, by_partition, acks, version)
    elif request.transactional_id is not None:
        refuse = (ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "transactions unsupported")
    responses = []
    failures = 0
    waiting: list[_Waiting] = []
    for name, named in by_partition.items():
        partitions = []
        for index, records in named.items():
            if refuse is not None:
                result = _failed(index, *refuse)
            else:
                found = lookup_partition(context, image, name, index)
                if isinstance(found, Partition):
                    appended = _append(found, index, records, acks, version)
                    if isinstance(appended, _Waiting):
                        waiting.append(appended)
                        appended = appended.result
                    result = appended
                else:
                    result = _failed(index, found)
            failures += result["error_code"] != ErrorCode.NONE
            partitions.append(result)
        responses.append({"name": name, "partition_responses": partitions})
    if acks == 0:
        if failures:
            raise CloseConnection(f"acks=0 produce failed for {failures} partition(s)")
        return None
    body = {"responses": responses, "throttle_time_ms": 0}
    if waiting:
        timeout_ms = min(max(request.timeout_ms, 0), MAX_ACKS_TIMEOUT_MS)
        return _committed(context, body, waiting, timeout_ms, version, failures)
    if failures and version >= LEADER_HINTS_FROM:
        _add_leader_hints(body, image, context.settings.listener_name)
    return body


def _add_leader_hints(body: dict[str, Any], image: MetadataImage, listener: str) -> None:
    """KIP-951: each partition answered NOT_LEADER_OR_FOLLOWER gets ``current_leader`` from
    ``image``, and ``node_endpoints`` lists those leaders that Metadata would list."""
    leaders: set[int] = set()
    for topic in body["responses"]:
        for result in topic["partition_responses"]:
            if result["error_code"] != ErrorCode.NOT_LEADER_OR_FOLLOWER:
                continue
            leader = current_leader(image, topic["name"], result["index"])
            if leader is not None:
                result["current_leader"] = leader
                leaders.add(leader["leader_id"])
    body["node_endpoints"] = leader_endpoints(image, leaders, listener)


def _invalid_acks(
    context: BrokerContext,
    image: MetadataImage,
    by_partition: dict[str, dict[int, Any]],
    acks: int,
    version: int,
) -> dict[str, Any]:
    """The answer to a request with acks other than -1, 0 and 1, appending nothing, in Kafka's
    order: a partition the metadata does not have is UNKNOWN_TOPIC_OR_PARTITION and records
    the request may not carry get their error (KafkaApis.handleProduceRequest); the rest,
    led here or not, INVALID_REQUIRED_ACKS (ReplicaManager.appendRecords checks acks first)."""
    message = f"acks must be -1, 0 or 1, not {acks}"
    responses = []
    for name, named in by_partition.items():
        partitions = []
        for index, records in named.items():
            if lookup_partition(context, image, name, index) == _UNKNOWN_PARTITION:
                result = _failed(index, _UNKNOWN_PARTITION)
            elif records is None:
                result = _failed(index, ErrorCode.CORRUPT_MESSAGE, "no records")
            elif (invalid := _invalid_records(records, version)) is not None:
                result = _failed(index, *invalid)
            else:
                result = _failed(index, ErrorCode.INVALID_REQUIRED_ACKS, message)
            partitions.append(result)
        responses.append({"name": name, "partition_responses": partitions})
    return {"responses": responses, "throttle_time_ms": 0}


def _by_partition(request: Any) -> tuple[dict[str, dict[int, Any]], bool]:
    """Each named partition's records by topic, in the order first named, and whether a
    partition's first batch is transactional (Kafka's RequestUtils.hasTransactionalRecords:
    one byte read per partition), in one pass. A partition named twice keeps its last records
    and is answered once: Kafka keys the request's partitions by TopicPartition in a map
    (KafkaApis.handleProduceRequest)."""
    out: dict[str, dict[int, Any]] = {}
    transactional = False
    for topic in request.topic_data:
        named = out.setdefault(topic.name, {})
        for data in topic.partition_data:
            records = named[data.index] = data.records
            if (
                records is not None
                and len(records) >= HEADER_SIZE
                and records[_MAGIC_AT] == MAGIC_V2
                and records[_ATTRIBUTES_LOW_BYTE_AT] & ATTR_TRANSACTIONAL
            ):
                transactional = True
    return out, transactional


def _invalid_records(records: Any, version: int) -> tuple[int, str] | None:
    """Kafka's ProduceRequest.validateRecords for Produce v3+: no zstd before v7 (KIP-110),
    and exactly one batch per partition. The log finds what else is wrong with the bytes
    (framing, CRC, magic: CORRUPT_MESSAGE), so bytes after the first batch that Kafka's batch
    iterator would not take for a batch (too short, or cut off) are left to it."""
    size = len(records)
    if size < HEADER_SIZE or records[_MAGIC_AT] != MAGIC_V2:
        return None
    if version < ZSTD_FROM and records[_CODEC_AT] & ATTR_COMPRESSION_MASK == CompressionType.ZSTD:
        message = f"Produce requests with version {version} are not allowed to use ZStandard"
        return ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, message + " compression"
    end = LOG_OVERHEAD + _INT32.unpack_from(records, _LENGTH_AT)[0]
    if 0 < end <= size - HEADER_SIZE_UP_TO_MAGIC:
        length = _INT32.unpack_from(records, end + _LENGTH_AT)[0]
        if _MIN_BATCH_LENGTH <= length <= size - end - LOG_OVERHEAD:
            message = (
                f"Produce requests with version {version} are only allowed to contain exactly "
                "one record batch per partition"
            )
            return _code_for(InvalidRecord(message), version), message
    return None


class _Commits:
    """The outcomes of one request's waiting appends, and one future set when the last is
    known: the request resumes one loop turn after its last commit (no ``asyncio.wait``
    machinery on the acks=-1 critical path)."""

    def __init__(self, count: int, loop: asyncio.AbstractEventLoop) -> None:
        self.outcomes: list[ReplicationError | _Unknown | None] = [_UNKNOWN] * count
        self.left = count
        self.all_known: asyncio.Future[None] = loop.create_future()

    def settle(self, index: int, error: ReplicationError | None) -> None:
        if self.outcomes[index] is _UNKNOWN:
            self.outcomes[index] = error
            self.left -= 1
            if self.left == 0:
                self.time_out()

    def time_out(self) -> None:
        if not self.all_known.done():
            self.all_known.set_result(None)


class _Unknown:
    """Not committed, failed or timed out yet."""


_UNKNOWN = _Unknown()


async def _committed(
    context: BrokerContext,
    body: dict[str, Any],
    waiting: list[_Waiting],
    timeout_ms: int,
    version: int,
    failures: int,
) -> dict[str, Any]:
    """``body`` once every waiting append is committed, failed or timed out (``failures``:
    the partitions that failed before the wait)."""
    loop = asyncio.get_running_loop()
    commits = _Commits(len(waiting), loop)
    forget = [
        partition.await_commit(info, functools.partial(commits.settle, index))
        for index, (partition, info, _) in enumerate(waiting)
    ]
    if commits.left:
        timer = loop.call_later(timeout_ms / 1000, commits.time_out)
        try:
            await commits.all_known
        finally:
            timer.cancel()
            for outcome, forget_wait in zip(commits.outcomes, forget, strict=True):
                if isinstance(outcome, _Unknown):  # timed out, or the connection went away:
                    forget_wait()  # the partition keeps nothing for it
    for outcome, (_, _, result) in zip(commits.outcomes, waiting, strict=True):
        if isinstance(outcome, _Unknown):
            failure = _failed(result["index"], ErrorCode.REQUEST_TIMED_OUT, _TIMED_OUT)
        elif outcome is not None:
            failure = _failed(result["index"], _code_for(outcome, version), str(outcome))
        else:
            continue
        result.clear()
        result.update(failure)
        failures += 1
    if failures and version >= LEADER_HINTS_FROM:
        _add_leader_hints(body, context.image(), context.settings.listener_name)
    return body


def init_producer_id(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    """Kafka's checks in its order (KafkaApis.handleInitProducerIdRequest, then
    TransactionCoordinator.handleInitProducerId): v3+ producer id and epoch both -1 or
    neither, else INVALID_REQUEST; an empty transactional id is INVALID_REQUEST; any other
    transactional id is refused (no transactions). An idempotent producer's (id, epoch), when
    given, is not bumped: it gets a new id at epoch 0, as Kafka answers it."""
    id_unset, epoch_unset = request.producer_id == -1, request.producer_epoch == -1
    if id_unset != epoch_unset or request.transactional_id == "":
        return {"error_code": ErrorCode.INVALID_REQUEST, "producer_id": -1, "producer_epoch": -1}
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
