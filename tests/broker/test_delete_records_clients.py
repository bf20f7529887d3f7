"""DeleteRecords from the three admin clients against a real local cluster (1 controller,
2 brokers; topics with replication factor 2, so every partition has a follower to wait for).

Each client deletes records; the answer's low watermark is the new log start on both
replicas; ListOffsets "earliest" and a consumer reading from the beginning start there and see
exactly the records above it; both replicas' log-start checkpoints hold the new start by the
time the answer comes. Refusals carry Kafka's codes, and a follower that cannot fetch makes
the request time out (REQUEST_TIMED_OUT) until it is back.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.structs import TopicPartition as AioPartition
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient
from kafka import TopicPartition as KpPartition
from kafka.errors import OffsetOutOfRangeError
from kafka_cluster import WAIT_S, KafkaCluster, kafka, wait_until_listed

from storage.checkpoint import OffsetCheckpointFile
from storage.topic_partition import TopicPartition as StoredPartition

__all__ = ["kafka"]  # the fixture

pytestmark = pytest.mark.slow
PER_PARTITION = 10


def admin(kafka: KafkaCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka.bootstrap})


def create_topic(kafka: KafkaCluster, name: str, config: dict[str, str] | None = None) -> None:
    """Two partitions, two replicas each, ``PER_PARTITION`` records in each (acks=all)."""
    client = admin(kafka)
    client.create_topics([NewTopic(name, 2, 2, config=config or {})])[name].result(WAIT_S)
    wait_until_listed(kafka, name, 2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "acks": "all"})
    for partition in (0, 1):
        for i in range(PER_PARTITION):
            producer.produce(name, b"v%d" % i, b"k%d" % i, partition=partition)
    assert producer.flush(WAIT_S) == 0, "records left undelivered"


def delete(
    kafka: KafkaCluster, offsets: list[TopicPartition], timeout_s: float = WAIT_S
) -> dict[int, Any]:
    """Each partition's DeletedRecords, or the KafkaException it failed with."""
    client = admin(kafka)  # kept until the futures are done: they fail if it goes first
    futures = client.delete_records(offsets, operation_timeout=timeout_s)
    done: dict[int, Any] = {}
    for tp, future in futures.items():
        try:
            done[tp.partition] = future.result(WAIT_S)
        except KafkaException as e:
            done[tp.partition] = e
    return done


def low_watermark(result: Any) -> int:
    assert not isinstance(result, KafkaException), result
    return int(result.low_watermark)


def error_code(result: Any) -> int:
    assert isinstance(result, KafkaException), result
    return int(result.args[0].code())


def watermarks(kafka: KafkaCluster, topic: str, partition: int) -> tuple[int, int]:
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "runnel-tests"})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=WAIT_S)
        return int(low), int(high)
    finally:
        c.close()


def read_from_beginning(kafka: KafkaCluster, topic: str, partition: int) -> list[tuple[int, bytes]]:
    c = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": "runnel-tests",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        c.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            message: Any = c.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                return got
            got.append((message.offset(), message.value()))
        raise AssertionError(f"{topic}-{partition}: no end of partition in {WAIT_S} s")
    finally:
        c.close()


def leader_and_follower(kafka: KafkaCluster, topic: str, partition: int) -> tuple[int, int]:
    found = admin(kafka).list_topics(topic, timeout=WAIT_S).topics[topic].partitions[partition]
    follower = next(r for r in found.replicas if r != found.leader)
    return found.leader, follower


def log_start_checkpoint(kafka: KafkaCluster, broker: int, topic: str, partition: int) -> int:
    path = kafka.data_dir / f"node-{broker}" / "data" / "log-start-offset-checkpoint"
    return OffsetCheckpointFile(path).read()[StoredPartition(topic, partition)]


