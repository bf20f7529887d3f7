"""The leader's side of replication through the Kafka API, in one process: follower fetches
(Fetch with a replica id) move the high watermark that acks=-1 produces wait for, answer a
diverging epoch, long-poll until the leader appends, and are refused to non-replicas.

The in-process leader of dispatch_leader.py with partition 0 of "orders". The fetchers'
side runs against real brokers in tests/replication.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dispatch_leader import (
    CONNECTION,
    FETCH_V,
    FOLLOWER,
    PRODUCE_V,
    DispatchLeader,
    decoded_later,
    orders_image,
    values,
)
from support import make_batch

from broker.awaited_followers import SHORT_POLL_MS
from broker.protocol import ApiKey, ErrorCode, encode_request


class Leader(DispatchLeader):
    def fetch(
        self,
        offset: int,
        *,
        replica_id: int = FOLLOWER,
        last_epoch: int = -1,
        wait_ms: int = 0,
        leader_epoch: int = 0,
    ) -> Any:
        fields = {
            "fetch_offset": offset,
            "last_fetched_epoch": last_epoch,
            "current_leader_epoch": leader_epoch,
        }
        body = self.fetch_body({0: fields}, replica_id=replica_id, wait_ms=wait_ms)
        return self.send(ApiKey.FETCH, FETCH_V, body)


def only(response: Any) -> Any:
    (topic,) = response.responses
    (partition,) = getattr(topic, "partitions", None) or topic.partition_responses
    return partition


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Leader]:
    made = Leader(tmp_path / "data")
    yield made
    made.logs.shutdown()


def test_acks_all_completes_when_the_follower_s_fetch_passes_the_batch(leader: Leader) -> None:
    async def main() -> None:
        produced = asyncio.ensure_future(leader.produce([b"a", b"b"]))
        await asyncio.sleep(0.05)
        assert not produced.done()  # the follower has not fetched it
        consumer = only(leader.fetch(0, replica_id=-1))
        assert consumer.high_watermark == 0 and values(consumer.records) == []
        follower = only(leader.fetch(0))
        assert values(follower.records) == [b"a", b"b"]  # followers read to the log end
        assert not produced.done()
        assert only(leader.fetch(2)).high_watermark == 2  # its next fetch says it has them
        answer = only(await produced)
        assert (answer.error_code, answer.base_offset) == (ErrorCode.NONE, 0)
        assert values(only(leader.fetch(0, replica_id=-1)).records) == [b"a", b"b"]

    asyncio.run(main())


def test_an_acks_all_produce_is_done_with_its_frame_when_handle_returns(leader: Leader) -> None:
    """The listener reuses a frame's memory once the dispatcher returns (frames_in_flight is
    False): a produce waiting for the follower must not read its request bytes again."""

    async def main() -> None:
        assert leader.dispatcher.frames_in_flight is False
        body = {
            "transactional_id": None,
            "acks": -1,
            "timeout_ms": 10_000,
            "topic_data": [
                {"name": "orders", "partition_data": [{"index": 0, "records": make_batch([b"a"])}]}
            ],
        }
        parts = encode_request(ApiKey.PRODUCE, PRODUCE_V, 7, "test", body)
        buffer = bytearray(b"".join(bytes(p) for p in parts))  # type: ignore[arg-type]
        reply = leader.dispatcher.handle(memoryview(buffer)[4:], CONNECTION)
        buffer[:] = bytes(len(buffer))  # the next request written over it
        produced = asyncio.ensure_future(decoded_later(ApiKey.PRODUCE, PRODUCE_V, reply))
        assert only(leader.fetch(0)).high_watermark == 0
        assert only(leader.fetch(1)).high_watermark == 1
        answer = only(await produced)
        assert (answer.error_code, answer.base_offset) == (ErrorCode.NONE, 0)
        assert values(only(leader.fetch(0, replica_id=-1)).records) == [b"a"]

    asyncio.run(main())


def test_acks_all_times_out_without_the_follower_and_acks_one_does_not_wait(
    leader: Leader,
) -> None:
    async def main() -> None:
        answer = only(await leader.produce([b"a"], timeout_ms=100))
        assert answer.error_code == ErrorCode.REQUEST_TIMED_OUT and answer.base_offset == -1
        (partition,) = leader.replicas.partitions()
        assert not partition._waiting  # the timed-out wait is forgotten, not kept
        assert only(leader.produce([b"b"], acks=1)).error_code == ErrorCode.NONE

    asyncio.run(main())


def test_a_follower_with_a_diverging_epoch_is_told_where_the_epoch_ends(leader: Leader) -> None:
    async def main() -> None:
        leader.produce([b"a"], acks=1)
        answer = only(leader.fetch(5, last_epoch=0))
        assert answer.error_code == ErrorCode.NONE
        assert (answer.diverging_epoch.epoch, answer.diverging_epoch.end_offset) == (0, 1)
        assert values(answer.records) == []
        agreed = only(leader.fetch(1, last_epoch=0))
        assert agreed.diverging_epoch is None or agreed.diverging_epoch.epoch == -1

    asyncio.run(main())


def test_a_consumer_naming_its_last_fetched_epoch_is_told_where_its_log_diverges(
    leader: Leader,
) -> None:
    """Kafka's Partition.readRecords checks the last fetched epoch of every fetch that sets
    it (Fetch v12+), a consumer's too: a diverging epoch and no records."""

    async def main() -> None:
        leader.produce([b"a", b"b"], acks=1)
        only(leader.fetch(0))
        assert only(leader.fetch(2)).high_watermark == 2
        # It read offsets 2 and 3 of epoch 0 from a leader whose log was then truncated.
        answer = only(leader.fetch(4, replica_id=-1, last_epoch=0))
        assert answer.error_code == ErrorCode.NONE
        assert (answer.diverging_epoch.epoch, answer.diverging_epoch.end_offset) == (0, 2)
        assert values(answer.records) == []
        unknown = only(leader.fetch(1, replica_id=-1, last_epoch=3))  # no end known here
        assert unknown.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
        agreed = only(leader.fetch(1, replica_id=-1, last_epoch=0))
        assert agreed.diverging_epoch is None or agreed.diverging_epoch.epoch == -1
        assert values(agreed.records) == [b"a", b"b"]  # the batch holding offset 1
        fenced = only(leader.fetch(1, replica_id=-1, last_epoch=3, leader_epoch=1))
        assert fenced.error_code == ErrorCode.UNKNOWN_LEADER_EPOCH  # the epoch check first

    asyncio.run(main())


