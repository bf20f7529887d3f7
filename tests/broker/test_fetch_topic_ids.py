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
    forgotten: dict[uuid.UUID, list[int]] | None = None,
    leader_epoch: int = -1,
    broker_epoch: int = 0,
) -> dict[str, Any]:
    """A consumer's fetch (or, from v15, a follower's) of topic id -> partition -> offset."""
    return {
        "replica_id": follower,  # v14 and below
        "replica_state": {"replica_id": follower, "replica_epoch": broker_epoch},  # v15 and up
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
                        "current_leader_epoch": leader_epoch,
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
        "forgotten_topics_data": [
            {"topic_id": t, "partitions": ps} for t, ps in (forgotten or {}).items()
        ],
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


def _incremental(leader: DispatchLeader, session: tuple[int, int], **kwargs: Any) -> Any:
    """The session's next fetch by ids (v13), naming what ``kwargs`` give; the session's
    next epoch in ``session[1]`` is for the caller to count."""
    topics = kwargs.pop("topics", {})
    answer = leader.send(ApiKey.FETCH, 13, _body(topics, session=session, **kwargs))
    assert answer.error_code == ErrorCode.NONE
    assert answer.session_id == session[0]
    return answer


async def _incremental_later(leader: DispatchLeader, session: tuple[int, int]) -> Any:
    """``_incremental`` of nothing, long-polling up to 30 s."""
    answer = await leader.send(ApiKey.FETCH, 13, _body({}, session=session, wait_ms=30_000))
    assert (answer.error_code, answer.session_id) == (ErrorCode.NONE, session[0])
    return answer


def test_a_session_by_ids_answers_only_news_and_forgets_by_id(leader: DispatchLeader) -> None:
    opening = leader.send(ApiKey.FETCH, 13, _body({ORDERS: {0: 0, 1: 0}}, session=(0, 0)))
    session_id = opening.session_id
    assert (opening.error_code, session_id != 0) == (ErrorCode.NONE, True)
    assert set(_partitions(opening)) == {(ORDERS, 0), (ORDERS, 1)}
    assert leader.context.fetch_sessions.partitions == 2
    # nothing changed: nothing answered; then a long poll woken by partition 1's commit
    assert _partitions(_incremental(leader, (session_id, 1))) == {}

    async def committed() -> Any:
        parked = asyncio.ensure_future(_incremental_later(leader, (session_id, 2)))
        await asyncio.sleep(0.05)
        assert not parked.done()
        leader.produce([b"a"], partition=1, acks=1)
        _commit(leader, 1, 1)
        return await asyncio.wait_for(parked, 5)

    news = _partitions(asyncio.run(committed()))
    assert list(news) == [(ORDERS, 1)]
    assert (news[ORDERS, 1].high_watermark, values(news[ORDERS, 1].records)) == (1, [b"a"])
    # forgotten by id: the session holds partition 0 alone
    _incremental(leader, (session_id, 3), forgotten={ORDERS: [1]})
    assert leader.context.fetch_sessions.partitions == 1


def test_a_session_keeps_its_kind_of_topic_names(leader: DispatchLeader) -> None:
    """Kafka's rule: a session opened by ids goes on by ids only, and one opened by names by
    names only (FETCH_SESSION_TOPIC_ID_ERROR, the session kept); an unknown session is
    FETCH_SESSION_ID_NOT_FOUND."""
    by_ids = leader.send(ApiKey.FETCH, 13, _body({ORDERS: {0: 0}}, session=(0, 0))).session_id
    by_name = leader.send(
        ApiKey.FETCH,
        12,
        leader.fetch_body({0: {"fetch_offset": 0}}, replica_id=-1, session_epoch=0),
    ).session_id
    assert 0 not in (by_ids, by_name)
    on_names = leader.send(
        ApiKey.FETCH,
        12,
        leader.fetch_body({}, replica_id=-1, session_id=by_ids, session_epoch=1),
    )
    assert (on_names.error_code, on_names.responses) == (ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR, [])
    on_ids = leader.send(ApiKey.FETCH, 13, _body({}, session=(by_name, 1)))
    assert (on_ids.error_code, on_ids.responses) == (ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR, [])
    unknown = leader.send(ApiKey.FETCH, 13, _body({ORDERS: {0: 0}}, session=(12345, 1)))
    assert unknown.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert leader.context.fetch_sessions.size == 2
    _incremental(leader, (by_ids, 1))  # still there, at the epoch it had


def test_an_unknown_id_stays_in_its_session_until_its_topic_is_known(
    leader: DispatchLeader,
) -> None:
    """As in Kafka, a partition of an id this broker does not know yet (the client may have
    heard of a new topic first) is kept in the session and answered UNKNOWN_TOPIC_ID, every
    time, until the image has the topic: then it is read."""
    opening = leader.send(
        ApiKey.FETCH, 13, _body({ORDERS: {0: 0}, UNKNOWN: {0: 0}}, session=(0, 0))
    )
    session_id = opening.session_id
    assert _partitions(opening)[UNKNOWN, 0].error_code == ErrorCode.UNKNOWN_TOPIC_ID
    again = _partitions(_incremental(leader, (session_id, 1)))
    assert {k: p.error_code for k, p in again.items()} == {(UNKNOWN, 0): ErrorCode.UNKNOWN_TOPIC_ID}
    leader.change(
        rec.topic("later", UNKNOWN.bytes),
        rec.partition(UNKNOWN.bytes, 0, [ME], [ME], leader=ME),
    )
    known = _partitions(_incremental(leader, (session_id, 2)))
    assert {k: p.error_code for k, p in known.items()} == {(UNKNOWN, 0): ErrorCode.NONE}
    assert known[UNKNOWN, 0].high_watermark == 0


def test_a_topic_created_again_under_its_name_is_an_unknown_id_in_a_session(
    leader: DispatchLeader,
) -> None:
    """The session holds the old id's partition: once "orders" is another topic, that
    partition is UNKNOWN_TOPIC_ID (never the new topic's records); the client adds the new
    id and forgets the old one in one request."""
    session_id = leader.send(ApiKey.FETCH, 13, _body({ORDERS: {0: 0}}, session=(0, 0))).session_id
    recreated = uuid.UUID(bytes=RECREATED_ID)
    leader.change(
        rec.remove_topic(TOPIC_ID),
        rec.topic("orders", RECREATED_ID),
        rec.partition(RECREATED_ID, 0, [ME], [ME], leader=ME),
    )
    assert leader.produce([b"new"], acks=1).responses[0].partition_responses[0].error_code == 0
    old = _partitions(_incremental(leader, (session_id, 1)))
    assert list(old) == [(ORDERS, 0)]
    assert (old[ORDERS, 0].error_code, values(old[ORDERS, 0].records)) == (
        ErrorCode.UNKNOWN_TOPIC_ID,
        [],
    )
    moved = _incremental(
        leader, (session_id, 2), topics={recreated: {0: 0}}, forgotten={ORDERS: [0]}
    )
    got = _partitions(moved)
    assert list(got) == [(recreated, 0)]
    assert (got[recreated, 0].error_code, values(got[recreated, 0].records)) == (
        ErrorCode.NONE,
        [b"new"],  # one replica: committed at once
    )
    assert leader.context.fetch_sessions.partitions == 1


def test_a_v15_follower_s_session_by_ids_watches_quiet_partitions_and_wakes_on_appends(
    leader: DispatchLeader,
) -> None:
    """A follower's session by ids works as one by names: partitions found quiet are
    watched (its fetches skip them), a partition it holds is not awaited (no short poll),
    and an append to one wakes the parked fetch, which answers that partition alone."""

    def follower(session: tuple[int, int], wait_ms: int = 0) -> dict[str, Any]:
        topics = {ORDERS: {0: 0, 1: 0}} if session[1] == 0 else {}
        return _body(topics, session=session, follower=FOLLOWER, leader_epoch=0, wait_ms=wait_ms)

    async def main() -> None:
        session_id = leader.send(ApiKey.FETCH, 15, follower((0, 0))).session_id
        assert session_id != 0
        assert _partitions(leader.send(ApiKey.FETCH, 15, follower((session_id, 1)))) == {}
        assert leader.context.fetch_sessions.watched == 2
        # awaited for a partition its session holds: the fetch long-polls in full
        leader.replicas.awaited.expect(("orders", 1), [FOLLOWER])
        parked = asyncio.ensure_future(
            leader.send(ApiKey.FETCH, 15, follower((session_id, 2), wait_ms=30_000))
        )
        await asyncio.sleep(0.05)
        assert not parked.done()
        assert len(leader.replicas.awaited) == 0
        leader.produce([b"z"], partition=1, acks=1)
        got = _partitions(await asyncio.wait_for(parked, 5))
        assert list(got) == [(ORDERS, 1)]
        assert values(got[ORDERS, 1].records) == [b"z"]

    asyncio.run(main())


def test_a_v15_follower_names_itself_in_replica_state(leader: DispatchLeader) -> None:
    """Its fetch reads past the high watermark and moves it, as a v12 follower's does, and
    its broker epoch is noted; a consumer's (no replica_state) reads only below the high
    watermark."""
    leader.produce([b"x", b"y"], acks=1)
    consumer = leader.send(ApiKey.FETCH, 15, _body({ORDERS: {0: 0}}))
    assert values(_partitions(consumer)[ORDERS, 0].records) == []
    follower = leader.send(ApiKey.FETCH, 15, _body({ORDERS: {0: 0}}, follower=FOLLOWER))
    assert values(_partitions(follower)[ORDERS, 0].records) == [b"x", b"y"]
    leader.send(ApiKey.FETCH, 15, _body({ORDERS: {0: 2}}, follower=FOLLOWER, broker_epoch=4))
    replica = leader.replicas.get("orders", 0)
    assert replica.high_watermark == 2
    assert replica.follower_broker_epoch(FOLLOWER) == 4  # for an ISR change (KIP-903)
    leader.send(ApiKey.FETCH, 12, leader.fetch_body({0: {"fetch_offset": 2}}))
    assert replica.follower_broker_epoch(FOLLOWER) == -1  # v12 says none


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
