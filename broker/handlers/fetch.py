"""Fetch: consumers and follower replicas read record batches.

How this works. Each asked-for partition is read as a zero-copy file slice bounded by the
high watermark (consumers; the log end for a replica fetch), within the partition's limit
and what is left of the response's; the first partition with data returns at least one whole
batch even past the limits (KIP-74), so a batch larger than the limits cannot stall a client.
The slices go to the network layer untouched and leave by ``sendfile``. If fewer than
``min_bytes`` are ready and the client will wait, the request parks in the fetch purgatory
until enough bytes arrive on its partitions, a partition changes leader, or ``max_wait_ms``
(capped by ``fetch_max_wait_ms``) passes; then every partition is read again.

A fetch with a replica id (``replica_id >= 0``) is a follower's (Kafka's inter-broker
protocol): it reads to the log end, reports the follower's position (its fetch offset), which
may move the high watermark and the ISR (``Partition.read_for_follower``), and answers a
diverging epoch instead of records when the follower's last fetched epoch disagrees with the
leader's log. Follower fetches park in their own purgatory, woken by every leader append
rather than by the high watermark.

read_committed reads to the last stable offset, which equals the high watermark: runnel has
no transactions. Fetch sessions (KIP-227) are declined: a request to open one is answered
with session id 0, which tells the client to keep sending full requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.context import BrokerContext
from broker.handlers.common import Reply, error_code_of, lookup_partition
from broker.protocol import ErrorCode, RequestHeader
from controller.image import MetadataImage
from replication.errors import ReplicationError
from replication.partition import Partition
from storage.segment import FileSlice

__all__ = ["fetch"]

READ_COMMITTED = 1
NO_SESSION = 0
FINAL_EPOCH = -1
INITIAL_EPOCH = 0


@dataclass(slots=True)
class _Wanted:
    topic: str
    index: int
    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int
    last_fetched_epoch: int
    replica: Partition | int  # the replica here, or the error code saying why none


@dataclass(slots=True)
class _Plan:
    wanted: list[_Wanted]
    max_bytes: int
    replica_id: int  # >= 0: a follower's fetch
    committed: bool


def _session_error(request: Any) -> int:
    session_id = getattr(request, "session_id", NO_SESSION)
    epoch = getattr(request, "session_epoch", FINAL_EPOCH)
    if session_id != NO_SESSION:
        return ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    if epoch not in (FINAL_EPOCH, INITIAL_EPOCH):
        return ErrorCode.INVALID_FETCH_SESSION_EPOCH
    return ErrorCode.NONE


def _plan(context: BrokerContext, request: Any) -> _Plan:
    image = context.image()
    wanted = []
    for topic in request.topics:
        for p in topic.partitions:
            found = lookup_partition(context, image, topic.topic, p.partition)
            wanted.append(
                _Wanted(
                    topic.topic,
                    p.partition,
                    p.fetch_offset,
                    p.partition_max_bytes,
                    getattr(p, "current_leader_epoch", -1),
                    getattr(p, "last_fetched_epoch", -1),
                    found,
                )
            )
    max_bytes = min(getattr(request, "max_bytes", 2**31 - 1), context.settings.fetch_max_bytes)
    committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    return _Plan(wanted, max_bytes, request.replica_id, committed)


def _error(image: MetadataImage, w: _Wanted, code: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "partition_index": w.index,
        "error_code": code,
        "high_watermark": -1,
        "last_stable_offset": -1,
        "log_start_offset": -1,
        "records": b"",
    }
    if code == ErrorCode.NOT_LEADER_OR_FOLLOWER or code == ErrorCode.FENCED_LEADER_EPOCH:
        topic = image.topic_by_name(w.topic)
        state = topic.partitions.get(w.index) if topic is not None else None
        if state is not None:
            out["current_leader"] = {"leader_id": state.leader, "leader_epoch": state.leader_epoch}
    return out


def _read(plan: _Plan, image: MetadataImage, now_ms: int) -> tuple[list[dict[str, Any]], int, bool]:
    """Every partition's answer, the bytes they carry, and whether one must be answered at
    once (an error, or a diverging epoch)."""
    by_topic: dict[str, list[dict[str, Any]]] = {}
    left, total, urgent = plan.max_bytes, 0, False
    for w in plan.wanted:
        replica = w.replica
        if not isinstance(replica, Partition):
            answer = _error(image, w, replica)
        else:
            try:
                answer = _read_one(plan, w, replica, min(w.max_bytes, left), total == 0, now_ms)
            except Exception as e:  # mapped; a bug is logged by error_code_of
                answer = _error(image, w, error_code_of(e))
                if isinstance(e, ReplicationError) and e.code == ErrorCode.OFFSET_OUT_OF_RANGE:
                    answer["high_watermark"] = replica.high_watermark
                    answer["log_start_offset"] = replica.log_start_offset
            else:
                records = answer["records"]
                size = records.length if isinstance(records, FileSlice) else 0
                total += size
                left = max(0, left - size)
        urgent = urgent or answer["error_code"] != ErrorCode.NONE or "diverging_epoch" in answer
        by_topic.setdefault(w.topic, []).append(answer)
    responses = [{"topic": t, "partitions": parts} for t, parts in by_topic.items()]
    return responses, total, urgent


def _read_one(
    plan: _Plan, w: _Wanted, replica: Partition, max_bytes: int, first: bool, now_ms: int
) -> dict[str, Any]:
    diverging = None
    if plan.replica_id >= 0:
        found = replica.read_for_follower(
            plan.replica_id,
            w.fetch_offset,
            max_bytes,
            last_fetched_epoch=w.last_fetched_epoch,
            current_leader_epoch=w.current_leader_epoch,
            now_ms=now_ms,
            min_one_batch=first,
        )
        data, diverging = found.data, found.diverging
    else:
        data = replica.read(
            w.fetch_offset,
            max_bytes,
            current_leader_epoch=w.current_leader_epoch,
            min_one_batch=first,
        )
    answer: dict[str, Any] = {
        "partition_index": w.index,
        "error_code": ErrorCode.NONE,
        # The replica's, not the read's: a follower's fetch may just have moved it.
        "high_watermark": replica.high_watermark,
        "last_stable_offset": replica.last_stable_offset,
        "log_start_offset": replica.log_start_offset,
        "aborted_transactions": [] if plan.committed else None,
        "preferred_read_replica": -1,
        "records": data.slice if data is not None and data.slice is not None else b"",
    }
    if diverging is not None:
        answer["diverging_epoch"] = {"epoch": diverging[0], "end_offset": diverging[1]}
    return answer


def fetch(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    session_error = _session_error(request)
    if session_error != ErrorCode.NONE:
        return {"error_code": session_error, "session_id": NO_SESSION, "responses": []}
    plan = _plan(context, request)
    clock_ms = context.replicas.clock_ms
    responses, total, urgent = _read(plan, context.image(), clock_ms())
    wait_ms = min(request.max_wait_ms, context.settings.fetch_max_wait_ms)
    if total >= request.min_bytes or wait_ms <= 0 or urgent or not plan.wanted:
        return _response(responses)
    return _long_poll(context, request, plan, request.min_bytes - total, wait_ms)


async def _long_poll(
    context: BrokerContext, request: Any, plan: _Plan, min_bytes: int, wait_ms: int
) -> dict[str, Any]:
    keys = [(w.topic, w.index) for w in plan.wanted]
    purgatory = context.purgatory
    if plan.replica_id >= 0 and context.replicas.replica_purgatory is not None:
        purgatory = context.replicas.replica_purgatory
    await purgatory.wait(keys, min_bytes, wait_ms)
    # Look the replicas up again: one may have moved or gone while the request waited.
    plan = _plan(context, request)
    responses, _, _ = _read(plan, context.image(), context.replicas.clock_ms())
    return _response(responses)


def _response(responses: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "throttle_time_ms": 0,
        "error_code": ErrorCode.NONE,
        "session_id": NO_SESSION,
        "responses": responses,
    }
