"""The replica manager over a sequence of metadata images, on real data directories: topics
created, changed, deleted and created again, strays, topic ids, configs and restarts."""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import FakeClock, make_batch

from broker.purgatory import FetchPurgatory
from broker.replica_manager import (
    PARTITION_METADATA_FILE,
    ReplicaManager,
    read_partition_metadata,
    topic_id_text,
)
from controller import records as rec
from controller.image import MetadataDelta, MetadataImage, TopicImage
from controller.records import ConfigResourceType, MetadataRecord
from replication.partition import Partition, Role
from storage.config import LogConfig
from storage.descriptors import DescriptorBudget
from storage.errors import StorageError
from storage.log import Log
from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition

ME = 1
ORDERS = bytes.fromhex("8c1a0b7e5d2f4a6b9c3d1e2f3a4b5c6d")
ORDERS_AGAIN = bytes.fromhex("00112233445566778899aabbccddeeff")
EVENTS = bytes.fromhex("0f0e0d0c0b0a09080706050403020100")
TOPIC = ConfigResourceType.TOPIC
BROKER = ConfigResourceType.BROKER


class Cluster:
    """Builds successive images by replaying records, as a broker's metadata log does."""

    def __init__(self) -> None:
        self.image = MetadataImage.EMPTY

    def replay(self, *records: MetadataRecord) -> MetadataImage:
        delta = MetadataDelta(self.image)
        for offset, record in enumerate(records, start=self.image.offset + 1):
            delta.replay(record, offset)
        self.image = delta.apply()
        return self.image


def orders(topic_id: bytes = ORDERS) -> list[MetadataRecord]:
    """Partition 0 led here (alone in its ISR), 1 followed here (led by 2), 2 not here at all."""
    return [
        rec.topic("orders", topic_id),
        rec.partition(topic_id, 0, [ME, 2], [ME], leader=ME),
        rec.partition(topic_id, 1, [2, ME], [2, ME], leader=2),
        rec.partition(topic_id, 2, [2, 3], [2, 3], leader=2),
    ]


class RecordingPurgatory(FetchPurgatory):
    def __init__(self) -> None:
        super().__init__()
        self.woken: list[tuple[str, int]] = []
        self.notified: list[tuple[tuple[str, int], int]] = []

    def wake(self, key: tuple[str, int]) -> None:
        self.woken.append(key)
        super().wake(key)

    def notify(self, key: tuple[str, int], bytes_appended: int) -> None:
        self.notified.append((key, bytes_appended))
        super().notify(key, bytes_appended)


class Broker:
    """A LogManager started on ``data_dir`` and a replica manager over it."""

    def __init__(self, data_dir: Path, defaults: LogConfig | None = None) -> None:
        self.data_dir = data_dir
        self.logs = LogManager([data_dir], defaults or LogConfig(), clock=FakeClock())
        self.logs.startup()
        self.purgatory = RecordingPurgatory()
        self.replicas = ReplicaManager(ME, self.logs, purgatory=self.purgatory)

    def partition(self, topic: str, index: int) -> Partition:
        found = self.replicas.get(topic, index)
        assert found is not None, f"{topic}-{index} is not served here"
        return found

    def dirs(self) -> set[str]:
        return {p.name for p in self.data_dir.iterdir() if p.is_dir()}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path / "data")
    yield b
    b.logs.shutdown()


def test_a_new_topic_gets_logs_for_the_partitions_assigned_here(broker: Broker) -> None:
    broker.replicas.apply(Cluster().replay(*orders()))
    led, followed = broker.partition("orders", 0), broker.partition("orders", 1)
    assert led.is_leader and led.leader_epoch == 0
    assert followed.role is Role.FOLLOWER and followed.leader_id == 2
    assert broker.replicas.get("orders", 2) is None
    assert broker.replicas.get("nothing", 0) is None
    assert broker.replicas.get_by_id(ORDERS, 1) is followed
    assert sorted(p.key for p in broker.replicas.partitions()) == [("orders", 0), ("orders", 1)]
    assert broker.dirs() == {"orders-0", "orders-1"}
    led.append_as_leader(make_batch([b"a"]), -1)
    assert led.high_watermark == 1


