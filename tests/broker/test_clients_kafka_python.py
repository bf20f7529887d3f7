"""kafka-python against a real local cluster of 1 controller and 2 brokers.

Its admin client creates, lists, describes, configures and deletes topics and gets the right
errors; its producer (idempotent by default) sends keyed and unkeyed records with headers and
timestamps under every codec it can use here, and its consumer (assign, no group) reads them
back from the earliest offset, from the latest and from a timestamp, exactly as produced.
``runnel log dump`` shows each batch stored with its codec and the producer's id.

No snappy: kafka-python needs python-snappy for it (it does not use cramjam), which is not
installed, so it can neither produce nor consume snappy batches here.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
from kafka.errors import InvalidReplicationFactorError, InvalidTopicError, TopicAlreadyExistsError
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
    stored_batches,
    wait_until_listed,
)
from test_local_cluster import wait_for

__all__ = ["kafka"]  # the fixture

pytestmark = pytest.mark.slow
CODECS = ("none", "gzip", "lz4", "zstd")
WAIT_MS = int(WAIT_S * 1000)


def admin_client(kafka: KafkaCluster) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=kafka.bootstrap, request_timeout_ms=WAIT_MS)


def create_topic(kafka: KafkaCluster, name: str, configs: dict[str, str] | None = None) -> None:
    admin = admin_client(kafka)
    try:
        admin.create_topics([NewTopic(name, PARTITIONS, 1, topic_configs=configs or {})])
    finally:
        admin.close()
    wait_until_listed(kafka, name, PARTITIONS)


def produce(kafka: KafkaCluster, topic: str, records: list[Sent], **config: Any) -> list[Stored]:
    """Produce ``records`` with one producer (idempotent unless ``config`` says otherwise);
    where each was stored, in produce order."""
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=20, **config)
    try:
        futures = [
            producer.send(topic, r.value, r.key, list(r.headers), timestamp_ms=r.timestamp_ms)
            for r in records
        ]
        producer.flush(WAIT_S)
        delivered = []
        for r, future in zip(records, futures, strict=True):
            metadata = future.get(WAIT_S)
            assert metadata.timestamp == r.timestamp_ms and metadata.offset >= 0
            delivered.append(Stored(metadata.partition, metadata.offset, r))
        return delivered
    finally:
        producer.close(timeout=WAIT_S)


def consumer(kafka: KafkaCluster) -> KafkaConsumer:
    return KafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=None, enable_auto_commit=False)


def partitions(topic: str) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in range(PARTITIONS)]


def read_to_end(c: KafkaConsumer, topic: str) -> list[Stored]:
    """Every record from each partition's position to its end offset (asked for first)."""
    tps = partitions(topic)
    ends = c.end_offsets(tps)
    records: list[Stored] = []
    deadline = time.monotonic() + WAIT_S
    while any(c.position(tp) < ends[tp] for tp in tps):
        assert time.monotonic() < deadline, f"timed out at {len(records)} records, ends {ends}"
        for messages in c.poll(timeout_ms=200).values():
            for m in messages:
                assert m.timestamp_type == 0, m  # CreateTime
                sent = Sent(m.key, m.value, normal_headers(m.headers), m.timestamp)
                records.append(Stored(m.partition, m.offset, sent))
    return records


def test_admin_lists_describes_configures_and_deletes_topics(kafka: KafkaCluster) -> None:
    admin = admin_client(kafka)
    try:
        create_topic(kafka, "kp-admin", {"retention.ms": "3600000"})
        assert "kp-admin" in admin.list_topics()
        (described,) = admin.describe_topics(["kp-admin"])
        info = sorted(described["partitions"], key=lambda p: p["partition_index"])
        assert [p["partition_index"] for p in info] == list(range(PARTITIONS))
        for p in info:
            assert p["error_code"] == 0 and p["leader_id"] in BROKER_IDS
            assert p["replica_nodes"] == [p["leader_id"]] == p["isr_nodes"]
        assert {p["leader_id"] for p in info} == set(BROKER_IDS)  # both brokers lead
        cluster = admin.describe_cluster()
        assert sorted(b["broker_id"] for b in cluster["brokers"]) == list(BROKER_IDS)
        assert cluster["controller_id"] in BROKER_IDS

        _configs_show_what_was_set(admin)
        for topic, error in [
            (NewTopic("kp-admin", 1, 1), TopicAlreadyExistsError),
            (NewTopic("bad name!", 1, 1), InvalidTopicError),  # INVALID_TOPIC_EXCEPTION
            (NewTopic("kp-too-many-replicas", 1, 3), InvalidReplicationFactorError),
        ]:
            with pytest.raises(error):
                admin.create_topics([topic])
        assert not {"bad name!", "kp-too-many-replicas"} & set(admin.list_topics())

        admin.delete_topics(["kp-admin"])
        wait_for(
            "kp-admin to leave the topic list",
            lambda: "kp-admin" not in admin.list_topics() or None,
            WAIT_S,
        )
    finally:
        admin.close()


