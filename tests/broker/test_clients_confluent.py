"""confluent-kafka (librdkafka 2.16) against a real local cluster of 1 controller and 2 brokers.

Its admin client creates, lists, describes, configures and deletes topics and gets the right
error codes; its producer sends keyed and unkeyed records with headers and timestamps under
every codec, and its consumer (assign, no group) reads them back from the earliest offset,
from the latest and from a timestamp, exactly as produced. ``runnel log dump`` shows how each
batch was stored, and that an idempotent producer's batches carry its producer id and
sequences.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TIMESTAMP_CREATE_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)
from kafka_cluster import (
    BROKER_IDS,
    FIND_COORDINATOR,
    PARTITIONS,
    WAIT_S,
    KafkaCluster,
    RecordMaker,
    Sent,
    Stored,
    advertised_versions,
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
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def admin_client(kafka: KafkaCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka.bootstrap})


def create_topic(
    kafka: KafkaCluster,
    name: str,
    partitions: int = PARTITIONS,
    config: dict[str, str] | None = None,
) -> None:
    admin = admin_client(kafka)  # kept: the futures fail if it is destroyed first
    admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])[name].result(WAIT_S)
    wait_until_listed(kafka, name, partitions)


def produce(kafka: KafkaCluster, topic: str, records: list[Sent], **config: Any) -> list[Stored]:
    """Produce ``records`` with one producer; their delivery reports, in produce order."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 20, **config})
    reports: list[Any] = [None] * len(records)

    def report_for(i: int) -> Any:
        def report(error: Any, message: Any) -> None:
            reports[i] = error or message

        return report

    for i, r in enumerate(records):
        producer.produce(
            topic, r.value, r.key, headers=list(r.headers), timestamp=r.timestamp_ms,
            on_delivery=report_for(i),
        )  # fmt: skip
    assert producer.flush(WAIT_S) == 0, "records left undelivered"
    delivered = []
    for r, message in zip(records, reports, strict=True):
        assert not isinstance(message, KafkaError), message
        assert message.timestamp() == (TIMESTAMP_CREATE_TIME, r.timestamp_ms)
        assert message.offset() >= 0 and 0 <= message.partition() < PARTITIONS
        delivered.append(Stored(message.partition(), message.offset(), r))
    return delivered


def consumer(kafka: KafkaCluster) -> Consumer:
    """No group: librdkafka demands a group.id, but nothing is committed under it."""
    return Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": "runnel-tests",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )


def read(c: Consumer, want: int, reach_end: set[int]) -> list[Stored]:
    """At least ``want`` records, then on to the end (EOF) of every partition in
    ``reach_end`` and of every partition a record came from: so extra records are seen too."""
    records: list[Stored] = []
    at_end: dict[int, bool] = {}
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        waiting = reach_end | {r.partition for r in records}
        if len(records) >= want and all(at_end.get(p) for p in waiting):
            return records
        message: Any = c.poll(0.2)
        if message is None:
            continue
        error = message.error()
        if error is not None:
            assert error.code() == KafkaError._PARTITION_EOF, error
            at_end[message.partition()] = True
            continue
        at_end[message.partition()] = False
        kind, timestamp = message.timestamp()
        assert kind == TIMESTAMP_CREATE_TIME, message.timestamp()
        sent = Sent(message.key(), message.value(), normal_headers(message.headers()), timestamp)
        records.append(Stored(message.partition(), message.offset(), sent))
    raise AssertionError(f"timed out: {len(records)} of {want} records, at end {at_end}")


def read_from(kafka: KafkaCluster, assignment: list[TopicPartition], want: int) -> list[Stored]:
    c = consumer(kafka)
    try:
        c.assign(assignment)
        return read(c, want, {tp.partition for tp in assignment})
    finally:
        c.close()


def everything(topic: str) -> list[TopicPartition]:
    return [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]


