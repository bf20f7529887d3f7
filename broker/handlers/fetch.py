"""Fetch: consumers (and, in the next issue, followers) read record batches.

How this works. Each asked-for partition is read as a zero-copy file slice bounded by the
high watermark (consumers; the log end for a replica fetch), within the partition's limit
and what is left of the response's; the first partition with data returns at least one whole
batch even past the limits (KIP-74), so a batch larger than the limits cannot stall a client.
The slices go to the network layer untouched and leave by ``sendfile``. If fewer than
``min_bytes`` are ready and the client will wait, the request parks in the fetch purgatory
until enough bytes arrive on its partitions, a partition changes leader, or ``max_wait_ms``
(capped by ``fetch_max_wait_ms``) passes; then every partition is read again.

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
    replica: Partition | int  # the replica here, or the error code saying why none


@dataclass(slots=True)
class _Plan:
    wanted: list[_Wanted]
    max_bytes: int
    isolation: str
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
                    found,
                )
            )
    max_bytes = min(getattr(request, "max_bytes", 2**31 - 1), context.settings.fetch_max_bytes)
    isolation = "log_end" if request.replica_id >= 0 else "high_watermark"
    committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    return _Plan(wanted, max_bytes, isolation, committed)


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


def _read(plan: _Plan, image: MetadataImage) -> tuple[list[dict[str, Any]], int, bool]:
    """Every partition's answer, the bytes they carry, and whether any failed."""
    by_topic: dict[str, list[dict[str, Any]]] = {}
    left, total, failed = plan.max_bytes, 0, False
    for w in plan.wanted:
        replica = w.replica
        if not isinstance(replica, Partition):
            answer = _error(image, w, replica)
        else:
            try:
                data = replica.read(
                    w.fetch_offset,
                    min(w.max_bytes, left),
                    current_leader_epoch=w.current_leader_epoch,
                    isolation=plan.isolation,
                    min_one_batch=total == 0,
                )
            except Exception as e:  # mapped; a bug is logged by error_code_of
                answer = _error(image, w, error_code_of(e))
                if isinstance(e, ReplicationError) and e.code == ErrorCode.OFFSET_OUT_OF_RANGE:
                    answer["high_watermark"] = replica.high_watermark
                    answer["log_start_offset"] = replica.log_start_offset
            else:
                size = data.slice.length if data.slice is not None else 0
                total += size
                left = max(0, left - size)
                answer = {
                    "partition_index": w.index,
                    "error_code": ErrorCode.NONE,
                    "high_watermark": data.high_watermark,
                    "last_stable_offset": data.high_watermark,
                    "log_start_offset": data.log_start_offset,
                    "aborted_transactions": [] if plan.committed else None,
                    "preferred_read_replica": -1,
                    "records": data.slice if data.slice is not None else b"",
                }
        failed = failed or answer["error_code"] != ErrorCode.NONE
        by_topic.setdefault(w.topic, []).append(answer)
    responses = [{"topic": t, "partitions": parts} for t, parts in by_topic.items()]
    return responses, total, failed


def fetch(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    session_error = _session_error(request)
    if session_error != ErrorCode.NONE:
        return {"error_code": session_error, "session_id": NO_SESSION, "responses": []}
    plan = _plan(context, request)
    responses, total, failed = _read(plan, context.image())
    wait_ms = min(request.max_wait_ms, context.settings.fetch_max_wait_ms)
    if total >= request.min_bytes or wait_ms <= 0 or failed or not plan.wanted:
        return _response(responses)
    return _long_poll(context, request, plan, request.min_bytes - total, wait_ms)


async def _long_poll(
    context: BrokerContext, request: Any, plan: _Plan, min_bytes: int, wait_ms: int
) -> dict[str, Any]:
    keys = [(w.topic, w.index) for w in plan.wanted]
    await context.purgatory.wait(keys, min_bytes, wait_ms)
    # Look the replicas up again: one may have moved or gone while the request waited.
    responses, _, _ = _read(_plan(context, request), context.image())
    return _response(responses)


def _response(responses: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "throttle_time_ms": 0,
        "error_code": ErrorCode.NONE,
        "session_id": NO_SESSION,
        "responses": responses,
    }