def test_confluent_deletes_up_to_an_offset_and_to_the_high_watermark(kafka: KafkaCluster) -> None:
    name = "delete-records-confluent"
    create_topic(kafka, name)
    done = delete(kafka, [TopicPartition(name, 0, 4), TopicPartition(name, 1, OFFSET_END)])
    assert low_watermark(done[0]) == 4
    assert low_watermark(done[1]) == PER_PARTITION  # -1: the high watermark
    # Written before the answer: by the leader, and by the follower before it said it.
    for broker in leader_and_follower(kafka, name, 0):
        assert log_start_checkpoint(kafka, broker, name, 0) == 4, broker
    assert watermarks(kafka, name, 0) == (4, PER_PARTITION)
    assert watermarks(kafka, name, 1) == (PER_PARTITION, PER_PARTITION)
    assert read_from_beginning(kafka, name, 0) == [(i, b"v%d" % i) for i in range(4, 10)]
    assert read_from_beginning(kafka, name, 1) == []
    # Deleting below the log start changes nothing; the answer is the low watermark.
    assert low_watermark(delete(kafka, [TopicPartition(name, 0, 2)])[0]) == 4


def test_refusals_carry_kafkas_codes(kafka: KafkaCluster) -> None:
    name, compacted = "delete-records-refused", "delete-records-compacted"
    create_topic(kafka, name)
    create_topic(kafka, compacted, {"cleanup.policy": "compact"})
    cases = [
        (TopicPartition(name, 0, PER_PARTITION + 1), KafkaError.OFFSET_OUT_OF_RANGE),
        (TopicPartition(compacted, 0, 1), KafkaError.POLICY_VIOLATION),
    ]
    for asked, code in cases:
        assert error_code(delete(kafka, [asked])[asked.partition]) == code, asked
    assert watermarks(kafka, name, 0) == (0, PER_PARTITION)
    assert watermarks(kafka, compacted, 0) == (0, PER_PARTITION)


@pytest.fixture
def paused() -> Iterator[list[int]]:
    """Processes the test stops (SIGSTOP); each is continued at the end, whatever happens."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        os.kill(pid, signal.SIGCONT)


def test_a_follower_that_cannot_fetch_makes_the_request_time_out(
    kafka: KafkaCluster, paused: list[int]
) -> None:
    name = "delete-records-timeout"
    create_topic(kafka, name)
    _, follower = leader_and_follower(kafka, name, 0)
    pid = int((kafka.data_dir / f"node-{follower}" / "node.pid").read_text())
    os.kill(pid, signal.SIGSTOP)
    paused.append(pid)
    # Well within the broker session timeout (9 s): the follower stays registered and
    # unfenced, so its log start still counts.
    timed_out = delete(kafka, [TopicPartition(name, 0, 3)], timeout_s=1.0)[0]
    assert error_code(timed_out) == KafkaError.REQUEST_TIMED_OUT
    assert watermarks(kafka, name, 0) == (3, PER_PARTITION)  # the leader's start moved anyway
    os.kill(pid, signal.SIGCONT)
    paused.remove(pid)
    again = delete(kafka, [TopicPartition(name, 0, 3)])[0]
    assert low_watermark(again) == 3  # the follower has caught up with it


def test_kafka_python_deletes_records(kafka: KafkaCluster) -> None:
    name = "delete-records-kafka-python"
    create_topic(kafka, name)
    client = KafkaAdminClient(bootstrap_servers=kafka.bootstrap, request_timeout_ms=30_000)
    try:
        done = client.delete_records({KpPartition(name, 0): 6, KpPartition(name, 1): 1})
        assert {tp.partition: r["low_watermark"] for tp, r in done.items()} == {0: 6, 1: 1}
        with pytest.raises(OffsetOutOfRangeError):
            client.delete_records({KpPartition(name, 0): PER_PARTITION + 5})
    finally:
        client.close()
    assert watermarks(kafka, name, 0) == (6, PER_PARTITION)
    assert read_from_beginning(kafka, name, 1)[0] == (1, b"v1")


def test_aiokafka_deletes_records(kafka: KafkaCluster) -> None:
    name = "delete-records-aiokafka"
    create_topic(kafka, name)

    async def run() -> dict[AioPartition, int]:
        client = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
        await client.start()
        try:
            asked = {AioPartition(name, 0): RecordsToDelete(before_offset=7)}
            return await client.delete_records(asked, timeout_ms=30_000)
        finally:
            await client.close()

    assert asyncio.run(asyncio.wait_for(run(), WAIT_S)) == {AioPartition(name, 0): 7}
    assert watermarks(kafka, name, 0) == (7, PER_PARTITION)
