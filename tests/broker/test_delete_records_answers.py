"""DeleteRecords through the real dispatcher and codec, in one process (dispatch_leader.py:
"orders" partitions led here, broker 2 following): the answer waits for the follower to say
the new log start, a parked follower fetch is woken to hear it, the checkpoint is written
first, a fenced follower does not count, and the request-level refusals."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dispatch_leader import FETCH_V, FOLLOWER, DispatchLeader, decoded_later
from test_fetch_sessions_leader import Leader as SessionLeader
from test_fetch_sessions_leader import answers as session_answers

from broker.protocol import ApiKey, ErrorCode
from controller import records as rec
from storage.checkpoint import OffsetCheckpointFile
from storage.log_manager import LOG_START_CHECKPOINT
from storage.topic_partition import TopicPartition


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[DispatchLeader]:
    made = DispatchLeader(tmp_path / "data", partitions=2)
    yield made
    made.logs.shutdown()


def body(asks: list[tuple[str, int, int]], timeout_ms: int = 10_000) -> dict[str, Any]:
    topics: dict[str, list[dict[str, int]]] = {}
    for topic, partition, offset in asks:
        topics.setdefault(topic, []).append({"partition_index": partition, "offset": offset})
    return {
        "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
        "timeout_ms": timeout_ms,
    }


def answers(response: Any) -> list[tuple[str, int, int, int]]:
    """(topic, partition, error code, low watermark) of each answer, in order."""
    return [
        (t.name, p.partition_index, p.error_code, p.low_watermark)
        for t in response.topics
        for p in t.partitions
    ]


def committed(leader: DispatchLeader, count: int, *, log_start: int = 0) -> None:
    """``count`` records in "orders" 0, fetched by the follower (the HW at the log end),
    which says ``log_start`` as its log start offset."""
    leader.produce([b"v%d" % i for i in range(count)], acks=1)
    follower_fetch(leader, count, log_start)


def follower_fetch(leader: DispatchLeader, offset: int, log_start: int, wait_ms: int = 0) -> Any:
    fields = {"fetch_offset": offset, "log_start_offset": log_start}
    return leader.send(ApiKey.FETCH, FETCH_V, leader.fetch_body({0: fields}, wait_ms=wait_ms))


async def delete(
    leader: DispatchLeader, asks: list[tuple[str, int, int]], timeout_ms: int = 10_000
) -> Any:
    """A DeleteRecords v2 request's decoded answer, once it comes."""
    reply = leader.handle(ApiKey.DELETE_RECORDS, 2, body(asks, timeout_ms))
    return await decoded_later(ApiKey.DELETE_RECORDS, 2, reply)


async def settle() -> None:
    """Let callbacks and the checkpoint's worker thread run."""
    for _ in range(50):
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_the_answer_waits_until_the_follower_says_the_new_log_start(
    leader: DispatchLeader, version: int
) -> None:
    committed(leader, 10)

    async def run() -> None:
        reply = leader.send(ApiKey.DELETE_RECORDS, version, body([("orders", 0, 4)]))
        task = asyncio.ensure_future(reply)
        await settle()
        assert not task.done()  # the follower still says 0
        follower_fetch(leader, 10, 2)
        await settle()
        assert not task.done()
        follower_fetch(leader, 10, 4)
        assert answers(await asyncio.wait_for(task, 10)) == [("orders", 0, ErrorCode.NONE, 4)]

    asyncio.run(run())
    checkpoint = OffsetCheckpointFile(leader.logs.data_dirs[0] / LOG_START_CHECKPOINT).read()
    assert checkpoint[TopicPartition("orders", 0)] == 4


def test_a_parked_follower_fetch_is_woken_to_hear_the_new_log_start(tmp_path: Path) -> None:
    leader = DispatchLeader(tmp_path / "one", partitions=1)
    try:
        _parked_fetch_woken(leader)
    finally:
        leader.logs.shutdown()


