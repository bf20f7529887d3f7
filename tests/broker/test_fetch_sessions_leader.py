"""Follower fetch sessions on the leader, in one process: an incremental follower fetch naming
nothing still reads from the session's positions, reports the follower's position (so an
idle follower stays caught up and in the ISR), and answers only partitions with news.

A broker context over real partition logs in a temp dir, a settable clock, and a metadata
image built from records: "orders" partitions 0 and 1, replicas 1 (here, the leader) and 2,
both in the ISR. Frames go through the real dispatcher and codec; ISR proposals go to a
list (the AlterPartition sender is tested against a real controller elsewhere).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import FakeClock, make_batch

from broker.context import BrokerContext, BrokerSettings, ReplicationSettings
from broker.dispatcher import KafkaDispatcher
from broker.producer_ids import ProducerIdManager
from broker.protocol import ApiKey, ErrorCode, decode_response, encode_request
from broker.purgatory import FetchPurgatory
from broker.replica_manager import ReplicaManager
from broker.server import ConnectionInfo
from controller import records as rec
from controller.image import MetadataDelta, MetadataImage
from replication.partition import Partition
from storage.config import LogConfig
from storage.log_manager import LogManager
from storage.records import iter_decoded
from storage.segment import FileSlice

ME, FOLLOWER = 1, 2
TOPIC_ID = bytes(range(16))
CONNECTION = ConnectionInfo("127.0.0.1:5555", 1, "CLIENT")
LAG_MS = 30_000


def image() -> MetadataImage:
    records = [
        rec.register_broker(ME, 0, b"i" * 16, [("CLIENT", "127.0.0.1", 9092)], fenced=False),
        rec.register_broker(FOLLOWER, 0, b"j" * 16, [("CLIENT", "127.0.0.1", 9093)], fenced=False),
        rec.topic("orders", TOPIC_ID),
        rec.partition(TOPIC_ID, 0, [ME, FOLLOWER], [ME, FOLLOWER], leader=ME),
        rec.partition(TOPIC_ID, 1, [ME, FOLLOWER], [ME, FOLLOWER], leader=ME),
    ]
    delta = MetadataDelta(MetadataImage.EMPTY)
    for offset, record in enumerate(records):
        delta.replay(record, offset)
    return delta.apply()


class Leader:
    def __init__(self, data_dir: Path) -> None:
        self.clock = FakeClock(1_000_000)
        self.logs = LogManager([data_dir], LogConfig())
        self.logs.startup()
        purgatory, replica_purgatory = FetchPurgatory(), FetchPurgatory()
        self.replicas = ReplicaManager(
            ME,
            self.logs,
            purgatory=purgatory,
            replica_purgatory=replica_purgatory,
            replica_lag_time_max_ms=LAG_MS,
            clock_ms=self.clock,
        )
        self.proposals: list[tuple[tuple[str, int], tuple[int, ...]]] = []
        self.replicas.propose_isr = self._propose
        self.image = image()
        self.replicas.apply(self.image)
        replication = ReplicationSettings(replica_lag_time_max_ms=LAG_MS)
        settings = BrokerSettings(ME, "cluster-x", "CLIENT", replication=replication)
        self.context = BrokerContext(
            settings,
            self.replicas,
            purgatory,
            ProducerIdManager(ME, None, lambda: 0),  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            lambda: self.image,
        )
        self.dispatcher = KafkaDispatcher(self.context)
        self.correlation_id = 0

    def _propose(self, partition: Partition, isr: tuple[int, ...]) -> bool:
        self.proposals.append((partition.key, isr))
        return True

    def send(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        self.correlation_id += 1
        parts = encode_request(api_key, version, self.correlation_id, "test", body)
        frame = memoryview(b"".join(bytes(p) for p in parts))[4:]  # type: ignore[arg-type]
        reply = self.dispatcher.handle(frame, CONNECTION)
        if inspect.isawaitable(reply):
            return _decoded_later(api_key, version, reply)
        return _decoded(api_key, version, reply)

    def produce(self, partition: int, values: list[bytes], acks: int = -1) -> Any:
        data = [{"index": partition, "records": make_batch(values)}]
        body = {
            "transactional_id": None,
            "acks": acks,
            "timeout_ms": 10_000,
            "topic_data": [{"name": "orders", "partition_data": data}],
        }
        return self.send(ApiKey.PRODUCE, 9, body)

    def fetch(
        self,
        session_id: int,
        epoch: int,
        offsets: dict[int, int],
        *,
        forgotten: list[int] | None = None,
        wait_ms: int = 0,
    ) -> Any:
        partitions = [
            {
                "partition": p,
                "current_leader_epoch": 0,
                "fetch_offset": offset,
                "last_fetched_epoch": 0 if offset else -1,
                "log_start_offset": 0,
                "partition_max_bytes": 1 << 20,
            }
            for p, offset in offsets.items()
        ]
        body = {
            "replica_id": FOLLOWER,
            "max_wait_ms": wait_ms,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": session_id,
            "session_epoch": epoch,
            "topics": [{"topic": "orders", "partitions": partitions}] if partitions else [],
            "forgotten_topics_data": [{"topic": "orders", "partitions": forgotten or []}],
            "rack_id": "",
        }
        return self.send(ApiKey.FETCH, 12, body)


def _decoded(api_key: int, version: int, reply: Any) -> Any:
    assert isinstance(reply, list)
    data = b"".join(p.read() if isinstance(p, FileSlice) else bytes(p) for p in reply)
    return decode_response(api_key, version, memoryview(data)[4:])[1]


async def _decoded_later(api_key: int, version: int, reply: Any) -> Any:
    return _decoded(api_key, version, await asyncio.wait_for(reply, 10))


def answers(response: Any) -> dict[int, Any]:
    assert response.error_code == ErrorCode.NONE, response.error_code
    return {p.partition_index: p for t in response.responses for p in t.partitions}


def values(records: Any) -> list[bytes | None]:
    raw = records.read() if hasattr(records, "read") else bytes(records or b"")
    return [r.value for batch in iter_decoded(raw) for r in batch.records]


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Leader]:
    made = Leader(tmp_path / "data")
    yield made
    made.logs.shutdown()


def test_an_incremental_follower_fetch_reads_from_the_session_s_positions(leader: Leader) -> None:
    async def main() -> None:
        opened = leader.fetch(0, 0, {0: 0, 1: 0})
        session = opened.session_id
        assert session > 0 and sorted(answers(opened)) == [0, 1]
        produced = asyncio.ensure_future(leader.produce(0, [b"a", b"b"]))
        await asyncio.sleep(0.05)
        got = answers(leader.fetch(session, 1, {}))  # names nothing: from offset 0
        assert list(got) == [0] and values(got[0].records) == [b"a", b"b"]
        assert not produced.done()
        moved = answers(leader.fetch(session, 2, {0: 2}))  # its position moved: the HW moves
        assert list(moved) == [0] and moved[0].high_watermark == 2
        assert values(moved[0].records) == []
        answer = (await produced).responses[0].partition_responses[0]
        assert answer.error_code == ErrorCode.NONE
        assert answers(leader.fetch(session, 3, {})) == {}  # no news anywhere

    asyncio.run(main())


def test_a_parked_incremental_fetch_answers_only_the_partition_appended_to(
    leader: Leader,
) -> None:
    async def main() -> None:
        session = leader.fetch(0, 0, {0: 0, 1: 0}).session_id
        parked = asyncio.ensure_future(leader.fetch(session, 1, {}, wait_ms=5000))
        await asyncio.sleep(0.05)
        assert not parked.done()
        leader.produce(1, [b"x"], acks=1)
        got = answers(await asyncio.wait_for(parked, 5))
        assert list(got) == [1] and values(got[1].records) == [b"x"]

    asyncio.run(main())


def test_forgotten_partitions_are_neither_fetched_nor_answered(leader: Leader) -> None:
    async def main() -> None:
        session = leader.fetch(0, 0, {0: 0, 1: 0}).session_id
        assert answers(leader.fetch(session, 1, {}, forgotten=[1])) == {}
        leader.produce(1, [b"x"], acks=1)
        assert answers(leader.fetch(session, 2, {})) == {}
        leader.produce(0, [b"y"], acks=1)
        assert list(answers(leader.fetch(session, 3, {}))) == [0]

    asyncio.run(main())


def test_an_idle_follower_fetching_incrementally_stays_in_the_isr(leader: Leader) -> None:
    async def main() -> None:
        session = leader.fetch(0, 0, {0: 0, 1: 0}).session_id
        for epoch in range(1, 5):  # four lag times, one fetch naming nothing every half
            leader.clock.advance(LAG_MS // 2)
            assert answers(leader.fetch(session, epoch, {})) == {}
            leader.replicas.shrink_isrs()
        assert leader.proposals == []
        # The same time without a fetch: the follower is out of sync on both partitions.
        leader.clock.advance(LAG_MS + 1)
        leader.replicas.shrink_isrs()
        assert sorted(leader.proposals) == [(("orders", 0), (ME,)), (("orders", 1), (ME,))]

    asyncio.run(main())
