"""Fetch v13-v16: topics named by id (KIP-516), a follower's id in ``replica_state`` (v15,
KIP-903) and the current leaders' addresses in ``node_endpoints`` (v16, KIP-951).

The in-process leader of dispatch_leader.py ("orders" partitions 0 and 1, replicas 1 (here)
and 2, led here); the metadata image is changed by replaying controller records into it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dispatch_leader import FOLLOWER, ME, TOPIC_ID, DispatchLeader, values

from broker.protocol import ApiKey, ErrorCode
from controller import records as rec

ORDERS = uuid.UUID(bytes=TOPIC_ID)
UNKNOWN = uuid.UUID(bytes=bytes(range(200, 216)))
RECREATED_ID = bytes(range(50, 66))
BY_ID = (13, 14, 15, 16)


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[DispatchLeader]:
    made = DispatchLeader(tmp_path / "data", partitions=2)
    yield made
    made.logs.shutdown()


def _body(
    topics: dict[uuid.UUID, dict[int, int]],
    *,
    wait_ms: int = 0,
    session: tuple[int, int] = (0, -1),
    follower: int = -1,
) -> dict[str, Any]:
    """A consumer's fetch (or, from v15, a follower's) of topic id -> partition -> offset."""
    return {
        "replica_id": follower,  # v14 and below
        "replica_state": {"replica_id": follower, "replica_epoch": 0},  # v15 and above
        "max_wait_ms": wait_ms,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": session[0],
        "session_epoch": session[1],
        "topics": [
            {
                "topic_id": topic_id,
                "partitions": [
                    {
                        "partition": p,
                        "current_leader_epoch": -1,
                        "fetch_offset": offset,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": 1 << 20,
                    }
                    for p, offset in partitions.items()
                ],
            }
            for topic_id, partitions in topics.items()
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }


def _partitions(answer: Any) -> dict[tuple[uuid.UUID, int], Any]:
    return {(t.topic_id, p.partition_index): p for t in answer.responses for p in t.partitions}


def _endpoints(answer: Any) -> list[tuple[int, str, int, str | None]]:
    return [(e.node_id, e.host, e.port, e.rack) for e in answer.node_endpoints]


def _hint(partition: Any) -> tuple[int, int, int]:
    leader = partition.current_leader
    return partition.error_code, leader.leader_id, leader.leader_epoch


def _commit(leader: DispatchLeader, partition: int, end: int) -> None:
    """The follower (v12, by name) fetches twice: the high watermark reaches ``end``."""
    for _ in range(2):
        leader.send(ApiKey.FETCH, 12, leader.fetch_body({partition: {"fetch_offset": end}}))
    assert leader.replicas.get("orders", partition).high_watermark == end


@pytest.mark.parametrize("version", BY_ID)
def test_a_fetch_by_topic_id_reads_what_a_fetch_by_name_reads(
    leader: DispatchLeader, version: int
) -> None:
    leader.produce([b"a", b"b"], partition=1, acks=1)
    _commit(leader, 1, 2)
    answer = leader.send(ApiKey.FETCH, version, _body({ORDERS: {0: 0, 1: 0}}))
    assert [t.topic_id for t in answer.responses] == [ORDERS]
    got = _partitions(answer)
    assert (got[ORDERS, 0].error_code, values(got[ORDERS, 0].records)) == (ErrorCode.NONE, [])
    assert (got[ORDERS, 1].error_code, got[ORDERS, 1].high_watermark) == (ErrorCode.NONE, 2)
    assert values(got[ORDERS, 1].records) == [b"a", b"b"]
    by_name = leader.send(ApiKey.FETCH, 12, leader.fetch_body({1: {"fetch_offset": 0}}))
    assert values(by_name.responses[0].partitions[0].records) == [b"a", b"b"]


def test_an_unknown_topic_id_is_answered_at_once_beside_the_known_ones(
    leader: DispatchLeader,
) -> None:
    """A partition of an id the image does not have is UNKNOWN_TOPIC_ID; as any error, it
    ends the long poll the request asked for (the known partition has nothing to read)."""
    reply = leader.handle(
        ApiKey.FETCH, 16, _body({ORDERS: {0: 0}, UNKNOWN: {0: 0, 3: 5}}, wait_ms=30_000)
    )
    assert isinstance(reply, list), "the fetch waited"
    answer = leader.send(ApiKey.FETCH, 16, _body({ORDERS: {0: 0}, UNKNOWN: {0: 0, 3: 5}}))
    got = _partitions(answer)
    assert got[ORDERS, 0].error_code == ErrorCode.NONE
    assert got[UNKNOWN, 0].error_code == ErrorCode.UNKNOWN_TOPIC_ID
    assert got[UNKNOWN, 3].error_code == ErrorCode.UNKNOWN_TOPIC_ID
    assert got[UNKNOWN, 3].high_watermark == -1


def test_a_topic_created_again_under_its_name_while_a_fetch_waits_is_an_unknown_id(
    leader: DispatchLeader,
) -> None:
    """The fetch asked for the old id; when it is read after its long poll, "orders" is a
    new topic (another id) with records of its own: none of them may be answered as the old
    topic's."""

    async def main() -> None:
        reply = leader.send(ApiKey.FETCH, 13, _body({ORDERS: {0: 0}}, wait_ms=300))
        waiting = asyncio.ensure_future(reply)
        await asyncio.sleep(0.05)
        assert not waiting.done()
        leader.change(
            rec.remove_topic(TOPIC_ID),
            rec.topic("orders", RECREATED_ID),
            rec.partition(RECREATED_ID, 0, [ME], [ME], leader=ME),
        )
        assert leader.produce([b"new"], acks=1).responses[0].partition_responses[0].error_code == 0
        answer = await waiting
        (only,) = _partitions(answer).items()
        assert only[0] == (ORDERS, 0)
        assert (only[1].error_code, values(only[1].records)) == (ErrorCode.UNKNOWN_TOPIC_ID, [])
        again = leader.send(ApiKey.FETCH, 13, _body({uuid.UUID(bytes=RECREATED_ID): {0: 0}}))
        assert values(again.responses[0].partitions[0].records) == [b"new"]

    asyncio.run(main())


