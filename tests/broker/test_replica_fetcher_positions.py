"""The follower fetcher's request building, in one process: a partition's position is read
from its log only after an answer for it was applied (or it rested), and every partition's
at least every ``POSITION_REFRESH_S``, so a log start moved by retention still reaches the
leader; an incremental request names only the partitions whose position changed.

The requests go to a stand-in connection that records each request's body and answers with
a canned Fetch response; the partitions are real followers on real logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import FakeClock, make_batch

import broker.replica_fetcher as fetcher_module
from broker.protocol import ErrorCode
from broker.replica_fetcher import FetcherConfig, ReplicaFetcher, ReplicaFetcherManager, _Followed
from controller.image import PartitionState
from replication.partition import Partition
from storage.config import LogConfig
from storage.loader import load_log
from storage.log import Log

ME, LEADER, SESSION = 2, 1, 77
TOPIC_ID = bytes(range(16))


class _Answer:
    """What ``ReplicaFetcher._handle`` reads of a Fetch response."""

    def __init__(self, partitions: list[Any]) -> None:
        self.error_code = ErrorCode.NONE
        self.session_id = SESSION
        self.responses = [_Topic(uuid.UUID(bytes=TOPIC_ID), partitions)] if partitions else []


class _Topic:
    def __init__(self, topic_id: uuid.UUID, partitions: list[Any]) -> None:
        self.topic_id, self.partitions = topic_id, partitions


class _PartitionAnswer:
    def __init__(self, index: int, records: bytes, high_watermark: int) -> None:
        self.partition_index, self.records = index, records
        self.error_code = ErrorCode.NONE
        self.high_watermark, self.log_start_offset = high_watermark, 0
        self.diverging_epoch = None


class _Connection:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.answer = _Answer([])

    async def request(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        self.bodies.append(body)
        return self.answer


def named(body: dict[str, Any]) -> dict[int, tuple[int, int]]:
    """partition -> (fetch offset, log start offset) of what a request names."""
    return {
        p["partition"]: (p["fetch_offset"], p["log_start_offset"])
        for t in body["topics"]
        for p in t["partitions"]
    }


def following(followers: list[Partition], config: FetcherConfig) -> ReplicaFetcher:
    """A fetcher from LEADER that follows ``followers`` at their current leader epochs."""
    fetcher = ReplicaFetcher(LEADER, config, lambda _: None)
    for p in followers:
        fetcher.followed[p.key] = _Followed(p, p.leader_epoch, uuid.UUID(bytes=p.topic_id))
    return fetcher


@pytest.fixture
def followers(tmp_path: Path) -> Iterator[list[Partition]]:
    logs: list[Log] = []
    made = []
    for index in (0, 1):
        log = load_log(tmp_path / f"orders-{index}", LogConfig(), clock=FakeClock())
        logs.append(log)
        partition = Partition("orders", TOPIC_ID, index, log, local_broker_id=ME)
        state = PartitionState(TOPIC_ID, index, (LEADER, ME), (LEADER, ME), LEADER, 0, 0)
        partition.make_follower(state)
        made.append(partition)
    yield made
    for log in logs:
        log.abandon()


def test_positions_are_read_after_answers_and_refreshed_for_retention(
    followers: list[Partition], monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []
    real = Partition.fetch_position

    def counted(self: Partition) -> tuple[int, int]:
        reads.append(self.partition_id)
        return real(self)

    monkeypatch.setattr(Partition, "fetch_position", counted)
    monkeypatch.setattr(fetcher_module, "POSITION_REFRESH_S", 3600.0)

    async def main() -> None:
        fetcher = following(followers, FetcherConfig(broker_id=ME))
        connection = _Connection()

        async def fetch_once() -> dict[str, Any]:
            response = await fetcher._fetch(connection)
            fetcher._handle(response, fetcher._requests)
            return connection.bodies[-1]

        assert named(await fetch_once()) == {0: (0, 0), 1: (0, 0)}  # full: opens the session
        assert sorted(reads) == [0, 1]
        connection.answer = _Answer([_PartitionAnswer(0, make_batch([b"a", b"b"]), 2)])
        assert named(await fetch_once()) == {}  # nothing moved; partition 0 is appended to
        assert followers[0].log.log_end_offset == 2
        connection.answer = _Answer([])
        assert named(await fetch_once()) == {0: (2, 0)}  # its new position, read once
        assert sorted(reads) == [0, 0, 1]
        for _ in range(3):
            assert named(await fetch_once()) == {}
        assert sorted(reads) == [0, 0, 1], "positions were read with nothing applied"
        # Retention moves the log start behind the fetcher's back: seen at the refresh.
        followers[0].log.maybe_increment_high_watermark(2)
        followers[0].log.maybe_increment_log_start_offset(1)
        assert named(await fetch_once()) == {}
        monkeypatch.setattr(fetcher_module, "POSITION_REFRESH_S", 0.0)
        assert named(await fetch_once()) == {0: (2, 1)}

    asyncio.run(main())


def forgotten(body: dict[str, Any]) -> list[int]:
    return [i for t in body["forgotten_topics_data"] for i in t["partitions"]]


def test_a_request_looks_only_at_what_changed_and_rests_are_forgotten_then_named_again(
    followers: list[Partition], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An incremental request is built from the partitions that changed since the last one
    (followed, unfollowed, applied, rested, a rest over), not from every partition: a
    partition that rests after an error is forgotten, and named again once its rest ends;
    one unfollowed is forgotten; one followed anew is named, and an answer to a request
    sent before it was followed is not applied to it."""
    monkeypatch.setattr(fetcher_module, "POSITION_REFRESH_S", 3600.0)
    looked: list[int] = []
    real = ReplicaFetcher._position

    def counted(self: ReplicaFetcher, followed: _Followed) -> Any:
        looked.append(followed.partition.partition_id)
        return real(self, followed)

    monkeypatch.setattr(ReplicaFetcher, "_position", counted)

    async def main() -> None:
        config = FetcherConfig(broker_id=ME, fetch_backoff_ms=50)
        fetcher = following(followers, config)
        connection = _Connection()

        async def fetch_once() -> dict[str, Any]:
            assert fetcher._any_ready()
            response = await fetcher._fetch(connection)
            fetcher._handle(response, fetcher._requests)
            return connection.bodies[-1]

        assert named(await fetch_once()) == {0: (0, 0), 1: (0, 0)}
        looked.clear()
        for _ in range(3):
            assert named(await fetch_once()) == {}
        assert looked == [], "an idle request looked at every partition"
        failing = _PartitionAnswer(1, b"", -1)
        failing.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
        connection.answer = _Answer([failing])
        await fetch_once()  # partition 1 rests
        connection.answer = _Answer([])
        body = await fetch_once()
        assert (named(body), forgotten(body)) == ({}, [1])
        await asyncio.sleep(0.06)  # the rest ends
        assert named(await fetch_once()) == {1: (0, 0)}
        fetcher.remove(followers[0].key)
        body = await fetch_once()
        assert (named(body), forgotten(body)) == ({}, [0])
        # Followed anew while a request is out: the answer to that request is not for it.
        built = fetcher._requests
        fetcher.followed[followers[0].key] = _Followed(
            followers[0], followers[0].leader_epoch, uuid.UUID(bytes=TOPIC_ID), built
        )
        fetcher._handle(_Answer([_PartitionAnswer(0, make_batch([b"x"]), 1)]), built)
        assert followers[0].log.log_end_offset == 0
        fetcher._dirty.add(followers[0].key)
        assert named(await fetch_once()) == {0: (0, 0)}

    asyncio.run(main())


