"""aiokafka against a real local cluster of 1 controller and 2 brokers.

Its admin client creates, lists, describes, configures (AlterConfigs, which replaces a
topic's whole set of configs) and deletes topics and gets the right error codes; its producer
sends keyed and unkeyed records with headers and timestamps under all five codecs (snappy,
lz4 and zstd through cramjam), and its consumer (assign, no group) reads them back from the
earliest offset, from the latest and from a timestamp, exactly as produced. ``runnel log
dump`` shows each batch stored with its codec.

Each test runs one coroutine under ``asyncio.run`` with an overall bound.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from kafka_cluster import (
    BROKER_IDS,
    PARTITIONS,
    WAIT_S,
    KafkaCluster,
    RecordMaker,
    Sent,
    Stored,
    assert_offsets_follow_produce_order,
    assert_same_records,
    assert_stored_codecs,
    first_offsets_at_or_after,
    kafka,
    normal_headers,
    records_at_or_after,
    wait_until_listed,
)

__all__ = ["kafka"]  # the fixture

pytestmark = pytest.mark.slow
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
TEST_LIMIT_S = 90.0
T = TypeVar("T")
# Kafka error codes, as aiokafka's admin responses carry them (it raises on none of them)
NONE, INVALID_TOPIC_EXCEPTION, TOPIC_ALREADY_EXISTS, INVALID_REPLICATION_FACTOR = 0, 17, 36, 38
DYNAMIC_TOPIC_CONFIG = 1  # DescribeConfigs config_source


def run(coroutine: Awaitable[T]) -> T:
    return asyncio.run(asyncio.wait_for(coroutine, TEST_LIMIT_S))


async def admin_client(kafka: KafkaCluster) -> AIOKafkaAdminClient:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    return admin


async def create_topic(admin: AIOKafkaAdminClient, topic: NewTopic) -> int:
    """The topic's error code."""
    response = await admin.create_topics([topic])
    ((name, error_code, _message),) = response.topic_errors
    assert name == topic.name
    return int(error_code)


async def new_topic(kafka: KafkaCluster, name: str) -> None:
    admin = await admin_client(kafka)
    try:
        assert await create_topic(admin, NewTopic(name, PARTITIONS, 1)) == NONE
    finally:
        await admin.close()
    await asyncio.to_thread(wait_until_listed, kafka, name, PARTITIONS)


async def produce(
    kafka: KafkaCluster, topic: str, records: list[Sent], **config: Any
) -> list[Stored]:
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=20, **config)
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic, r.value, key=r.key, headers=list(r.headers), timestamp_ms=r.timestamp_ms
            )
            for r in records
        ]
        reports = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    delivered = []
    for r, metadata in zip(records, reports, strict=True):
        # Not metadata.timestamp: aiokafka gives each record of a batch the timestamp of the
        # batch's first (MessageBatch.done reuses its variable). The consumer sees them all.
        assert metadata.timestamp_type == 0 and metadata.offset >= 0  # CreateTime
        delivered.append(Stored(metadata.partition, metadata.offset, r))
    return delivered


async def consumer(kafka: KafkaCluster, topic: str) -> AIOKafkaConsumer:
    c = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False)
    await c.start()
    c.assign(partitions(topic))
    return c


def partitions(topic: str) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in range(PARTITIONS)]


async def read_to_end(c: AIOKafkaConsumer, topic: str) -> list[Stored]:
    """Every record from each partition's position to its end offset (asked for first)."""
    tps = partitions(topic)
    ends = await c.end_offsets(tps)
    records: list[Stored] = []
    deadline = time.monotonic() + WAIT_S
    while any([await c.position(tp) < ends[tp] for tp in tps]):
        assert time.monotonic() < deadline, f"timed out at {len(records)} records, ends {ends}"
        for messages in (await c.getmany(timeout_ms=200)).values():
            for m in messages:
                assert m.timestamp_type == 0, m  # CreateTime
                sent = Sent(m.key, m.value, normal_headers(m.headers), m.timestamp)
                records.append(Stored(m.partition, m.offset, sent))
    return records


def test_admin_lists_describes_configures_and_deletes_topics(kafka: KafkaCluster) -> None:
    run(_admin(kafka))


