"""A follower makes a log start its leader moved durable before its next fetch says it: the
leader counts what its followers say towards a DeleteRecords' answer, so a follower that
crashed right after must not come back with the old start.

The fetcher's own loop (``ReplicaFetcher._run``) over a stand-in connection that records
each request and what had been persisted by then; the partitions are real followers on real
logs (test_replica_fetcher_positions.py's).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from support import make_batch
from test_replica_fetcher_positions import (
    ME,
    _Answer,
    _PartitionAnswer,
    followers,
    following,
    named,
)

from broker.replica_fetcher import FetcherConfig
from replication.partition import Partition

__all__ = ["followers"]  # the fixture


class _Recording:
    """Answers the requests in turn with ``answers`` (then empty ones), noting for each
    request which log starts had been persisted when it was sent."""

    def __init__(self, answers: list[Any], persisted: list[tuple[str, int, int]]) -> None:
        self.answers, self.persisted = answers, persisted
        self.sent: list[tuple[dict[str, Any], list[tuple[str, int, int]]]] = []
        self.done = asyncio.Event()

    async def request(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        self.sent.append((body, list(self.persisted)))
        if len(self.sent) >= 3:
            self.done.set()
            await asyncio.Event().wait()  # parked for good: the test stops the loop
        return self.answers.pop(0) if self.answers else _Answer([])


def test_a_log_start_the_leader_moved_is_persisted_before_the_next_fetch_says_it(
    followers: list[Partition],
) -> None:
    persisted: list[tuple[str, int, int]] = []

    async def persist(partitions: list[Partition]) -> None:
        await asyncio.sleep(0)  # a worker thread's write, as the broker's
        persisted.extend((p.topic, p.partition_id, p.log_start_offset) for p in partitions)

    moved = _PartitionAnswer(0, make_batch([b"a", b"b", b"c", b"d", b"e"]), 5)
    moved.log_start_offset = 3  # the leader's, after a DeleteRecords
    connection = _Recording([_Answer([moved])], persisted)

    async def main() -> None:
        fetcher = following(followers, FetcherConfig(broker_id=ME))
        fetcher.persist_log_starts = persist

        async def connect() -> Any:
            return connection

        fetcher._connect = connect  # type: ignore[method-assign]
        task = asyncio.ensure_future(fetcher._run())
        try:
            await asyncio.wait_for(connection.done.wait(), 10)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(main())
    (first, before_first), (second, before_second), (third, _) = connection.sent
    assert named(first) == {0: (0, 0), 1: (0, 0)} and before_first == []
    assert followers[0].log_start_offset == 3
    assert named(second) == {0: (5, 3)}  # says the new log start...
    assert before_second == [("orders", 0, 3)]  # ...only once it was persisted
    assert named(third) == {} and persisted == [("orders", 0, 3)]  # once: nothing moved since
