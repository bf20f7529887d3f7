"""DeleteRecords: move partitions' log start offsets forward (``kafka-delete-records.sh``,
the admin clients' ``delete_records``).

How this works. Each partition is handled by its leader here (``Partition.delete_records``):
its log start offset moves to the asked offset (-1: the high watermark), never past the HW.
Kafka's checks and codes: not led here NOT_LEADER_OR_FOLLOWER, unknown
UNKNOWN_TOPIC_OR_PARTITION, a topic whose cleanup.policy lacks "delete" POLICY_VIOLATION,
an offset below -1 or above the HW OFFSET_OUT_OF_RANGE, an offline log KAFKA_STORAGE_ERROR;
a partition named twice is INVALID_REQUEST for each copy (Kafka keeps the last one of a
map). Reads below the new log start are OFFSET_OUT_OF_RANGE from then on, and ListOffsets
"earliest" answers it; whole segments below it are deleted by the next retention pass
(``log_maintenance_interval_ms``).

Before answering, the data directories' checkpoints are written (in a worker thread), so a
crash right after the answer cannot bring the deleted records back. Then a partition's
answer is its *low watermark*, the smallest log start offset of the leader and its live
(registered, unfenced) followers, and the request waits until every moved partition's low
watermark has reached its new log start: the followers' parked fetches are woken, so they
take the new log start from their next answer and say theirs in the fetch after that (once
their own checkpoints hold it: ``ReplicaFetcher._persist_log_starts``). A
partition still short after ``timeout_ms`` (at most ``MAX_WAIT_MS``) is answered
REQUEST_TIMED_OUT with the low watermark it has then; its log start has moved all the same,
as in Kafka.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.context import BrokerContext
from broker.handlers.common import Reply, Response, error_code_of, lookup_partition
from broker.protocol import ErrorCode, RequestHeader
from controller.topics import repeated
from replication.partition import Partition

__all__ = ["MAX_WAIT_MS", "delete_records"]

MAX_WAIT_MS = 300_000  # the longest a request waits for followers, whatever it asks
UNKNOWN = -1


@dataclass(slots=True)
class _Moved:
    """A partition whose log start this request moved: done once its low watermark reaches
    ``start``."""

    partition: Partition
    answer: dict[str, Any]  # its entry in the response, filled in when done or timed out
    start: int


def _answer(index: int, code: int, low_watermark: int = UNKNOWN) -> dict[str, Any]:
    return {"partition_index": index, "low_watermark": low_watermark, "error_code": code}


def _settle(context: BrokerContext, moved: _Moved) -> bool:
    """Fill in ``moved``'s answer if it is done (its low watermark reached, or an error such
    as lost leadership); False if it still waits."""
    try:
        alive = frozenset(context.image().unfenced_broker_ids())  # Kafka's hasAliveBroker
        low = moved.partition.low_watermark(alive.__contains__)
    except Exception as e:
        moved.answer.update(error_code=error_code_of(e), low_watermark=UNKNOWN)
        return True
    moved.answer["low_watermark"] = low
    return low >= moved.start


def delete_records(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    image = context.image()
    twice = repeated((t.name, p.partition_index) for t in request.topics for p in t.partitions)
    topics: list[dict[str, Any]] = []
    moved: list[_Moved] = []
    for topic in request.topics:
        answers = []
        for p in topic.partitions:
            if (topic.name, p.partition_index) in twice:
                answers.append(_answer(p.partition_index, ErrorCode.INVALID_REQUEST))
                continue
            found = lookup_partition(context, image, topic.name, p.partition_index)
            if not isinstance(found, Partition):
                answers.append(_answer(p.partition_index, found))
                continue
            answer = _answer(p.partition_index, ErrorCode.NONE)
            try:
                start = found.delete_records(p.offset)
            except Exception as e:
                answer["error_code"] = error_code_of(e)
            else:
                moved.append(_Moved(found, answer, start))
            answers.append(answer)
        topics.append({"name": topic.name, "partitions": answers})
    response: dict[str, Any] = {"throttle_time_ms": 0, "topics": topics}
    if not moved:
        return response
    for partition in {id(m.partition): m.partition for m in moved}.values():
        context.replicas.wake_followers(partition)
    wait_s = max(0, min(request.timeout_ms, MAX_WAIT_MS)) / 1000
    return _finish(context, response, moved, wait_s)


async def _finish(
    context: BrokerContext, response: dict[str, Any], moved: list[_Moved], wait_s: float
) -> Response:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    logs = [m.partition.log for m in moved]
    await asyncio.to_thread(context.replicas.log_manager.checkpoint_dirs_of, logs)
    waiting = [m for m in moved if not _settle(context, m)]
    while waiting and loop.time() < deadline:
        changed: asyncio.Future[None] = loop.create_future()
        forget = [m.partition.watch_low_watermark(_setter(changed)) for m in waiting]
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed, deadline - loop.time())
        finally:
            for undo in forget:
                undo()
        waiting = [m for m in waiting if not _settle(context, m)]
    for m in waiting:
        m.answer["error_code"] = ErrorCode.REQUEST_TIMED_OUT
    return response


def _setter(future: asyncio.Future[None]) -> Callable[[], None]:
    def set_done() -> None:
        if not future.done():
            future.set_result(None)

    return set_done