async def _admin(kafka: KafkaCluster) -> None:
    admin = await admin_client(kafka)
    try:
        configs = {"retention.ms": "3600000"}
        topic = NewTopic("ak-admin", PARTITIONS, 1, topic_configs=configs)
        assert await create_topic(admin, topic) == NONE
        await asyncio.to_thread(wait_until_listed, kafka, "ak-admin", PARTITIONS)
        assert "ak-admin" in await admin.list_topics()
        (described,) = await admin.describe_topics(["ak-admin"])
        info = sorted(described["partitions"], key=lambda p: p["partition"])
        assert [p["partition"] for p in info] == list(range(PARTITIONS))
        for p in info:
            assert p["error_code"] == NONE and p["leader"] in BROKER_IDS
            assert p["replicas"] == [p["leader"]] == p["isr"]
        assert {p["leader"] for p in info} == set(BROKER_IDS)  # both brokers lead

        await _configs_show_what_was_set(admin)
        for bad, error in [
            (NewTopic("ak-admin", 1, 1), TOPIC_ALREADY_EXISTS),
            (NewTopic("bad name!", 1, 1), INVALID_TOPIC_EXCEPTION),
            (NewTopic("ak-too-many-replicas", 1, 3), INVALID_REPLICATION_FACTOR),
        ]:
            assert await create_topic(admin, bad) == error, bad.name
        assert not {"bad name!", "ak-too-many-replicas"} & set(await admin.list_topics())

        response = await admin.delete_topics(["ak-admin"])
        assert [tuple(t) for t in response.topic_error_codes] == [("ak-admin", NONE)]
        deadline = time.monotonic() + WAIT_S
        while "ak-admin" in await admin.list_topics():
            assert time.monotonic() < deadline, "ak-admin is still listed"
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def _configs_show_what_was_set(admin: AIOKafkaAdminClient) -> None:
    async def described() -> dict[str, tuple[str, int]]:
        resource = ConfigResource(ConfigResourceType.TOPIC, "ak-admin")
        (response,) = await admin.describe_configs([resource])
        ((error, _message, _type, name, entries),) = response.resources
        assert error == NONE and name == "ak-admin"
        return {e[0]: (e[1], e[3]) for e in entries}  # name: (value, source)

    before = await described()
    assert before["retention.ms"] == ("3600000", DYNAMIC_TOPIC_CONFIG)
    assert before["cleanup.policy"][0] == "delete"
    assert before["cleanup.policy"][1] != DYNAMIC_TOPIC_CONFIG

    # AlterConfigs (not incremental) replaces the topic's configs: retention.ms goes back
    # to its default.
    change = ConfigResource(ConfigResourceType.TOPIC, "ak-admin", {"cleanup.policy": "compact"})
    (response,) = await admin.alter_configs([change])
    assert [tuple(r)[:2] for r in response.resources] == [(NONE, None)], response
    deadline = time.monotonic() + WAIT_S
    while (after := await described())["cleanup.policy"][0] != "compact":
        assert time.monotonic() < deadline, after["cleanup.policy"]
        await asyncio.sleep(0.2)
    assert after["cleanup.policy"] == ("compact", DYNAMIC_TOPIC_CONFIG)
    assert after["retention.ms"][1] != DYNAMIC_TOPIC_CONFIG, after["retention.ms"]


def test_every_codec_round_trips_from_earliest_and_from_a_timestamp(kafka: KafkaCluster) -> None:
    topic = "ak-codecs"
    rounds = run(_codecs(kafka, topic))
    batches = assert_stored_codecs(kafka, topic, rounds, {codec: codec for codec in CODECS})
    assert {(b.producer_id, b.timestamp_type) for b in batches} == {(-1, "create_time")}


async def _codecs(kafka: KafkaCluster, topic: str) -> dict[str, list[Stored]]:
    await new_topic(kafka, topic)
    maker = RecordMaker()
    rounds = {}
    for codec in CODECS:
        compression = None if codec == "none" else codec
        rounds[codec] = await produce(
            kafka, topic, maker.make(codec, 24), compression_type=compression
        )
    delivered = [r for codec in CODECS for r in rounds[codec]]
    assert_offsets_follow_produce_order(delivered)

    c = await consumer(kafka, topic)
    try:
        await c.seek_to_beginning()
        assert_same_records(await read_to_end(c, topic), delivered)

        since = rounds["snappy"][5].record.timestamp_ms
        found = await c.offsets_for_times({tp: since for tp in partitions(topic)})
        expected = first_offsets_at_or_after(delivered, since)
        assert {tp.partition: f and f.offset for tp, f in found.items()} == {
            p: expected.get(p) for p in range(PARTITIONS)
        }
        at = {(r.partition, r.offset): r.record.timestamp_ms for r in delivered}
        for tp, f in found.items():
            if f is None:
                await c.seek_to_end(tp)
            else:
                assert f.timestamp == at[tp.partition, f.offset]
                c.seek(tp, f.offset)
        assert_same_records(await read_to_end(c, topic), records_at_or_after(delivered, since))
    finally:
        await c.stop()
    return rounds


def test_from_latest_only_records_produced_afterwards_arrive(kafka: KafkaCluster) -> None:
    run(_latest(kafka, "ak-latest"))


async def _latest(kafka: KafkaCluster, topic: str) -> None:
    await new_topic(kafka, topic)
    maker = RecordMaker()
    old = await produce(kafka, topic, maker.make("old", 12))
    c = await consumer(kafka, topic)
    try:
        await c.seek_to_end()
        ends = {tp.partition: await c.position(tp) for tp in partitions(topic)}
        assert ends == {p: len([r for r in old if r.partition == p]) for p in range(PARTITIONS)}
        assert await c.getmany(timeout_ms=500) == {}  # nothing old
        new = await produce(kafka, topic, maker.make("new", 12), compression_type="lz4")
        assert_offsets_follow_produce_order(old + new)
        assert_same_records(await read_to_end(c, topic), new)
    finally:
        await c.stop()
