"""The leader's side of replication through the Kafka API, in one process: follower fetches
(Fetch with a replica id) move the high watermark that acks=-1 produces wait for, answer a
diverging epoch, long-poll until the leader appends, and are refused to non-replicas.

A broker context over real partition logs in a temp dir and a metadata image built from
records (partition 0 of "orders": replicas 1 (here, the leader) and 2, both in the ISR);
frames go through the real dispatcher and codec. The fetchers' side runs against real
brokers in tests/replication.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import make_batch

from broker.context import BrokerContext, BrokerSettings
from broker.dispatcher import KafkaDispatcher
from broker.producer_ids import ProducerIdManager
from broker.protocol import ApiKey, ErrorCode, decode_response, encode_request
from broker.purgatory import FetchPurgatory
from broker.replica_manager import ReplicaManager
from broker.server import ConnectionInfo
from controller import records as rec
from controller.image import MetadataDelta, MetadataImage
from storage.config import LogConfig
from storage.log_manager import LogManager
from storage.records import iter_decoded
from storage.segment import FileSlice

ME, FOLLOWER = 1, 2
TOPIC_ID = bytes(range(16))
CONNECTION = ConnectionInfo("127.0.0.1:5555", 1, "CLIENT")
FETCH_V = 12
PRODUCE_V = 9


def image() -> MetadataImage:
    records = [
        rec.register_broker(ME, 0, b"i" * 16, [("CLIENT", "127.0.0.1", 9092)], fenced=False),
        rec.register_broker(FOLLOWER, 0, b"j" * 16, [("CLIENT", "127.0.0.1", 9093)], fenced=False),
        rec.topic("orders", TOPIC_ID),
        rec.partition(TOPIC_ID, 0, [ME, FOLLOWER], [ME, FOLLOWER], leader=ME),
    ]
    delta = MetadataDelta(MetadataImage.EMPTY)
    for offset, record in enumerate(records):
        delta.replay(record, offset)
    return delta.apply()


class Leader:
    def __init__(self, data_dir: Path) -> None:
        self.logs = LogManager([data_dir], LogConfig())
        self.logs.startup()
        purgatory, replica_purgatory = FetchPurgatory(), FetchPurgatory()
        self.replicas = ReplicaManager(
            ME, self.logs, purgatory=purgatory, replica_purgatory=replica_purgatory
        )
        self.image = image()
        self.replicas.apply(self.image)
        settings = BrokerSettings(ME, "cluster-x", "CLIENT")
        context = BrokerContext(
            settings,
            self.replicas,
            purgatory,
            ProducerIdManager(ME, None, lambda: 0),  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            lambda: self.image,
        )
        self.dispatcher = KafkaDispatcher(context)
        self.correlation_id = 0

    def send(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        """The reply: decoded now, or an awaitable of the decoded response."""
        self.correlation_id += 1
        parts = encode_request(api_key, version, self.correlation_id, "test", body)
        frame = memoryview(b"".join(bytes(p) for p in parts))[4:]  # type: ignore[arg-type]
        reply = self.dispatcher.handle(frame, CONNECTION)
        if inspect.isawaitable(reply):
            return _decoded_later(api_key, version, reply)
        return _decoded(api_key, version, reply)

    def produce(self, values: list[bytes], acks: int = -1, timeout_ms: int = 10_000) -> Any:
        data = [{"index": 0, "records": make_batch(values)}]
        body = {
            "transactional_id": None,
            "acks": acks,
            "timeout_ms": timeout_ms,
            "topic_data": [{"name": "orders", "partition_data": data}],
        }
        return self.send(ApiKey.PRODUCE, PRODUCE_V, body)

    def fetch(
        self,
        offset: int,
        *,
        replica_id: int = FOLLOWER,
        last_epoch: int = -1,
        wait_ms: int = 0,
        leader_epoch: int = 0,
    ) -> Any:
        partition = {
            "partition": 0,
            "current_leader_epoch": leader_epoch,
            "fetch_offset": offset,
            "last_fetched_epoch": last_epoch,
            "log_start_offset": 0,
            "partition_max_bytes": 1 << 20,
        }
        body = {
            "replica_id": replica_id,
            "max_wait_ms": wait_ms,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [{"topic": "orders", "partitions": [partition]}],
            "forgotten_topics_data": [],
            "rack_id": "",
        }
        return self.send(ApiKey.FETCH, FETCH_V, body)


def _decoded(api_key: int, version: int, reply: Any) -> Any:
    assert isinstance(reply, list)
    data = b"".join(p.read() if isinstance(p, FileSlice) else bytes(p) for p in reply)
    return decode_response(api_key, version, memoryview(data)[4:])[1]


async def _decoded_later(api_key: int, version: int, reply: Any) -> Any:
    return _decoded(api_key, version, await asyncio.wait_for(reply, 10))


def only(response: Any) -> Any:
    (topic,) = response.responses
    (partition,) = getattr(topic, "partitions", None) or topic.partition_responses
    return partition


def values(records: Any) -> list[bytes | None]:
    raw = records.read() if hasattr(records, "read") else bytes(records or b"")
    return [r.value for batch in iter_decoded(raw) for r in batch.records]


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
