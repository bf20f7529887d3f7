"""Produce v10's leader hints (KIP-951): a partition answered NOT_LEADER_OR_FOLLOWER names
its current leader and leader epoch, and the answer carries that leader's address, so that a
client can move without a Metadata round trip first.

The in-process leader of dispatch_leader.py ("orders" partitions 0 and 1, replicas 1 (here)
and 2, led here); the metadata image is changed by replaying controller records into it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dispatch_leader import FOLLOWER, ME, TOPIC_ID, DispatchLeader
from support import make_batch

from broker.protocol import ApiKey, ErrorCode
from controller import records as rec

THEIRS_ID = bytes(range(100, 116))


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[DispatchLeader]:
    made = DispatchLeader(tmp_path / "data", partitions=2)
    yield made
    made.logs.shutdown()


def _request(named: dict[str, list[int]], *, acks: int = 1) -> dict[str, Any]:
    return {
        "transactional_id": None,
        "acks": acks,
        "timeout_ms": 5000,
        "topic_data": [
            {"name": topic, "partition_data": [{"index": p, "records": make_batch([b"v"])}]}
            for topic, partitions in named.items()
            for p in partitions
        ],
    }


def _partitions(answer: Any) -> dict[tuple[str, int], Any]:
    return {(t.name, p.index): p for t in answer.responses for p in t.partition_responses}


def _endpoints(answer: Any) -> list[tuple[int, str, int, str | None]]:
    return [(e.node_id, e.host, e.port, e.rack) for e in answer.node_endpoints]


def _hint(partition: Any) -> tuple[int, int, int]:
    return (
        partition.error_code,
        partition.current_leader.leader_id,
        partition.current_leader.leader_epoch,
    )


def test_a_moved_partition_names_its_new_leader_and_its_address(leader: DispatchLeader) -> None:
    leader.change(rec.partition_change(TOPIC_ID, 0, leader=FOLLOWER))
    epoch = leader.image.topic_by_name("orders").partitions[0].leader_epoch
    answer = leader.send(ApiKey.PRODUCE, 10, _request({"orders": [0, 1]}))
    got = _partitions(answer)
    assert _hint(got[("orders", 0)]) == (ErrorCode.NOT_LEADER_OR_FOLLOWER, FOLLOWER, epoch)
    assert _hint(got[("orders", 1)]) == (ErrorCode.NONE, -1, -1)  # led here: no hint
    assert _endpoints(answer) == [(FOLLOWER, "127.0.0.1", 9093, None)]
    # v9 has no room for either: the same refusal, nothing more
    old = leader.send(ApiKey.PRODUCE, 9, _request({"orders": [0]}))
    assert _partitions(old)[("orders", 0)].error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert list(old.node_endpoints) == []


def test_a_partition_with_no_replica_here_names_its_leader(leader: DispatchLeader) -> None:
    leader.change(
        rec.topic("theirs", THEIRS_ID),
        rec.partition(THEIRS_ID, 0, [FOLLOWER], [FOLLOWER], leader=FOLLOWER),
    )
    answer = leader.send(ApiKey.PRODUCE, 10, _request({"theirs": [0], "orders": [0]}))
    got = _partitions(answer)
    assert _hint(got[("theirs", 0)]) == (ErrorCode.NOT_LEADER_OR_FOLLOWER, FOLLOWER, 0)
    assert got[("orders", 0)].error_code == ErrorCode.NONE
    assert _endpoints(answer) == [(FOLLOWER, "127.0.0.1", 9093, None)]


def test_a_fenced_leader_is_named_without_an_address(leader: DispatchLeader) -> None:
    """Metadata leaves fenced brokers out, so the hint's addresses do too."""
    leader.change(
        rec.partition_change(TOPIC_ID, 0, leader=FOLLOWER),
        rec.fence_broker(FOLLOWER, 0),
    )
    answer = leader.send(ApiKey.PRODUCE, 10, _request({"orders": [0]}))
    error, named, _ = _hint(_partitions(answer)[("orders", 0)])
    assert (error, named) == (ErrorCode.NOT_LEADER_OR_FOLLOWER, FOLLOWER)
    assert _endpoints(answer) == []


def test_a_waiting_acks_all_write_that_loses_leadership_names_the_new_leader(
    leader: DispatchLeader,
) -> None:
    """The follower never fetches, so the write waits; the leadership moves meanwhile."""

    async def main() -> None:
        reply = asyncio.ensure_future(
            leader.send(ApiKey.PRODUCE, 10, _request({"orders": [0]}, acks=-1))
        )
        await asyncio.sleep(0.05)
        assert not reply.done()
        leader.change(rec.partition_change(TOPIC_ID, 0, leader=FOLLOWER))
        answer = await asyncio.wait_for(reply, 5)
        epoch = leader.image.topic_by_name("orders").partitions[0].leader_epoch
        got = _partitions(answer)[("orders", 0)]
        assert _hint(got) == (ErrorCode.NOT_LEADER_OR_FOLLOWER, FOLLOWER, epoch)
        assert _endpoints(answer) == [(FOLLOWER, "127.0.0.1", 9093, None)]

    asyncio.run(main())


def test_partitions_led_here_carry_no_hint(leader: DispatchLeader) -> None:
    assert leader.image.topic_by_name("orders").partitions[0].leader == ME
    answer = leader.send(ApiKey.PRODUCE, 10, _request({"orders": [0, 1]}))
    assert all(_hint(p) == (ErrorCode.NONE, -1, -1) for p in _partitions(answer).values())
    assert _endpoints(answer) == []