def test_a_parked_follower_fetch_is_answered_by_the_next_append(leader: Leader) -> None:
    async def main() -> None:
        parked = asyncio.ensure_future(leader.fetch(0, wait_ms=5000))
        await asyncio.sleep(0.05)
        assert not parked.done()
        leader.produce([b"x"], acks=1)
        answer = only(await asyncio.wait_for(parked, 2))
        assert values(answer.records) == [b"x"]

    asyncio.run(main())


def test_fetches_from_non_replicas_or_stale_epochs_are_refused(leader: Leader) -> None:
    assert only(leader.fetch(0, replica_id=7)).error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert only(leader.fetch(0, leader_epoch=1)).error_code == ErrorCode.UNKNOWN_LEADER_EPOCH


def test_an_append_before_a_parked_fetch_first_runs_still_wakes_it(leader: Leader) -> None:
    """The fetch parks when it is handled, not when its coroutine first runs: an append
    handled in between (say, in the same read from the socket) answers it at once. Before,
    such a fetch waited its whole max_wait_ms with the data there."""

    async def main() -> None:
        waiting = leader.fetch(0, wait_ms=60_000)  # handled: found nothing, parked
        leader.produce([b"x"], acks=1)  # before the fetch's coroutine ever ran
        answer = only(await asyncio.wait_for(waiting, 5))
        assert values(answer.records) == [b"x"]

    asyncio.run(main())


def test_a_fetch_cancelled_before_it_ever_ran_unparks_at_once(leader: Leader) -> None:
    """The listener makes the reply a future and cancels it when its connection closes,
    which may happen in the same loop turn as the request (a bad frame right after it in
    the same read). A coroutine cancelled before its task first ran never runs: the fetch it
    had parked stayed parked until its max_wait_ms (up to fetch_max_wait_ms)."""
    purgatory = leader.replicas.replica_purgatory
    assert purgatory is not None

    async def main() -> None:
        body = leader.fetch_body({0: {"fetch_offset": 0}}, wait_ms=20_000)
        reply = asyncio.ensure_future(leader.handle(ApiKey.FETCH, FETCH_V, body))  # as the listener
        assert purgatory.waiting == 1
        reply.cancel()  # as a connection closing in the same turn does
        for _ in range(3):  # the cancellation's callbacks run within a few loop turns
            await asyncio.sleep(0)
        assert purgatory.waiting == 0

    asyncio.run(main())


def test_a_new_leader_wakes_its_followers_and_keeps_their_polls_short_until_they_fetch(
    leader: Leader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On becoming the leader of "orders" 1, the broker wakes the follower's parked fetch
    (of partition 0 only) and parks its next ones at most SHORT_POLL_MS until a fetch names
    partition 1; then long polls are long again."""
    purgatory = leader.replicas.replica_purgatory
    assert purgatory is not None
    parks: list[int] = []
    real_park = purgatory.park

    def park(*args: Any, **kwargs: Any) -> Any:
        parks.append(args[2])
        return real_park(*args, **kwargs)

    monkeypatch.setattr(purgatory, "park", park)
    LONG_MS = 20_000  # below fetch_max_wait_ms; no test waits it out

    def fetch(partitions: list[int]) -> Any:
        body = leader.fetch_body({p: {"fetch_offset": 0} for p in partitions}, wait_ms=LONG_MS)
        return leader.send(ApiKey.FETCH, FETCH_V, body)

    async def main() -> None:
        old = asyncio.ensure_future(fetch([0]))
        await asyncio.sleep(0.05)
        assert not old.done()
        leader.image = orders_image(2)  # "orders" 1 is new, led here, followed by FOLLOWER
        leader.replicas.apply(leader.image)
        await asyncio.wait_for(old, 5)  # woken at once
        parks.clear()
        await asyncio.wait_for(fetch([0]), 5)  # does not name 1 yet: a short poll
        assert parks == [SHORT_POLL_MS]
        for partitions in ([0, 1], [0]):  # names it: no longer awaited; then long polls
            long = asyncio.ensure_future(fetch(partitions))
            await asyncio.sleep(0.1)
            assert not long.done() and parks[-1] == LONG_MS, "a long poll was kept short"
            long.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await long
            await asyncio.sleep(0)
            assert purgatory.waiting == 0  # a cancelled fetch unparks

    asyncio.run(main())
