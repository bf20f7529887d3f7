"""A leader broker in one process, for tests of the replication side of the Kafka API: a
broker context over real partition logs in a temp dir and a metadata image built from
records ("orders" partitions 0..n-1: replicas 1 (here, the leader) and 2, both in the ISR).
Frames go through the real dispatcher and codec; ``send`` answers the decoded response now,
or an awaitable of it. ISR proposals go to ``proposals`` when asked for (the AlterPartition
sender is tested against a real controller elsewhere)."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

from support import FakeClock, make_batch

from broker.context import BrokerContext, BrokerSettings, ReplicationSettings
from broker.dispatcher import KafkaDispatcher
from broker.producer_ids import ProducerIdManager
from broker.protocol import ApiKey, decode_response, encode_request
from broker.purgatory import FetchPurgatory
from broker.replica_manager import ReplicaManager
from broker.server import ConnectionInfo
from controller import records as rec
from controller.image import MetadataDelta, MetadataImage
from controller.records import MetadataRecord
from replication.partition import Partition
from storage.config import LogConfig
from storage.log_manager import LogManager
from storage.records import iter_decoded
from storage.segment import FileSlice

ME, FOLLOWER = 1, 2
TOPIC_ID = bytes(range(16))
CONNECTION = ConnectionInfo("127.0.0.1:5555", 1, "CLIENT")
FETCH_V = 12
PRODUCE_V = 9


def orders_image(partitions: int) -> MetadataImage:
    records = [
        rec.register_broker(ME, 0, b"i" * 16, [("CLIENT", "127.0.0.1", 9092)], fenced=False),
        rec.register_broker(FOLLOWER, 0, b"j" * 16, [("CLIENT", "127.0.0.1", 9093)], fenced=False),
        rec.topic("orders", TOPIC_ID),
    ]
    records += [
        rec.partition(TOPIC_ID, p, [ME, FOLLOWER], [ME, FOLLOWER], leader=ME)
        for p in range(partitions)
    ]
    delta = MetadataDelta(MetadataImage.EMPTY)
    for offset, record in enumerate(records):
        delta.replay(record, offset)
    return delta.apply()


class DispatchLeader:
    """``clock``/``lag_ms``: the replica manager's (default: its own); ``propose``: record
    ISR proposals (and accept them) instead of having no sender."""

    def __init__(
        self,
        data_dir: Path,
        partitions: int = 1,
        *,
        clock: FakeClock | None = None,
        lag_ms: int | None = None,
        propose: bool = False,
    ) -> None:
        self.clock = clock
        self.logs = LogManager([data_dir], LogConfig())
        self.logs.startup()
        purgatory, replica_purgatory = FetchPurgatory(), FetchPurgatory()
        timing: dict[str, Any] = {}
        if clock is not None:
            timing["clock_ms"] = clock
        if lag_ms is not None:
            timing["replica_lag_time_max_ms"] = lag_ms
        self.replicas = ReplicaManager(
            ME, self.logs, purgatory=purgatory, replica_purgatory=replica_purgatory, **timing
        )
        self.proposals: list[tuple[tuple[str, int], tuple[int, ...]]] = []
        if propose:
            self.replicas.propose_isr = self._propose
        self.image = orders_image(partitions)
        self.replicas.apply(self.image)
        replication = (
            ReplicationSettings()
            if lag_ms is None
            else ReplicationSettings(replica_lag_time_max_ms=lag_ms)
        )
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

    def change(self, *records: MetadataRecord) -> None:
        """Replay controller records into the image, and apply it as the broker would."""
        delta = MetadataDelta(self.image)
        for i, record in enumerate(records):
            delta.replay(record, self.image.offset + 1 + i)
        self.image = delta.apply()
        self.replicas.apply(self.image)

    def _propose(self, partition: Partition, isr: tuple[int, ...]) -> bool:
        self.proposals.append((partition.key, isr))
        return True

    def handle(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        """The dispatcher's reply as the listener gets it: encoded parts, or an awaitable."""
        self.correlation_id += 1
        parts = encode_request(api_key, version, self.correlation_id, "test", body)
        frame = memoryview(b"".join(bytes(p) for p in parts))[4:]  # type: ignore[arg-type]
        return self.dispatcher.handle(frame, CONNECTION)

    def send(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        """The reply: decoded now, or an awaitable of the decoded response."""
        reply = self.handle(api_key, version, body)
        if inspect.isawaitable(reply):
            return decoded_later(api_key, version, reply)
        return _decoded(api_key, version, reply)

    def produce(
        self, values: list[bytes], *, partition: int = 0, acks: int = -1, timeout_ms: int = 10_000
    ) -> Any:
        data = [{"index": partition, "records": make_batch(values)}]
        body = {
            "transactional_id": None,
            "acks": acks,
            "timeout_ms": timeout_ms,
            "topic_data": [{"name": "orders", "partition_data": data}],
        }
        return self.send(ApiKey.PRODUCE, PRODUCE_V, body)

    def fetch_body(
        self,
        partitions: dict[int, dict[str, int]],
        *,
        replica_id: int = FOLLOWER,
        wait_ms: int = 0,
        session_id: int = 0,
        session_epoch: int = -1,
        forgotten: list[int] | None = None,
    ) -> dict[str, Any]:
        """A Fetch v12 body for "orders": partition -> its fields (fetch_offset,
        last_fetched_epoch, current_leader_epoch, log_start_offset; 1 MiB each)."""
        named = [
            {
                "partition": p,
                "current_leader_epoch": fields.get("current_leader_epoch", 0),
                "fetch_offset": fields["fetch_offset"],
                "last_fetched_epoch": fields.get("last_fetched_epoch", -1),
                "log_start_offset": fields.get("log_start_offset", 0),
                "partition_max_bytes": 1 << 20,
            }
            for p, fields in partitions.items()
        ]
        return {
            "replica_id": replica_id,
            "max_wait_ms": wait_ms,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": session_id,
            "session_epoch": session_epoch,
            "topics": [{"topic": "orders", "partitions": named}] if named else [],
            "forgotten_topics_data": (
                [{"topic": "orders", "partitions": forgotten}] if forgotten is not None else []
            ),
            "rack_id": "",
        }


def _decoded(api_key: int, version: int, reply: Any) -> Any:
    assert isinstance(reply, list)
    data = b"".join(p.read() if isinstance(p, FileSlice) else bytes(p) for p in reply)
    return decode_response(api_key, version, memoryview(data)[4:])[1]


async def decoded_later(api_key: int, version: int, reply: Any) -> Any:
    return _decoded(api_key, version, await asyncio.wait_for(reply, 10))


def values(records: Any) -> list[bytes | None]:
    raw = records.read() if hasattr(records, "read") else bytes(records or b"")
    return [r.value for batch in iter_decoded(raw) for r in batch.records]