class _Clock:
    """The fetcher's ``time``: a monotonic clock moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def test_a_metadata_disagreement_rests_briefly_doubling_and_other_errors_the_backoff(
    followers: list[Partition], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an election the new leader may not have applied it yet (UNKNOWN_LEADER_EPOCH):
    nothing on this side would end a full rest early, so such answers rest the partition
    10 ms, doubling while they repeat, up to the fetch backoff; an answer applied starts
    again at 10 ms. Any other error rests the whole backoff. A request waits no longer than
    the shortest rest, so a rested partition is fetched again when its rest ends."""
    clock = _Clock()
    monkeypatch.setattr(fetcher_module, "time", clock)
    monkeypatch.setattr(fetcher_module, "POSITION_REFRESH_S", 3600.0)
    backoff_s = 0.1

    async def main() -> None:
        config = FetcherConfig(broker_id=ME, fetch_backoff_ms=int(backoff_s * 1000))
        fetcher = following(followers, config)
        key = followers[1].key
        connection = _Connection()

        async def fetch_once(code: int | None = None, records: bytes = b"") -> dict[str, Any]:
            """One request; partition 1 answered with ``code`` (None: not answered)."""
            assert fetcher._any_ready()
            if code is None:
                connection.answer = _Answer([])
            else:
                answer = _PartitionAnswer(1, records, -1 if code else 0)
                answer.error_code = code
                connection.answer = _Answer([answer])
            response = await fetcher._fetch(connection)
            fetcher._handle(response, fetcher._requests)
            return connection.bodies[-1]

        def rest_s() -> float:
            return fetcher._resting[key] - clock.now

        body = await fetch_once()
        assert body["max_wait_ms"] == config.fetch_wait_max_ms  # nothing rests
        rests = []
        # UNKNOWN_TOPIC_ID: the leader has not applied a topic's creation (or this broker its
        # deletion) yet; by ids, as UNKNOWN_TOPIC_OR_PARTITION by names
        disagreements = [ErrorCode.UNKNOWN_LEADER_EPOCH] * 3 + [
            ErrorCode.UNKNOWN_TOPIC_ID,
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ]
        for code in disagreements:
            await fetch_once(code)
            rests.append(rest_s())
            body = await fetch_once()  # partition 0 alone, while 1 rests
            assert 1 not in named(body)
            assert body["max_wait_ms"] in (round(rests[-1] * 1000), round(rests[-1] * 1000) + 1)
            clock.now += rests[-1]  # the rest ends: named again in the next request
        assert rests == pytest.approx([0.01, 0.02, 0.04, 0.08, backoff_s])
        await fetch_once(ErrorCode.NONE, make_batch([b"a"]))
        assert followers[1].log.log_end_offset == 1 and key not in fetcher._resting
        await fetch_once(ErrorCode.FENCED_LEADER_EPOCH)
        assert rest_s() == pytest.approx(0.01), "an answer applied did not start again at 10 ms"
        clock.now += rest_s()
        await fetch_once(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        assert rest_s() == pytest.approx(0.02)
        clock.now += rest_s()
        await fetch_once(ErrorCode.UNKNOWN_SERVER_ERROR)
        assert rest_s() == pytest.approx(backoff_s), "another error did not rest the backoff"

    asyncio.run(main())


def test_an_answer_for_a_partition_whose_leader_or_epoch_moved_meanwhile_is_dropped(
    followers: list[Partition], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image may move a partition to another leader or epoch while a fetch is in flight,
    before the fetcher is told to follow it anew: records of the old leader's answer must
    not be appended (they may be a tail the new leader does not have)."""
    monkeypatch.setattr(fetcher_module, "POSITION_REFRESH_S", 3600.0)

    async def main() -> None:
        fetcher = following(followers, FetcherConfig(broker_id=ME))
        connection = _Connection()

        async def fetch_answered_after(change: Any) -> None:
            batches = [
                make_batch([b"a", b"b"], base_offset=p.log.log_end_offset) for p in followers
            ]
            connection.answer = _Answer(  # each partition's next two records
                [_PartitionAnswer(i, batch, 0) for i, batch in enumerate(batches)]
            )
            response = await fetcher._fetch(connection)
            change()  # the image moves on while the answer is on its way
            fetcher._handle(response, fetcher._requests)

        def moved(index: int, leader: int, epoch: int) -> None:
            replicas = (LEADER, ME, 3)
            state = PartitionState(TOPIC_ID, index, replicas, replicas, leader, epoch, epoch)
            followers[index].make_follower(state)

        await fetch_answered_after(lambda: moved(0, LEADER, 1))  # a new epoch, same leader
        assert [p.log.log_end_offset for p in followers] == [0, 2]
        await fetch_answered_after(lambda: None)  # nothing moved: partition 1 appends
        assert [p.log.log_end_offset for p in followers] == [0, 4]
        await fetch_answered_after(lambda: moved(1, 3, 1))  # another leader
        assert [p.log.log_end_offset for p in followers] == [0, 4]

    asyncio.run(main())


class _YieldingConnection(_Connection):
    """Answers after one loop turn, as a socket would."""

    async def request(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        await asyncio.sleep(0)
        return await super().request(api_key, version, body)


def test_an_unexpected_error_in_a_fetch_is_logged_and_the_fetcher_goes_on(
    followers: list[Partition], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in handling one answer must not end replication from that leader: the fetcher's
    loop used to end, silently, and no later follow restarted it."""
    monkeypatch.setattr(fetcher_module, "MIN_RECONNECT_BACKOFF_S", 0.0)

    async def main() -> None:
        fetcher = following(followers, FetcherConfig(broker_id=ME))
        connection = _YieldingConnection()

        async def connect() -> Any:
            return connection

        handled = []
        real = fetcher._handle

        def handle(response: Any, request: int) -> None:
            handled.append(request)
            if len(handled) == 1:
                raise RuntimeError("a bug")
            real(response, request)

        monkeypatch.setattr(fetcher, "_connect", connect)
        monkeypatch.setattr(fetcher, "_handle", handle)
        task = asyncio.get_running_loop().create_task(fetcher._run())
        try:
            async with asyncio.timeout(10):
                while len(handled) < 3:
                    await asyncio.sleep(0.001)
            assert not task.done()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(main())
    assert any("not applied" in r.getMessage() for r in caplog.records)


def test_requests_name_topics_by_id_with_this_broker_s_epoch_and_follow_a_recreated_topic(
    followers: list[Partition], tmp_path: Path
) -> None:
    """Fetch v15: topics by id, this broker's epoch in replica_state (KIP-903). A topic
    deleted and created again under its name while followed: the next request names the
    partition by the new id and forgets the old id's (else the leader's session would
    answer that one UNKNOWN_TOPIC_ID at every fetch); answers by the new id reach the new
    partition."""
    old_id, new_id = uuid.UUID(bytes=TOPIC_ID), uuid.UUID(bytes=bytes(range(50, 66)))

    async def main() -> None:
        fetcher = ReplicaFetcher(LEADER, FetcherConfig(broker_id=ME), lambda _: None, lambda: 9)
        for p in followers:
            fetcher.followed[p.key] = _Followed(p, p.leader_epoch, old_id)
        connection = _Connection()

        async def fetch_once() -> dict[str, Any]:
            response = await fetcher._fetch(connection)
            fetcher._handle(response, fetcher._requests)
            return connection.bodies[-1]

        body = await fetch_once()
        assert body["replica_state"] == {"replica_id": ME, "replica_epoch": 9}
        assert [t["topic_id"] for t in body["topics"]] == [old_id]
        log = load_log(tmp_path / "orders-0-again", LogConfig(), clock=FakeClock())
        again = Partition("orders", new_id.bytes, 0, log, local_broker_id=ME)
        again.make_follower(
            PartitionState(new_id.bytes, 0, (LEADER, ME), (LEADER, ME), LEADER, 0, 0)
        )
        fetcher.remove(again.key)
        fetcher.followed[again.key] = _Followed(again, 0, new_id, fetcher._requests)
        fetcher._dirty.add(again.key)
        body = await fetch_once()
        assert [
            (t["topic_id"], [p["partition"] for p in t["partitions"]]) for t in body["topics"]
        ] == [(new_id, [0])]
        assert [(t["topic_id"], t["partitions"]) for t in body["forgotten_topics_data"]] == [
            (old_id, [0])
        ]
        answer = _Answer([])
        answer.responses = [
            _Topic(old_id, [_PartitionAnswer(0, make_batch([b"old"]), 1)]),
            _Topic(new_id, [_PartitionAnswer(0, make_batch([b"new"]), 1)]),
        ]
        connection.answer = answer
        await fetch_once()
        assert (again.log.log_end_offset, followers[0].log.log_end_offset) == (1, 0)
        log.abandon()

    asyncio.run(main())


def test_the_manager_s_fetchers_say_the_broker_s_epoch(followers: list[Partition]) -> None:
    async def main() -> None:
        manager = ReplicaFetcherManager(FetcherConfig(broker_id=ME), lambda _: None, lambda: 3)
        manager.follow(followers[0])
        assert manager.fetchers[LEADER].broker_epoch() == 3
        await manager.close()

    asyncio.run(main())