def test_fetches_by_id_open_no_session_and_incremental_ones_are_refused(
    leader: DispatchLeader,
) -> None:
    opening = leader.send(ApiKey.FETCH, 13, _body({ORDERS: {0: 0}}, session=(0, 0)))
    assert (opening.error_code, opening.session_id) == (ErrorCode.NONE, 0)
    assert leader.context.fetch_sessions.size == 0
    assert _partitions(opening)[ORDERS, 0].error_code == ErrorCode.NONE
    # a session opened by names (v12) cannot go on by ids
    by_name = leader.send(
        ApiKey.FETCH,
        12,
        leader.fetch_body({0: {"fetch_offset": 0}}, replica_id=-1, session_epoch=0),
    )
    assert by_name.session_id != 0
    on = leader.send(ApiKey.FETCH, 13, _body({ORDERS: {0: 0}}, session=(by_name.session_id, 1)))
    assert (on.error_code, on.responses) == (ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR, [])
    unknown = leader.send(ApiKey.FETCH, 13, _body({ORDERS: {0: 0}}, session=(12345, 1)))
    assert unknown.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    # a full fetch by ids naming that session closes it, and opens none
    closing = leader.send(
        ApiKey.FETCH, 13, _body({ORDERS: {0: 0}}, session=(by_name.session_id, 0))
    )
    assert (closing.error_code, closing.session_id) == (ErrorCode.NONE, 0)
    assert leader.context.fetch_sessions.size == 0


def test_a_v15_follower_names_itself_in_replica_state(leader: DispatchLeader) -> None:
    """Its fetch reads past the high watermark and moves it, as a v12 follower's does; a
    consumer's (no replica_state) reads only below the high watermark."""
    leader.produce([b"x", b"y"], acks=1)
    consumer = leader.send(ApiKey.FETCH, 15, _body({ORDERS: {0: 0}}))
    assert values(_partitions(consumer)[ORDERS, 0].records) == []
    follower = leader.send(ApiKey.FETCH, 15, _body({ORDERS: {0: 0}}, follower=FOLLOWER))
    assert values(_partitions(follower)[ORDERS, 0].records) == [b"x", b"y"]
    leader.send(ApiKey.FETCH, 15, _body({ORDERS: {0: 2}}, follower=FOLLOWER))
    assert leader.replicas.get("orders", 0).high_watermark == 2


def test_a_v16_answer_lists_the_current_leaders_it_names(leader: DispatchLeader) -> None:
    leader.change(rec.partition_change(TOPIC_ID, 0, leader=FOLLOWER))
    epoch = leader.image.topic_by_name("orders").partitions[0].leader_epoch
    answer = leader.send(ApiKey.FETCH, 16, _body({ORDERS: {0: 0, 1: 0}}))
    got = _partitions(answer)
    assert _hint(got[ORDERS, 0]) == (ErrorCode.NOT_LEADER_OR_FOLLOWER, FOLLOWER, epoch)
    assert _hint(got[ORDERS, 1]) == (ErrorCode.NONE, -1, -1)
    assert _endpoints(answer) == [(FOLLOWER, "127.0.0.1", 9093, None)]
    # v15 names the leader too, but has no room for its address
    older = leader.send(ApiKey.FETCH, 15, _body({ORDERS: {0: 0}}))
    assert _hint(_partitions(older)[ORDERS, 0])[:2] == (ErrorCode.NOT_LEADER_OR_FOLLOWER, FOLLOWER)
    assert list(older.node_endpoints) == []


def test_a_v16_answer_lists_no_fenced_leader_and_none_when_all_is_well(
    leader: DispatchLeader,
) -> None:
    plain = leader.send(ApiKey.FETCH, 16, _body({ORDERS: {0: 0}}))
    assert _endpoints(plain) == []
    leader.change(
        rec.partition_change(TOPIC_ID, 0, leader=FOLLOWER),
        rec.fence_broker(FOLLOWER, 0),
    )
    answer = leader.send(ApiKey.FETCH, 16, _body({ORDERS: {0: 0}}))
    assert _hint(_partitions(answer)[ORDERS, 0])[:2] == (ErrorCode.NOT_LEADER_OR_FOLLOWER, FOLLOWER)
    assert _endpoints(answer) == []
