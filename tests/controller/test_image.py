"""The metadata image: one test per replay rule, snapshots and digests, immutability, cost.

A property test draws record sequences from a tiny model that only writes what a correct
controller could write, replays them in random batches, and checks that the snapshot of the
result decodes (and replays) to the same image with the same digest, and that the derived
per-broker load always equals a full recount.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import assert_imports_none_of

from controller import records as rec
from controller.broker_load import BrokerLoad, count_load
from controller.image import (
    Endpoint,
    ImageError,
    MetadataDelta,
    MetadataImage,
    PartitionState,
    decode_snapshot,
    encode_snapshot,
    image_from_records,
)
from controller.records import ConfigResourceType, MetadataRecord, RecordError, SnapshotError

EMPTY = MetadataImage.EMPTY
TOPIC = ConfigResourceType.TOPIC
BROKER = ConfigResourceType.BROKER


def tid(n: int) -> bytes:
    return n.to_bytes(16, "big")


ORDERS = tid(1)


def replay(image: MetadataImage, *records: MetadataRecord) -> MetadataImage:
    delta = MetadataDelta(image)
    for offset, record in enumerate(records, start=image.offset + 1):
        delta.replay(record, offset)
    return delta.apply()


def cluster() -> MetadataImage:
    """Brokers 1-3 (epochs 10, 11, 12, unfenced), topic "orders" with partitions 0 and 1."""
    return replay(
        EMPTY,
        rec.register_broker(1, 10, b"i1" * 8, [("PLAINTEXT", "h1", 9092)], "r1", fenced=False),
        rec.register_broker(2, 11, b"i2" * 8, [("PLAINTEXT", "h2", 9092)], "r2", fenced=False),
        rec.register_broker(3, 12, b"i3" * 8, [("PLAINTEXT", "h3", 9092)], None, fenced=False),
        rec.topic("orders", ORDERS),
        rec.partition(ORDERS, 0, [1, 2, 3], [1, 2, 3], leader=1),
        rec.partition(ORDERS, 1, [2, 3, 1], [2, 3, 1], leader=2),
    )


# -- records -----------------------------------------------------------------------------------


def test_a_record_survives_encode_and_decode() -> None:
    record = rec.partition_change(ORDERS, 3, isr=[1, 2])
    assert rec.decode(rec.encode(record)) == record


@pytest.mark.parametrize(
    "data",
    [b"\xff\xff\xff", b"", bytes([0xBA, 0x06, 0x01])],  # garbage, empty, only field 103
    ids=["garbage", "empty", "unknown-field-only"],
)
def test_bytes_that_carry_no_record_raise_record_error(data: bytes) -> None:
    with pytest.raises(RecordError):
        rec.decode(data)


def test_encoding_a_record_without_a_type_raises() -> None:
    with pytest.raises(RecordError):
        rec.encode(MetadataRecord())


# -- brokers -----------------------------------------------------------------------------------


def test_register_broker_adds_a_fenced_registration_as_the_record_says() -> None:
    image = replay(EMPTY, rec.register_broker(7, 3, b"x" * 16, [("PLAINTEXT", "h", 1)], "r"))
    b = image.brokers[7]
    assert (b.broker_epoch, b.incarnation_id, b.rack) == (3, b"x" * 16, "r")
    assert b.listeners == (Endpoint("PLAINTEXT", "h", 1),)
    assert b.fenced and not b.in_controlled_shutdown
    assert image.next_broker_epoch == 4


def test_register_broker_replaces_an_earlier_registration_of_that_id() -> None:
    image = replay(cluster(), rec.broker_registration_change(1, 10, in_controlled_shutdown=True))
    image = replay(image, rec.register_broker(1, 20, b"n" * 16, [], None))
    b = image.brokers[1]
    assert (b.broker_epoch, b.incarnation_id, b.rack, b.listeners) == (20, b"n" * 16, None, ())
    assert b.fenced and not b.in_controlled_shutdown
    assert image.next_broker_epoch == 21


def test_register_broker_at_an_epoch_not_above_the_current_one_raises() -> None:
    with pytest.raises(ImageError, match="not above"):
        replay(cluster(), rec.register_broker(1, 10, b"n" * 16))


def test_unregister_broker_removes_it_and_keeps_its_epoch_taken() -> None:
    image = replay(cluster(), rec.unregister_broker(3, 12))
    assert 3 not in image.brokers
    assert image.next_broker_epoch == 13


def test_fence_and_unfence_set_the_flag() -> None:
    fenced = replay(cluster(), rec.fence_broker(2, 11))
    assert fenced.brokers[2].fenced and fenced.unfenced_broker_ids() == (1, 3)
    unfenced = replay(fenced, rec.unfence_broker(2, 11))
    assert not unfenced.brokers[2].fenced and unfenced.unfenced_broker_ids() == (1, 2, 3)


def test_broker_registration_change_sets_only_the_flags_it_carries() -> None:
    image = replay(cluster(), rec.broker_registration_change(1, 10, in_controlled_shutdown=True))
    assert image.brokers[1].in_controlled_shutdown and not image.brokers[1].fenced
    image = replay(image, rec.broker_registration_change(1, 10, fenced=True))
    assert image.brokers[1].in_controlled_shutdown and image.brokers[1].fenced


@pytest.mark.parametrize(
    "record",
    [
        rec.fence_broker(1, 9),
        rec.unfence_broker(1, 9),
        rec.broker_registration_change(1, 9, in_controlled_shutdown=True),
        rec.unregister_broker(1, 9),
        rec.fence_broker(42, 10),  # no such broker
    ],
    ids=["fence", "unfence", "change", "unregister", "unknown-broker"],
)
def test_records_for_a_stale_broker_epoch_are_ignored_and_counted(
    record: MetadataRecord,
) -> None:
    before = replay(cluster(), rec.fence_broker(1, 10))
    delta = MetadataDelta(before)
    delta.replay(record, before.offset + 1)
    after = delta.apply()
    assert delta.ignored_records == 1 and "broker" in delta.last_ignored
    assert after.brokers == before.brokers and after.offset == before.offset + 1


# -- topics and partitions ---------------------------------------------------------------------


def test_topic_adds_a_topic_findable_by_name_and_id() -> None:
    image = cluster()
    topic = image.topic_by_name("orders")
    assert topic is not None and topic.topic_id == ORDERS and image.topics[ORDERS] is topic
    assert image.partition_count() == 2 and image.topic_by_name("nope") is None


@pytest.mark.parametrize(
    "record",
    [rec.topic("orders", tid(2)), rec.topic("other", ORDERS), rec.topic("short", b"id")],
    ids=["same-name", "same-id", "bad-id"],
)
def test_a_duplicate_or_malformed_topic_raises(record: MetadataRecord) -> None:
    with pytest.raises(ImageError):
        replay(cluster(), record)


def test_partition_adds_and_replaces_a_partition_verbatim() -> None:
    image = replay(cluster(), rec.partition(ORDERS, 2, [3, 1], [3], 3, 5, 7))
    p = image.partition(ORDERS, 2)
    assert p is not None
    assert (p.replicas, p.isr, p.leader, p.leader_epoch, p.partition_epoch) == (
        (3, 1),
        (3,),
        3,
        5,
        7,
    )
    image = replay(image, rec.partition(ORDERS, 2, [1], [1], 1, 9, 9))
    assert image.partition(ORDERS, 2) == PartitionState(ORDERS, 2, (1,), (1,), 1, 9, 9)


@pytest.mark.parametrize(
    "record",
    [
        rec.partition(tid(9), 0, [1], [1], 1),  # unknown topic
        rec.partition(ORDERS, 0, [], [], -1),  # no replicas
        rec.partition(ORDERS, 0, [1, 1], [1], 1),  # a replica twice
        rec.partition(ORDERS, 0, [1, 2], [3], -1),  # ISR outside the replicas
        rec.partition(ORDERS, 0, [1, 2], [2], 1),  # leader outside the ISR
        rec.partition_change(ORDERS, 5, leader=1),  # unknown partition
        rec.partition_change(tid(9), 0, leader=1),  # unknown topic
        rec.partition_change(ORDERS, 0, isr=[2, 3]),  # leaves leader 1 outside the ISR
        rec.partition_change(ORDERS, 0, replicas=[2, 3]),  # leaves ISR member 1 outside
    ],
)
def test_partition_records_that_break_partition_invariants_raise(record: MetadataRecord) -> None:
    with pytest.raises(ImageError):
        replay(cluster(), record)


def test_partition_change_leaves_absent_fields_unchanged() -> None:
    image = replay(cluster(), rec.partition_change(ORDERS, 0, isr=[1, 2]))
    p = image.partition(ORDERS, 0)
    assert p is not None and (p.replicas, p.isr, p.leader) == ((1, 2, 3), (1, 2), 1)


def test_a_leader_change_bumps_the_leader_and_partition_epochs() -> None:
    image = replay(cluster(), rec.partition_change(ORDERS, 0, leader=2))
    p = image.partition(ORDERS, 0)
    assert p is not None and (p.leader, p.leader_epoch, p.partition_epoch) == (2, 1, 1)
    image = replay(image, rec.partition_change(ORDERS, 0, leader=-1))
    p = image.partition(ORDERS, 0)
    assert p is not None and (p.leader, p.leader_epoch, p.partition_epoch) == (-1, 2, 2)


@pytest.mark.parametrize(
    "change",
    [
        {"isr": [1, 3]},  # an ISR shrink: KAFKA-15021
        {"replicas": [1, 2, 3, 4], "isr": [1, 2, 3]},  # a replicas-only change
        {"leader": 1},  # the same leader again is no leader change
        {},  # an empty change is still a change
    ],
    ids=["isr-only", "replicas-only", "same-leader", "empty"],
)
def test_a_change_without_a_new_leader_bumps_only_the_partition_epoch(
    change: dict[str, list[int] | int],
) -> None:
    image = replay(cluster(), rec.partition_change(ORDERS, 0, **change))  # type: ignore[arg-type]
    p = image.partition(ORDERS, 0)
    assert p is not None and (p.leader, p.leader_epoch, p.partition_epoch) == (1, 0, 1)


def test_remove_topic_drops_the_topic_its_name_and_its_configs() -> None:
    image = replay(
        cluster(),
        rec.config(TOPIC, "orders", "retention.ms", "1000"),
        rec.config(BROKER, "1", "log.dirs", "/d"),
        rec.remove_topic(ORDERS),
    )
    assert ORDERS not in image.topics and "orders" not in image.topic_ids
    assert (TOPIC, "orders") not in image.configs and (BROKER, "1") in image.configs
    assert image.partition_count() == 0 and image.leaders_of(1) == ()


def test_remove_topic_of_an_unknown_topic_raises() -> None:
    with pytest.raises(ImageError):
        replay(cluster(), rec.remove_topic(tid(9)))


def test_a_removed_topic_name_can_be_created_again_under_a_new_id() -> None:
    image = replay(cluster(), rec.remove_topic(ORDERS), rec.topic("orders", tid(2)))
    again = image.topic_by_name("orders")
    assert again is not None and again.topic_id == tid(2) and len(again.partitions) == 0


def recount(image: MetadataImage) -> dict[int, BrokerLoad]:
    return count_load(p.replicas for t in image.topics.values() for p in t.partitions.values())


def test_broker_load_follows_partitions_as_they_come_change_and_go() -> None:
    image = cluster()  # orders-0 on [1, 2, 3], orders-1 on [2, 3, 1]
    assert image.broker_load == {1: (2, 1), 2: (2, 1), 3: (2, 0)}
    image = replay(image, rec.partition_change(ORDERS, 0, replicas=[3, 1], isr=[3, 1], leader=3))
    assert image.broker_load == {1: (2, 0), 2: (1, 1), 3: (2, 1)} == recount(image)
    image = replay(image, rec.partition(ORDERS, 1, [4], [4], 4))  # replaced verbatim
    assert image.broker_load == {1: (1, 0), 3: (1, 1), 4: (1, 1)} == recount(image)
    assert image.partition_count() == 2
    image = replay(image, rec.remove_topic(ORDERS))
    assert dict(image.broker_load) == {} and image.partition_count() == 0


def test_broker_load_is_shared_when_no_replica_list_changed() -> None:
    before = cluster()
    after = replay(
        before,
        rec.partition_change(ORDERS, 0, isr=[1, 2], leader=2),
        rec.fence_broker(3, 12),
        rec.topic("empty", tid(2)),
    )
    assert after.broker_load is before.broker_load


def test_broker_load_is_neither_in_the_snapshot_nor_in_the_digest() -> None:
    image = cluster()
    kinds = {r.WhichOneof("record") for r in image.to_records()}
    assert kinds == {"register_broker", "topic", "partition"}
    assert decode_snapshot(encode_snapshot(image)).broker_load == image.broker_load


def test_leaders_of_and_replicas_of_a_broker() -> None:
    image = cluster()
    assert [(p.topic_id, p.partition_id) for p in image.leaders_of(1)] == [(ORDERS, 0)]
    assert len(image.replicas_of(3)) == 2 and image.replicas_of(4) == ()


# -- configs, producer ids, features, no-op, offsets -------------------------------------------


def test_config_sets_and_deletes_one_entry_and_an_empty_resource_goes() -> None:
    image = replay(
        EMPTY,
        rec.config(BROKER, "", "a", "1"),
        rec.config(BROKER, "", "b", "2"),
        rec.config(BROKER, "", "a", None),
    )
    assert image.configs == {(BROKER, ""): {"b": "2"}}
    image = replay(image, rec.config(BROKER, "", "b", None), rec.config(BROKER, "", "zz", None))
    assert dict(image.configs) == {}


def test_config_for_an_unknown_resource_type_raises() -> None:
    record = rec.config(TOPIC, "t", "a", "1")
    record.config.resource_type = 0  # type: ignore[assignment]
    with pytest.raises(ImageError):
        replay(EMPTY, record)


def test_producer_ids_set_the_next_producer_id_and_never_go_back() -> None:
    image = replay(EMPTY, rec.producer_ids(1, 10, 1000), rec.producer_ids(2, 11, 2000))
    assert image.next_producer_id == 2000
    with pytest.raises(ImageError):
        replay(image, rec.producer_ids(1, 10, 1999))


def test_feature_level_sets_a_feature_and_level_zero_removes_it() -> None:
    image = replay(EMPTY, rec.feature_level("metadata.version", 3))
    assert image.features == {"metadata.version": 3}
    assert dict(replay(image, rec.feature_level("metadata.version", 0)).features) == {}


def test_no_op_changes_nothing_but_the_offset() -> None:
    before = cluster()
    after = replay(before, rec.no_op())
    assert after.offset == before.offset + 1
    assert image_from_records(after.to_records(), before.offset) == before


def test_every_replay_advances_the_offset_and_offsets_never_go_back() -> None:
    delta = MetadataDelta(EMPTY)
    delta.replay(rec.no_op(), 5)
    delta.replay(rec.feature_level("f", 1), 9)
    assert delta.apply().offset == 9
    with pytest.raises(ImageError):
        delta.replay(rec.no_op(), 9)


def test_a_record_that_raises_leaves_the_delta_as_it_was() -> None:
    delta = MetadataDelta(cluster())
    delta.replay(rec.partition_change(ORDERS, 0, leader=2), 100)
    before = delta.apply()
    for bad in (rec.partition_change(ORDERS, 0, isr=[3]), rec.topic("orders", tid(5))):
        with pytest.raises(ImageError):
            delta.replay(bad, 101)
    assert delta.apply() == before


# -- immutability and sharing ------------------------------------------------------------------


def test_an_image_is_not_changed_by_later_deltas() -> None:
    old = replay(cluster(), rec.config(TOPIC, "orders", "a", "1"), rec.feature_level("f", 1))
    records, digest = old.to_records(), old.digest()
    delta = MetadataDelta(old)
    changes = [
        rec.partition_change(ORDERS, 0, leader=2),
        rec.partition(ORDERS, 5, [1], [1], 1),
        rec.config(TOPIC, "orders", "a", "2"),
        rec.fence_broker(1, 10),
        rec.feature_level("f", 2),
        rec.topic("new", tid(2)),
    ]
    for offset, record in enumerate(changes, start=old.offset + 1):
        delta.replay(record, offset)
    first = delta.apply()
    delta.replay(rec.remove_topic(ORDERS), first.offset + 1)
    delta.replay(rec.unregister_broker(2, 11), first.offset + 2)
    delta.apply()
    assert old.to_records() == records and old.digest() == digest
    assert first.partition(ORDERS, 0) is not None and 2 in first.brokers  # first kept too


def test_image_mappings_are_read_only() -> None:
    image = replay(cluster(), rec.config(TOPIC, "orders", "a", "1"), rec.feature_level("f", 1))
    topic = image.topics[ORDERS]
    targets: list[tuple[object, object]] = [
        (image.brokers, 9),
        (image.topics, b"x"),
        (image.topic_ids, "x"),
        (image.configs, (TOPIC, "x")),
        (image.configs[(TOPIC, "orders")], "b"),
        (image.features, "g"),
        (topic.partitions, 9),
        (image.broker_load, 9),
    ]
    for mapping, key in targets:
        with pytest.raises(TypeError):
            mapping[key] = None  # type: ignore[index]


def _creation_records(topics: int, partitions: int) -> Iterator[MetadataRecord]:
    for t in range(topics):
        yield rec.topic(f"t{t}", tid(t + 1))
        for p in range(partitions):
            yield rec.partition(tid(t + 1), p, [1, 2, 3], [1, 2, 3], 1)


def _batches(records: Iterator[MetadataRecord], size: int) -> Iterator[list[MetadataRecord]]:
    batch: list[MetadataRecord] = []
    for record in records:
        batch.append(record)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _topic_id_of(record: MetadataRecord) -> bytes:
    return record.topic.topic_id if record.HasField("topic") else record.partition.topic_id


def test_apply_rebuilds_only_touched_topics_so_replay_cost_stays_linear() -> None:
    """100,000 partitions (10,000 topics x 10) in batches of 1,000: each apply builds a new
    TopicImage only for the topics its batch touched and shares every other one, so the
    Python work is linear in the records (the top-level dict copy is C-level, once per apply)."""
    image, rebuilt, records = EMPTY, 0, 0
    for batch in _batches(_creation_records(10_000, 10), 1_000):
        new = replay(image, *batch)
        touched = {_topic_id_of(r) for r in batch}
        fresh = {t for t, topic in new.topics.items() if image.topics.get(t) is not topic}
        assert fresh == touched
        rebuilt, records, image = rebuilt + len(fresh), records + len(batch), new
    assert image.partition_count() == 100_000
    assert rebuilt <= records // 11 + records // 1_000  # each topic once, plus batch seams
    changed = replay(image, *(rec.partition_change(tid(t), 0, isr=[1, 2]) for t in range(1, 101)))
    for t in (tid(1), tid(100), tid(101)):
        assert changed.topics[t].partitions[1] is image.topics[t].partitions[1]
    assert changed.topics[tid(101)] is image.topics[tid(101)]


# -- snapshots and digests ---------------------------------------------------------------------


def test_to_records_lists_the_image_in_canonical_order() -> None:
    image = replay(
        cluster(),
        rec.feature_level("z", 1),
        rec.topic("alpha", tid(7)),
        rec.config(TOPIC, "orders", "a", "1"),
        rec.broker_registration_change(2, 11, in_controlled_shutdown=True),
        rec.producer_ids(1, 10, 50),
    )
    kinds = [r.WhichOneof("record") for r in image.to_records()]
    assert kinds == [
        "feature_level",
        *["register_broker"] * 2,
        "broker_registration_change",
        "register_broker",
        "topic",  # alpha sorts before orders
        "topic",
        "partition",
        "partition",
        "config",
        "producer_ids",
    ]


def test_the_broker_epoch_high_water_mark_survives_a_snapshot() -> None:
    image = replay(cluster(), rec.unregister_broker(3, 12))  # broker 3 held epoch 12
    assert image.next_broker_epoch == 13
    loaded = [decode_snapshot(encode_snapshot(image))]
    loaded.append(image_from_records(image.to_records(), image.offset))
    assert loaded == [image, image] and loaded[0].next_broker_epoch == 13
    kinds = [r.WhichOneof("record") for r in image.to_records()]
    assert "broker_epoch_high_water" in kinds and "unregister_broker" not in kinds


def test_a_snapshot_holds_the_image_offset() -> None:
    image = replay(cluster(), rec.no_op())
    offset, _ = rec.unpack_snapshot(encode_snapshot(image))
    assert offset == image.offset == decode_snapshot(encode_snapshot(image)).offset


def test_the_empty_image_snapshots_to_no_records() -> None:
    assert EMPTY.to_records() == [] and decode_snapshot(encode_snapshot(EMPTY)) == EMPTY


def test_any_damaged_byte_or_length_in_a_snapshot_raises_snapshot_error() -> None:
    data = encode_snapshot(cluster())
    for position in range(len(data)):
        damaged = bytearray(data)
        damaged[position] ^= 0x41
        with pytest.raises(SnapshotError):
            decode_snapshot(bytes(damaged))
    for length in range(len(data)):
        with pytest.raises(SnapshotError):
            decode_snapshot(data[:length])
    with pytest.raises(SnapshotError):
        decode_snapshot(data + b"\x00")


def _container(body: bytes, count: int, version: int = 1) -> bytes:
    head = struct.pack(">4sHqI", b"RNMI", version, 7, count)
    return head + body + struct.pack(">I", crc32c.crc32c(body, crc32c.crc32c(head)))


@pytest.mark.parametrize(
    ("body", "count", "version"),
    [
        (rec.frame_records([rec.no_op()]), 2, 1),  # count disagrees
        (rec.frame_records([rec.no_op()]), 1, 2),  # unknown version
        (struct.pack(">I", 3) + b"\xff\xff\xff", 1, 1),  # a record that does not parse
        (struct.pack(">I", 9) + b"\x00", 1, 1),  # a length past the end
        (rec.frame_records([rec.topic("a", tid(1))] * 2), 2, 1),  # does not replay
        (rec.frame_records([rec.fence_broker(1, 1)]), 1, 1),  # a record that does not apply
    ],
    ids=["count", "version", "record", "length", "replay", "skipped"],
)
def test_a_well_checksummed_but_wrong_snapshot_raises_snapshot_error(
    body: bytes, count: int, version: int
) -> None:
    with pytest.raises(SnapshotError):
        decode_snapshot(_container(body, count, version))


def test_the_digest_differs_when_anything_differs_but_not_with_the_offset() -> None:
    base = cluster()
    variants = [
        rec.fence_broker(1, 10),
        rec.broker_registration_change(1, 10, in_controlled_shutdown=True),
        rec.register_broker(1, 13, b"i1" * 8, [("PLAINTEXT", "h1", 9092)], "r1", fenced=False),
        rec.register_broker(4, 13, b"i4" * 8),
        rec.unregister_broker(3, 12),
        rec.partition_change(ORDERS, 0, isr=[1, 2]),
        rec.partition_change(ORDERS, 0, leader=2),
        rec.partition(ORDERS, 0, [1, 2, 3], [1, 2, 3], 1, 0, 1),
        rec.topic("other", tid(2)),
        rec.config(TOPIC, "orders", "a", "1"),
        rec.producer_ids(1, 10, 1),
        rec.feature_level("f", 1),
    ]
    digests = {base.digest()} | {replay(base, v).digest() for v in variants}
    assert len(digests) == 1 + len(variants)
    assert replay(base, rec.no_op()).digest() == base.digest()
    gone = replay(base, rec.register_broker(4, 13, b"i4" * 8), rec.unregister_broker(4, 13))
    assert gone.brokers == base.brokers and gone.digest() != base.digest()  # epoch 13 is taken


def test_the_digest_is_computed_once_per_image_and_not_compared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    image, other = cluster(), cluster()
    calls = []
    frame = rec.frame_records

    def counted(records: list[MetadataRecord]) -> bytes:
        calls.append(len(records))
        return frame(records)

    monkeypatch.setattr(rec, "frame_records", counted)
    assert image.digest() == image.digest() == other.digest()
    assert len(calls) == 2  # once for each image
    assert image == other and image == cluster()  # a cached digest is not part of equality
    idle = replay(image, rec.no_op(), rec.fence_broker(1, 9))  # a no-op and a stale record
    assert idle.digest() == image.digest() and len(calls) == 2  # carried over, not computed
    changed = replay(idle, rec.fence_broker(1, 10))
    assert changed.digest() != image.digest() and len(calls) == 3


# -- the property: replay, snapshot, decode --------------------------------------------------

BROKER_IDS = (1, 2, 3, 4)
TOPIC_NAMES = ("a", "b", "c", "d")


@dataclass
class _Model:
    """Just enough cluster state to write only records a correct controller could write."""

    brokers: dict[int, int] = field(default_factory=dict)  # id: current epoch
    next_epoch: int = 0
    topics: dict[str, bytes] = field(default_factory=dict)
    partitions: dict[tuple[bytes, int], tuple[tuple[int, ...], tuple[int, ...], int]] = field(
        default_factory=dict
    )  # (topic id, partition): (replicas, isr, leader)
    next_topic: int = 1
    next_producer_id: int = 0


_Step = Callable[[st.DrawFn, _Model], list[MetadataRecord]]


def _register(draw: st.DrawFn, m: _Model) -> list[MetadataRecord]:
    broker_id = draw(st.sampled_from(BROKER_IDS))
    m.next_epoch += draw(st.integers(1, 3))
    m.brokers[broker_id] = m.next_epoch
    listeners = draw(st.lists(st.sampled_from([("PLAINTEXT", "h", 1), ("CONTROLLER", "h", 2)])))
    rack = draw(st.sampled_from([None, "r1", "r2"]))
    incarnation = draw(st.binary(min_size=16, max_size=16))
    fenced = draw(st.booleans())
    return [
        rec.register_broker(broker_id, m.next_epoch, incarnation, listeners, rack, fenced=fenced)
    ]


def _guarded(draw: st.DrawFn, m: _Model) -> list[MetadataRecord]:
    """A fence, unfence, change or unregister: sometimes at a stale epoch (then ignored)."""
    if not m.brokers:
        return []
    broker_id = draw(st.sampled_from(sorted(m.brokers)))
    epoch = m.brokers[broker_id] - draw(st.sampled_from([0, 0, 0, 1]))
    kind = draw(st.sampled_from(["fence", "unfence", "change", "unregister"]))
    if kind == "unregister":
        if epoch == m.brokers[broker_id]:
            del m.brokers[broker_id]
        return [rec.unregister_broker(broker_id, epoch)]
    if kind == "change":
        fenced = draw(st.sampled_from([None, True, False]))
        shutdown = draw(st.sampled_from([None, True, True, False]))
        return [
            rec.broker_registration_change(
                broker_id, epoch, fenced=fenced, in_controlled_shutdown=shutdown
            )
        ]
    return [(rec.fence_broker if kind == "fence" else rec.unfence_broker)(broker_id, epoch)]


def _partition_state(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    replicas = tuple(draw(st.permutations(BROKER_IDS))[: draw(st.integers(1, 3))])
    isr = tuple(r for r in replicas if draw(st.booleans()))
    led = bool(isr) and draw(st.booleans())
    return replicas, isr, draw(st.sampled_from(isr)) if led else -1


def _create_topic(draw: st.DrawFn, m: _Model) -> list[MetadataRecord]:
    free = [n for n in TOPIC_NAMES if n not in m.topics]
    if not free:
        return []
    name, topic_id = draw(st.sampled_from(free)), tid(m.next_topic)
    m.topics[name], m.next_topic = topic_id, m.next_topic + 1
    out = [rec.topic(name, topic_id)]
    for p in range(draw(st.integers(0, 3))):
        replicas, isr, leader = m.partitions[(topic_id, p)] = _partition_state(draw)
        epochs = draw(st.integers(0, 5)), draw(st.integers(0, 5))
        out.append(rec.partition(topic_id, p, replicas, isr, leader, *epochs))
    return out


def _change_partition(draw: st.DrawFn, m: _Model) -> list[MetadataRecord]:
    if not m.partitions:
        return []
    key = draw(st.sampled_from(sorted(m.partitions)))
    old, new = m.partitions[key], _partition_state(draw)
    m.partitions[key] = new
    # A field goes in when it changed, and sometimes when it did not (present but equal).
    send = [old[i] != new[i] or draw(st.booleans()) for i in range(3)]
    return [
        rec.partition_change(
            *key,
            replicas=new[0] if send[0] else None,
            isr=new[1] if send[1] else None,
            leader=new[2] if send[2] else None,
        )
    ]


def _put_partition(draw: st.DrawFn, m: _Model) -> list[MetadataRecord]:
    """A PartitionRecord for an existing topic: a new partition, or one replaced verbatim."""
    if not m.topics:
        return []
    topic_id = m.topics[draw(st.sampled_from(sorted(m.topics)))]
    partition = draw(st.integers(0, 3))
    replicas, isr, leader = m.partitions[(topic_id, partition)] = _partition_state(draw)
    return [rec.partition(topic_id, partition, replicas, isr, leader)]


def _remove_topic(draw: st.DrawFn, m: _Model) -> list[MetadataRecord]:
    if not m.topics:
        return []
    topic_id = m.topics.pop(draw(st.sampled_from(sorted(m.topics))))
    m.partitions = {k: v for k, v in m.partitions.items() if k[0] != topic_id}
    return [rec.remove_topic(topic_id)]


def _other(draw: st.DrawFn, m: _Model) -> list[MetadataRecord]:
    kind = draw(st.sampled_from(["config", "producer_ids", "feature", "no_op"]))
    if kind == "config":
        resource = draw(st.sampled_from([(TOPIC, n) for n in TOPIC_NAMES] + [(BROKER, "")]))
        value = draw(st.sampled_from([None, "1", "2"]))
        return [rec.config(*resource, draw(st.sampled_from(["x", "y"])), value)]
    if kind == "producer_ids":
        m.next_producer_id += draw(st.integers(0, 1000))
        return [rec.producer_ids(1, 1, m.next_producer_id)]
    if kind == "feature":
        return [rec.feature_level(draw(st.sampled_from(["f", "g"])), draw(st.integers(0, 3)))]
    return [rec.no_op()]


# Weighted so that most sequences hold registered, fenced and shut-down brokers and topics.
_STEPS: list[_Step] = [
    *[_register] * 2,
    *[_guarded] * 3,
    *[_create_topic] * 2,
    *[_change_partition] * 2,
    _put_partition,
    _remove_topic,
    _other,
]


@st.composite
def record_sequences(draw: st.DrawFn) -> list[MetadataRecord]:
    model = _Model()
    steps = draw(st.lists(st.sampled_from(_STEPS), min_size=8, max_size=60))
    return [record for step in steps for record in step(draw, model)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=record_sequences(), cuts=st.sets(st.integers(0, 80)))
def test_a_snapshot_of_any_replayed_image_decodes_to_an_equal_image(
    records: list[MetadataRecord], cuts: set[int]
) -> None:
    image, delta = EMPTY, MetadataDelta(EMPTY)
    for offset, record in enumerate(records):
        delta.replay(record, offset)
        if offset in cuts:  # publish mid-way: batching must not change the result
            image = delta.apply()
            assert image.broker_load == recount(image)
            delta = MetadataDelta(image)
    image = delta.apply()
    assert image.broker_load == recount(image)
    assert image.partition_count() == sum(len(t.partitions) for t in image.topics.values())
    assert image == replay(EMPTY, *records)
    decoded = decode_snapshot(encode_snapshot(image))
    assert decoded == image and decoded.digest() == image.digest()
    assert image_from_records(image.to_records(), image.offset) == image
    assert decoded.to_records() == image.to_records()
    epochs = [r.register_broker.broker_epoch for r in records if r.HasField("register_broker")]
    assert image.next_broker_epoch == max(epochs, default=-1) + 1


def test_the_image_code_imports_no_io_modules() -> None:
    banned = {"asyncio", "grpc", "time", "random", "os", "socket", "threading", "logging"}
    assert_imports_none_of((f"controller/{m}" for m in ("image.py", "records.py")), banned)