def test_admin_lists_describes_configures_and_deletes_topics(kafka: KafkaCluster) -> None:
    admin = admin_client(kafka)
    create_topic(kafka, "cf-admin", config={"retention.ms": "3600000"})
    metadata = admin.list_topics(timeout=WAIT_S)
    assert {b.id for b in metadata.brokers.values()} == set(BROKER_IDS)
    assert metadata.controller_id in BROKER_IDS  # clients send admin requests there
    partitions = metadata.topics["cf-admin"].partitions
    assert sorted(partitions) == list(range(PARTITIONS))
    for p in partitions.values():
        assert p.error is None and p.replicas == [p.leader] and p.isrs == [p.leader]
    assert {p.leader for p in partitions.values()} == set(BROKER_IDS)  # both brokers lead

    (described,) = admin.describe_topics(TopicCollection(["cf-admin"])).values()
    info = described.result(WAIT_S).partitions
    assert [
        (i.id, i.leader.id, [r.id for r in i.replicas], [r.id for r in i.isr]) for i in info
    ] == [
        (i, partitions[i].leader, [partitions[i].leader], [partitions[i].leader])
        for i in range(PARTITIONS)
    ]

    _configs_show_what_was_set(admin)
    _create_errors(admin)
    _partitions_are_added(kafka, admin)

    admin.delete_topics(["cf-admin"])["cf-admin"].result(WAIT_S)
    wait_for(
        "cf-admin to leave the metadata",
        lambda: "cf-admin" not in admin.list_topics(timeout=WAIT_S).topics or None,
        WAIT_S,
    )


def _partitions_are_added(kafka: KafkaCluster, admin: AdminClient) -> None:
    """CreatePartitions, forwarded to the controller: new partitions get leaders and serve;
    shrinking is refused."""
    admin.create_partitions([NewPartitions("cf-admin", PARTITIONS + 2)])["cf-admin"].result(WAIT_S)
    wait_until_listed(kafka, "cf-admin", PARTITIONS + 2)
    added = admin.list_topics("cf-admin", timeout=WAIT_S).topics["cf-admin"].partitions
    assert all(added[p].leader in BROKER_IDS for p in range(PARTITIONS, PARTITIONS + 2))
    with pytest.raises(KafkaException) as raised:
        admin.create_partitions([NewPartitions("cf-admin", 1)])["cf-admin"].result(WAIT_S)
    assert raised.value.args[0].code() == KafkaError.INVALID_PARTITIONS, raised.value
    reports: list[Any] = []
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    producer.produce(
        "cf-admin", b"new", b"key", partition=PARTITIONS + 1, on_delivery=_keep(reports)
    )  # keyed: the topic is compacted by now
    assert producer.flush(WAIT_S) == 0
    ((error, message),) = reports
    assert error is None and (message.partition(), message.offset()) == (PARTITIONS + 1, 0)


def _keep(reports: list[Any]) -> Any:
    def report(error: Any, message: Any) -> None:
        reports.append((error, message))

    return report


def _configs_show_what_was_set(admin: AdminClient) -> None:
    resource = ConfigResource("TOPIC", "cf-admin")

    def described() -> dict[str, Any]:
        (future,) = admin.describe_configs([resource]).values()
        return dict(future.result(WAIT_S))

    configs = described()
    retention = configs["retention.ms"]
    assert (
        retention.value == "3600000" and retention.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    )
    assert configs["cleanup.policy"].value == "delete"
    assert configs["cleanup.policy"].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value

    change = ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)
    altered = ConfigResource("TOPIC", "cf-admin", incremental_configs=[change])
    (future,) = admin.incremental_alter_configs([altered]).values()
    future.result(WAIT_S)
    policy = wait_for(
        "the altered cleanup.policy to be described",
        lambda: ((d := described()["cleanup.policy"]).value == "compact" and d) or None,
        WAIT_S,
    )
    assert policy.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert described()["retention.ms"].value == "3600000"  # untouched by the SET