def test_many_new_partitions_are_created_a_bounded_number_per_apply(broker: Broker) -> None:
    broker.replicas.max_new_logs_per_apply = 2
    cluster = Cluster()
    image = cluster.replay(
        rec.topic("wide", EVENTS),
        *(rec.partition(EVENTS, p, [ME], [ME], leader=ME) for p in range(5)),
    )
    done = [broker.replicas.apply(image) for _ in range(3)]
    assert done == [False, False, True]
    assert sorted(p.partition_id for p in broker.replicas.partitions()) == list(range(5))
    assert all(p.is_leader for p in broker.replicas.partitions())
    assert broker.replicas.apply(image)  # nothing left to do


def wide(partitions: int) -> MetadataImage:
    return Cluster().replay(
        rec.topic("wide", EVENTS),
        *(rec.partition(EVENTS, p, [ME], [ME], leader=ME) for p in range(partitions)),
    )


def test_partitions_whose_logs_are_refused_do_not_hold_up_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Out of descriptors, every new log is refused at once (logged once each): an apply of
    many such partitions still finishes instead of spending each call on the same ones."""
    made = Broker(tmp_path / "data")
    try:
        made.logs.descriptors = DescriptorBudget(1, 0)  # nothing fits
        made.replicas.max_new_logs_per_apply = 2
        with caplog.at_level(logging.ERROR, logger="broker.replica_manager"):
            assert made.replicas.apply(wide(5))
        assert made.replicas.partitions() == []
        (summary,) = [r.getMessage() for r in caplog.records]  # one line, not one each
        assert (
            summary.startswith("5 logs of partitions assigned here refused") and "ulimit" in summary
        )
    finally:
        made.logs.shutdown()


def count_creations(made: Broker, monkeypatch: pytest.MonkeyPatch) -> list[TopicPartition]:
    """The logs the replica manager asks its log manager to create, in order."""
    asked: list[TopicPartition] = []
    create = made.logs.get_or_create_log

    def counted(tp: TopicPartition, config: LogConfig | None = None) -> Log:
        asked.append(tp)
        return create(tp, config)

    monkeypatch.setattr(made.logs, "get_or_create_log", counted)
    return asked


def test_refused_partitions_are_served_once_descriptors_are_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only when their topic changes: the broker's periodic retry serves them, a
    bounded number of new logs per call, and a pass stops at the first refusal."""
    made = Broker(tmp_path / "data")
    try:
        made.logs.descriptors = DescriptorBudget(1, 0)  # nothing fits
        assert made.replicas.apply(wide(5))
        assert made.replicas.unserved == {TopicPartition("wide", p) for p in range(5)}
        asked = count_creations(made, monkeypatch)
        assert made.replicas.retry_unserved()
        assert asked == [TopicPartition("wide", 0)]  # the rest would be refused too
        assert made.replicas.partitions() == []

        made.logs.descriptors = DescriptorBudget(10_000, 0, count=lambda: 10)  # room again
        made.replicas.max_new_logs_per_apply = 2
        assert [made.replicas.retry_unserved() for _ in range(3)] == [False, False, True]
        assert sorted(p.partition_id for p in made.replicas.partitions()) == list(range(5))
        assert all(p.is_leader and p.leader_epoch == 0 for p in made.replicas.partitions())
        assert made.replicas.unserved == frozenset()
        assert made.dirs() == {f"wide-{p}" for p in range(5)}
    finally:
        made.logs.shutdown()


def test_unserved_partitions_deleted_or_moved_meanwhile_are_forgotten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = Broker(tmp_path / "data")
    try:
        made.logs.descriptors = DescriptorBudget(1, 0)
        cluster = Cluster()
        made.replicas.apply(
            cluster.replay(
                *orders(),
                rec.topic("wide", EVENTS),
                rec.partition(EVENTS, 0, [ME], [ME], leader=ME),
            )
        )
        assert made.replicas.unserved == {
            TopicPartition("orders", 0),
            TopicPartition("orders", 1),
            TopicPartition("wide", 0),
        }
        made.replicas.apply(
            cluster.replay(
                rec.remove_topic(EVENTS),
                rec.partition_change(ORDERS, 1, replicas=[2, 3], isr=[2, 3], leader=2),
            )
        )
        made.logs.descriptors = DescriptorBudget(10_000, 0, count=lambda: 10)
        asked = count_creations(made, monkeypatch)
        assert made.replicas.retry_unserved()
        assert asked == [TopicPartition("orders", 0)]
        assert made.replicas.unserved == frozenset()
        assert [p.key for p in made.replicas.partitions()] == [("orders", 0)]
    finally:
        made.logs.shutdown()