def _configs_show_what_was_set(admin: KafkaAdminClient) -> None:
    def described(config_filter: str = "modified") -> dict[str, Any]:
        resource = ConfigResource(ConfigResourceType.TOPIC, "kp-admin")
        answer = admin.describe_configs([resource], config_filter=config_filter)
        return dict(answer["topic"]["kp-admin"])

    modified = described()
    assert set(modified) == {"retention.ms"}, modified
    assert modified["retention.ms"]["value"] == "3600000"
    assert modified["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    assert described("all")["cleanup.policy"]["value"] == "delete"

    change = ConfigResource(ConfigResourceType.TOPIC, "kp-admin", {"cleanup.policy": "compact"})
    admin.alter_configs([change])  # IncrementalAlterConfigs, SET
    wait_for(
        "the altered cleanup.policy to be described",
        lambda: set(described()) == {"retention.ms", "cleanup.policy"} or None,
        WAIT_S,
    )
    after = described()
    assert after["cleanup.policy"]["value"] == "compact"
    assert after["retention.ms"]["value"] == "3600000"


def test_every_codec_round_trips_from_earliest_and_from_a_timestamp(kafka: KafkaCluster) -> None:
    topic = "kp-codecs"
    create_topic(kafka, topic)
    maker = RecordMaker()
    rounds = {
        codec: produce(
            kafka, topic, maker.make(codec, 24), compression_type=None if codec == "none" else codec
        )
        for codec in CODECS
    }
    delivered = [r for codec in CODECS for r in rounds[codec]]
    assert_offsets_follow_produce_order(delivered)

    c = consumer(kafka)
    try:
        c.assign(partitions(topic))
        c.seek_to_beginning()
        assert_same_records(read_to_end(c, topic), delivered)

        since = rounds["lz4"][5].record.timestamp_ms
        found = c.offsets_for_times({tp: since for tp in partitions(topic)})
        expected = first_offsets_at_or_after(delivered, since)
        assert {tp.partition: f and f.offset for tp, f in found.items()} == {
            p: expected.get(p) for p in range(PARTITIONS)
        }
        at = {(r.partition, r.offset): r.record.timestamp_ms for r in delivered}
        for tp, f in found.items():
            if f is None:
                c.seek_to_end(tp)
            else:
                assert f.timestamp == at[tp.partition, f.offset]
                c.seek(tp, f.offset)
        assert_same_records(read_to_end(c, topic), records_at_or_after(delivered, since))
    finally:
        c.close()

    batches = assert_stored_codecs(kafka, topic, rounds, {codec: codec for codec in CODECS})
    assert {b.timestamp_type for b in batches} == {"create_time"}


def test_from_latest_only_records_produced_afterwards_arrive(kafka: KafkaCluster) -> None:
    topic = "kp-latest"
    create_topic(kafka, topic)
    maker = RecordMaker()
    old = produce(kafka, topic, maker.make("old", 12))
    c = consumer(kafka)
    try:
        c.assign(partitions(topic))
        c.seek_to_end()
        ends = {tp.partition: c.position(tp) for tp in partitions(topic)}
        assert ends == {p: len([r for r in old if r.partition == p]) for p in range(PARTITIONS)}
        assert c.poll(timeout_ms=500) == {}  # nothing old
        new = produce(kafka, topic, maker.make("new", 12), compression_type="gzip")
        assert_offsets_follow_produce_order(old + new)
        assert_same_records(read_to_end(c, topic), new)
    finally:
        c.close()


def test_the_default_idempotent_producer_stores_every_record_exactly_once(
    kafka: KafkaCluster,
) -> None:
    topic = "kp-idempotent"
    create_topic(kafka, topic)
    delivered = produce(kafka, topic, RecordMaker().make("idempotent", 300), batch_size=4096)
    assert_offsets_follow_produce_order(delivered)
    c = consumer(kafka)
    try:
        c.assign(partitions(topic))
        c.seek_to_beginning()
        assert_same_records(read_to_end(c, topic), delivered)
    finally:
        c.close()
    batches = stored_batches(kafka, topic, PARTITIONS)
    assert len({b.producer_id for b in batches}) == 1 and batches[0].producer_id >= 0
    # one producer, from sequence 0 on a new topic: each batch's sequence is its offset
    assert all(b.base_sequence == b.base_offset for b in batches), batches