def _create_errors(admin: AdminClient) -> None:
    for topic, error in [
        (NewTopic("cf-admin", 1, 1), KafkaError.TOPIC_ALREADY_EXISTS),
        (NewTopic("bad name!", 1, 1), KafkaError.TOPIC_EXCEPTION),  # INVALID_TOPIC_EXCEPTION
        (NewTopic("cf-too-many-replicas", 1, 3), KafkaError.INVALID_REPLICATION_FACTOR),
    ]:
        with pytest.raises(KafkaException) as raised:
            admin.create_topics([topic])[topic.topic].result(WAIT_S)
        assert raised.value.args[0].code() == error, raised.value
    listed = admin.list_topics(timeout=WAIT_S).topics
    assert "bad name!" not in listed and "cf-too-many-replicas" not in listed


def test_every_codec_round_trips_from_earliest_and_from_a_timestamp(kafka: KafkaCluster) -> None:
    topic = "cf-codecs"
    create_topic(kafka, topic)
    maker = RecordMaker()
    rounds = {
        codec: produce(kafka, topic, maker.make(codec, 24), **{"compression.type": codec})
        for codec in CODECS
    }
    delivered = [r for codec in CODECS for r in rounds[codec]]
    assert_offsets_follow_produce_order(delivered)

    assert_same_records(read_from(kafka, everything(topic), len(delivered)), delivered)

    since = rounds["snappy"][5].record.timestamp_ms
    c = consumer(kafka)
    try:
        wanted = [TopicPartition(topic, p, since) for p in range(PARTITIONS)]
        found = c.offsets_for_times(wanted, timeout=WAIT_S)
        expected = first_offsets_at_or_after(delivered, since)
        assert {tp.partition: tp.offset for tp in found} == {
            p: expected.get(p, OFFSET_END) for p in range(PARTITIONS)
        }
        c.assign(found)
        later = records_at_or_after(delivered, since)
        assert_same_records(read(c, len(later), set(range(PARTITIONS))), later)
    finally:
        c.close()

    # librdkafka compresses lz4 only if the broker advertises FindCoordinator (its "LZ4"
    # feature flag); without it, it silently sends lz4 batches uncompressed.
    assert FIND_COORDINATOR in advertised_versions(kafka.bootstrap)
    batches = assert_stored_codecs(kafka, topic, rounds, {codec: codec for codec in CODECS})
    assert {(b.producer_id, b.timestamp_type) for b in batches} == {(-1, "create_time")}


def test_from_latest_only_records_produced_afterwards_arrive(kafka: KafkaCluster) -> None:
    topic = "cf-latest"
    create_topic(kafka, topic)
    maker = RecordMaker()
    old = produce(kafka, topic, maker.make("old", 12))
    c = consumer(kafka)
    try:
        c.assign([TopicPartition(topic, p, OFFSET_END) for p in range(PARTITIONS)])
        assert read(c, 0, set(range(PARTITIONS))) == []  # every partition at its end
        new = produce(kafka, topic, maker.make("new", 12), **{"compression.type": "zstd"})
        assert_offsets_follow_produce_order(old + new)
        assert_same_records(read(c, len(new), set()), new)
    finally:
        c.close()


def test_an_idempotent_producer_stores_every_record_exactly_once(kafka: KafkaCluster) -> None:
    topic = "cf-idempotent"
    create_topic(kafka, topic)
    records = RecordMaker().make("idempotent", 300)
    config = {"enable.idempotence": True, "linger.ms": 5, "batch.num.messages": 20}
    delivered = produce(kafka, topic, records, **config)
    assert_offsets_follow_produce_order(delivered)
    assert_same_records(read_from(kafka, everything(topic), len(delivered)), delivered)
    batches = stored_batches(kafka, topic, PARTITIONS)
    assert len({b.producer_id for b in batches}) == 1 and batches[0].producer_id >= 0
    # one producer, from sequence 0 on a new topic: each batch's sequence is its offset
    assert all(b.base_sequence == b.base_offset for b in batches), batches