def test_no_retry_while_an_apply_is_unfinished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An apply stopped on its budget is the newer state: retrying meanwhile would serve
    partitions with the older image's state."""
    made = Broker(tmp_path / "data")
    try:
        made.logs.descriptors = DescriptorBudget(1, 0)
        cluster = Cluster()
        assert made.replicas.apply(cluster.replay(*orders()))
        made.logs.descriptors = DescriptorBudget(10_000, 0, count=lambda: 10)
        made.replicas.max_new_logs_per_apply = 1
        wider = cluster.replay(
            rec.topic("wide", EVENTS),
            *(rec.partition(EVENTS, p, [ME], [ME], leader=ME) for p in range(3)),
        )
        assert not made.replicas.apply(wider)
        asked = count_creations(made, monkeypatch)
        assert made.replicas.retry_unserved()
        assert asked == []
        assert [made.replicas.apply(wider) for _ in range(2)] == [False, True]
        assert [made.replicas.retry_unserved() for _ in range(2)] == [False, True]
        assert made.replicas.unserved == frozenset()
        assert len(made.replicas.partitions()) == 5
    finally:
        made.logs.shutdown()


def test_a_partition_whose_directory_fails_is_said_once_and_served_later(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    create = broker.logs.get_or_create_log
    failing = [True]

    def flaky(tp: TopicPartition, config: LogConfig | None = None) -> Log:
        if failing[0]:
            raise StorageError(f"{tp}: data directory offline")
        return create(tp, config)

    monkeypatch.setattr(broker.logs, "get_or_create_log", flaky)
    with caplog.at_level(logging.ERROR, logger="broker.replica_manager"):
        broker.replicas.apply(Cluster().replay(*orders()))
        broker.replicas.retry_unserved()
        broker.replicas.retry_unserved()
    said = sorted(r.getMessage().split(":")[0] for r in caplog.records)
    assert said == ["cannot serve orders-0", "cannot serve orders-1"]  # once each
    assert broker.replicas.partitions() == []
    failing[0] = False
    assert broker.replicas.retry_unserved()
    assert sorted(p.key for p in broker.replicas.partitions()) == [("orders", 0), ("orders", 1)]
    assert broker.partition("orders", 1).role is Role.FOLLOWER


def test_partition_metadata_is_kafka_s_file(broker: Broker) -> None:
    broker.replicas.apply(Cluster().replay(*orders()))
    text = (broker.data_dir / "orders-0" / PARTITION_METADATA_FILE).read_text()
    encoded = base64.urlsafe_b64encode(ORDERS).decode().rstrip("=")
    assert text == f"version: 0\ntopic_id: {encoded}\n"
    assert len(encoded) == 22 and topic_id_text(ORDERS) == encoded
    assert read_partition_metadata(broker.data_dir / "orders-0") == ORDERS


def test_leadership_changes_become_leader_and_follower_and_wake_fetches(broker: Broker) -> None:
    cluster = Cluster()
    broker.replicas.apply(cluster.replay(*orders()))
    led = broker.partition("orders", 0)
    broker.purgatory.woken.clear()
    broker.replicas.apply(cluster.replay(rec.partition_change(ORDERS, 0, leader=2, isr=[ME, 2])))
    assert broker.partition("orders", 0) is led  # the same replica, now following
    assert led.role is Role.FOLLOWER and (led.leader_id, led.leader_epoch) == (2, 1)
    assert broker.purgatory.woken == [("orders", 0)]
    broker.replicas.apply(cluster.replay(rec.partition_change(ORDERS, 1, leader=ME)))
    assert broker.partition("orders", 1).is_leader
    assert broker.purgatory.woken == [("orders", 0), ("orders", 1)]


def test_an_isr_change_updates_the_state_without_waking_fetches(broker: Broker) -> None:
    cluster = Cluster()
    broker.replicas.apply(cluster.replay(*orders()))
    broker.purgatory.woken.clear()
    broker.replicas.apply(cluster.replay(rec.partition_change(ORDERS, 0, isr=[ME, 2])))
    led = broker.partition("orders", 0)
    assert led.isr == (ME, 2) and led.partition_epoch == 1 and led.is_leader
    assert broker.purgatory.woken == []


def test_appends_reach_the_purgatory(broker: Broker) -> None:
    broker.replicas.apply(Cluster().replay(*orders()))
    batch = make_batch([b"a"])
    broker.partition("orders", 0).append_as_leader(batch, 1)
    assert broker.purgatory.notified == [(("orders", 0), len(batch))]


def test_a_deleted_topic_stops_serving_and_loses_its_logs(broker: Broker) -> None:
    cluster = Cluster()
    broker.replicas.apply(cluster.replay(*orders()))
    led = broker.partition("orders", 0)
    broker.replicas.apply(cluster.replay(rec.remove_topic(ORDERS)))
    assert broker.replicas.get("orders", 0) is None and broker.replicas.partitions() == []
    assert led.role is Role.STOPPED
    assert broker.dirs() == set()
    assert broker.logs.logs() == {}
    assert set(broker.purgatory.woken) >= {("orders", 0), ("orders", 1)}


def test_a_topic_created_again_under_its_name_starts_empty(broker: Broker) -> None:
    cluster = Cluster()
    broker.replicas.apply(cluster.replay(*orders()))
    broker.partition("orders", 0).append_as_leader(make_batch([b"old"]), 1)
    # Deleted and created again within one image, then again across two.
    broker.replicas.apply(cluster.replay(rec.remove_topic(ORDERS), *orders(ORDERS_AGAIN)))
    again = broker.partition("orders", 0)
    assert again.topic_id == ORDERS_AGAIN and again.log_end_offset == 0
    assert read_partition_metadata(again.log.dir) == ORDERS_AGAIN
    assert broker.replicas.get_by_id(ORDERS, 0) is None
    broker.replicas.apply(cluster.replay(rec.remove_topic(ORDERS_AGAIN)))
    broker.replicas.apply(cluster.replay(*orders(ORDERS)))
    assert broker.partition("orders", 0).topic_id == ORDERS


def test_a_partition_moved_away_is_deleted_here(broker: Broker) -> None:
    cluster = Cluster()
    broker.replicas.apply(cluster.replay(*orders()))
    broker.replicas.apply(cluster.replay(rec.partition_change(ORDERS, 1, replicas=[2, 3], isr=[2])))
    assert broker.replicas.get("orders", 1) is None
    assert broker.dirs() == {"orders-0"}
    broker.replicas.apply(
        cluster.replay(rec.partition_change(ORDERS, 2, replicas=[2, ME], isr=[2]))
    )
    assert broker.partition("orders", 2).role is Role.FOLLOWER
    assert broker.dirs() == {"orders-0", "orders-2"}


def test_only_changed_topics_are_walked(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster()
    broker.replicas.apply(
        cluster.replay(
            *orders(), rec.topic("events", EVENTS), rec.partition(EVENTS, 0, [ME], [ME], ME)
        )
    )
    walked: list[str] = []
    original = ReplicaManager._apply_topic

    def spy(self: ReplicaManager, topic: TopicImage, old: TopicImage | None) -> None:
        walked.append(topic.name)
        original(self, topic, old)

    monkeypatch.setattr(ReplicaManager, "_apply_topic", spy)
    broker.replicas.apply(cluster.replay(rec.partition_change(EVENTS, 0, isr=[ME])))
    broker.replicas.apply(cluster.replay(rec.no_op()))
    assert walked == ["events"]


# -- restarts and strays -----------------------------------------------------------------------


def test_a_restart_keeps_the_data(tmp_path: Path) -> None:
    cluster = Cluster()
    image = cluster.replay(*orders())
    first = Broker(tmp_path)
    first.replicas.apply(image)
    first.partition("orders", 0).append_as_leader(make_batch([b"a", b"b"]), -1)
    first.logs.shutdown()

    second = Broker(tmp_path)
    second.replicas.apply(image)
    led = second.partition("orders", 0)
    assert (led.log_end_offset, led.high_watermark) == (2, 2)
    data = led.read(0, 1_000_000).slice
    assert data is not None and data.read().count(b"a") >= 1
    assert second.replicas.strays_deleted == 0
    second.logs.shutdown()


def test_a_log_of_a_deleted_topic_s_namesake_is_replaced_at_start(tmp_path: Path) -> None:
    first = Broker(tmp_path)
    first.replicas.apply(Cluster().replay(*orders(ORDERS)))
    first.partition("orders", 0).append_as_leader(make_batch([b"old"]), 1)
    first.logs.shutdown()
    # While this broker was away "orders" was deleted and created again.
    second = Broker(tmp_path)
    second.replicas.apply(Cluster().replay(*orders(ORDERS_AGAIN)))
    fresh = second.partition("orders", 0)
    assert fresh.log_end_offset == 0 and fresh.topic_id == ORDERS_AGAIN
    assert read_partition_metadata(fresh.log.dir) == ORDERS_AGAIN
    second.logs.shutdown()


def test_strays_are_deleted_on_the_first_apply_only(tmp_path: Path) -> None:
    first = Broker(tmp_path)
    cluster = Cluster()
    first.replicas.apply(cluster.replay(*orders()))
    for tp in (TopicPartition("ghost", 0), TopicPartition("orders", 2)):
        first.logs.get_or_create_log(tp).append_as_leader(make_batch([b"x"]), 0)
    first.replicas.apply(cluster.replay(rec.partition_change(ORDERS, 0, isr=[ME])))
    assert first.dirs() == {"orders-0", "orders-1", "orders-2", "ghost-0"}  # not a first apply
    assert first.replicas.strays_deleted == 0
    first.logs.shutdown()

    second = Broker(tmp_path)
    second.replicas.apply(cluster.image)
    assert second.dirs() == {"orders-0", "orders-1"}
    assert second.replicas.strays_deleted == 2
    second.logs.shutdown()


def test_a_log_without_partition_metadata_is_adopted(tmp_path: Path) -> None:
    first = Broker(tmp_path)
    first.logs.get_or_create_log(TopicPartition("orders", 0)).append_as_leader(
        make_batch([b"kept"]), 0
    )
    first.replicas.apply(Cluster().replay(*orders()))
    led = first.partition("orders", 0)
    assert led.log_end_offset == 1
    assert read_partition_metadata(led.log.dir) == ORDERS
    first.logs.shutdown()


# -- configs -----------------------------------------------------------------------------------


def test_topic_configs_shape_the_logs_and_min_isr(broker: Broker) -> None:
    cluster = Cluster()
    broker.replicas.apply(
        cluster.replay(
            *orders(),
            rec.config(TOPIC, "orders", "segment.bytes", "4096"),
            rec.config(TOPIC, "orders", "min.insync.replicas", "2"),
            rec.config(TOPIC, "orders", "compression.type", "lz4"),  # no storage setting
            rec.config(TOPIC, "orders", "some.future.setting", "x"),  # unknown: ignored
        )
    )
    led = broker.partition("orders", 0)
    assert led.log.config.segment_bytes == 4096 and led.min_insync_replicas == 2
    broker.replicas.apply(cluster.replay(rec.config(TOPIC, "orders", "retention.ms", "1000")))
    assert led.log.config.retention_ms == 1000 and led.log.config.segment_bytes == 4096
    broker.replicas.apply(cluster.replay(rec.config(TOPIC, "orders", "min.insync.replicas", None)))
    assert led.min_insync_replicas == 1


def test_dynamic_broker_defaults_apply_below_topic_configs(broker: Broker) -> None:
    cluster = Cluster()
    broker.replicas.apply(
        cluster.replay(*orders(), rec.config(TOPIC, "orders", "retention.ms", "5000"))
    )
    led = broker.partition("orders", 0)
    broker.replicas.apply(
        cluster.replay(
            rec.config(BROKER, "", "log.retention.bytes", "123456"),
            rec.config(BROKER, str(ME), "log.segment.bytes", "8192"),
            rec.config(BROKER, "", "log.retention.ms", "1"),  # the topic's own value wins
            rec.config(BROKER, "2", "log.segment.bytes", "999999"),  # another broker's
        )
    )
    config = led.log.config
    assert (config.retention_bytes, config.segment_bytes, config.retention_ms) == (
        123456,
        8192,
        5000,
    )


def test_configs_that_do_not_apply_fall_back_to_the_defaults(tmp_path: Path) -> None:
    broker = Broker(tmp_path, LogConfig(segment_ms=1000))
    # Valid where the controller checked it, not over this broker's segment.ms.
    image = Cluster().replay(*orders(), rec.config(TOPIC, "orders", "segment.jitter.ms", "5000"))
    broker.replicas.apply(image)
    assert broker.partition("orders", 0).log.config == LogConfig(segment_ms=1000)
    broker.logs.shutdown()


def test_an_image_of_nothing_deletes_no_strays(tmp_path: Path) -> None:
    broker = Broker(tmp_path)
    broker.logs.get_or_create_log(TopicPartition("ghost", 0))
    broker.replicas.apply(MetadataImage.EMPTY)  # replayed nothing: proves nothing
    assert broker.dirs() == {"ghost-0"}
    broker.replicas.apply(Cluster().replay(*orders()))
    assert broker.dirs() == {"orders-0", "orders-1"}
    assert broker.replicas.strays_deleted == 1
    broker.logs.shutdown()