def _parked_fetch_woken(leader: DispatchLeader) -> None:
    committed(leader, 10)

    async def run() -> None:
        parked = asyncio.ensure_future(follower_fetch(leader, 10, 0, wait_ms=60_000))
        await settle()
        assert not parked.done()  # nothing to read: it waits for an append
        deleting = asyncio.ensure_future(
            leader.send(ApiKey.DELETE_RECORDS, 2, body([("orders", 0, 6)]))
        )
        await settle()
        assert parked.done()
        (topic,) = (await parked).responses
        assert topic.partitions[0].log_start_offset == 6
        follower_fetch(leader, 10, 6)
        assert answers(await asyncio.wait_for(deleting, 10))[0][2:] == (ErrorCode.NONE, 6)

    asyncio.run(run())


def test_a_follower_that_never_says_it_times_out_with_the_low_watermark(
    leader: DispatchLeader,
) -> None:
    committed(leader, 10, log_start=0)
    for timeout_ms in (0, 200):
        got = asyncio.run(delete(leader, [("orders", 0, 5)], timeout_ms))
        assert answers(got) == [("orders", 0, ErrorCode.REQUEST_TIMED_OUT, 0)]
    assert leader.replicas.get("orders", 0).log_start_offset == 5  # type: ignore[union-attr]


def test_a_fenced_follower_does_not_hold_the_answer(leader: DispatchLeader) -> None:
    committed(leader, 10, log_start=0)
    leader.change(rec.fence_broker(FOLLOWER, 0))
    got = asyncio.run(delete(leader, [("orders", 0, 3)]))
    assert answers(got) == [("orders", 0, ErrorCode.NONE, 3)]


def test_refusals_are_answered_at_once_and_move_nothing(leader: DispatchLeader) -> None:
    committed(leader, 10)
    asks = [
        ("orders", 0, 3),
        ("orders", 0, 4),  # named twice: both copies refused
        ("orders", 1, 1),  # empty: its HW is 0
        ("orders", 7, 0),
        ("nope", 0, 0),
    ]
    got = leader.send(ApiKey.DELETE_RECORDS, 2, body(asks))
    assert answers(got) == [
        ("orders", 0, ErrorCode.INVALID_REQUEST, -1),
        ("orders", 0, ErrorCode.INVALID_REQUEST, -1),
        ("orders", 1, ErrorCode.OFFSET_OUT_OF_RANGE, -1),
        ("orders", 7, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1),
        ("nope", 0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1),
    ]
    assert leader.replicas.get("orders", 0).log_start_offset == 0  # type: ignore[union-attr]


def test_a_partition_the_follower_s_session_watches_is_answered_with_the_new_log_start(
    tmp_path: Path,
) -> None:
    """Found quiet, a partition is skipped by the session's fetches until it changes: a
    new log start is such a change, heard at the next fetch (not only at the session's
    periodic recheck)."""
    leader = SessionLeader(tmp_path / "sessions")

    async def main() -> None:
        leader.produce([b"a", b"b", b"c"], partition=1, acks=1)
        session = leader.fetch(0, 0, {0: 0, 1: 3}).session_id  # the HW moves to 3 here
        assert session_answers(leader.fetch(session, 1, {})) == {}  # both watched now
        deleting = asyncio.ensure_future(delete(leader, [("orders", 1, 2)]))
        await settle()
        got = session_answers(leader.fetch(session, 2, {}))
        assert list(got) == [1] and got[1].log_start_offset == 2
        assert not deleting.done()  # the follower has not said its new log start yet
        body = leader.fetch_body(
            {1: {"fetch_offset": 3, "last_fetched_epoch": 0, "log_start_offset": 2}},
            session_id=session,
            session_epoch=3,
        )
        leader.send(ApiKey.FETCH, FETCH_V, body)
        assert answers(await asyncio.wait_for(deleting, 10)) == [("orders", 1, 0, 2)]

    try:
        asyncio.run(main())
    finally:
        leader.logs.shutdown()
