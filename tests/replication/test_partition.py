"""The partition replica on a real log: roles, epoch fencing, acks, the high watermark, reads,
offsets by timestamp, and how storage errors reach clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import FakeClock, make_batch

from controller.image import PartitionState
from replication import errors
from replication.errors import from_storage_error
from replication.partition import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    OffsetAndTimestamp,
    Partition,
    Role,
    end_offset_with_pending_epoch,
)
from storage import errors as storage_errors
from storage.config import LogConfig
from storage.loader import load_log
from storage.log import Log
from storage.records import RecordInput, build_batch, iter_decoded

ME = 1
TS = 1_700_000_000_000
TOPIC_ID = bytes(range(16))

MakePartition = Callable[..., Partition]


def state(
    leader: int = ME,
    leader_epoch: int = 5,
    partition_epoch: int = 7,
    replicas: tuple[int, ...] = (ME, 2, 3),
    isr: tuple[int, ...] = (ME,),  # the leader alone: its appends commit at once
) -> PartitionState:
    return PartitionState(TOPIC_ID, 0, replicas, isr, leader, leader_epoch, partition_epoch)


@pytest.fixture
def make_partition(tmp_path: Path) -> Iterator[MakePartition]:
    logs: list[Log] = []

    def make(config: LogConfig | None = None, *, min_isr: int = 1, lead: bool = True) -> Partition:
        log = load_log(tmp_path / "orders-0", config or LogConfig(), clock=FakeClock())
        logs.append(log)
        partition = Partition(
            "orders", TOPIC_ID, 0, log, local_broker_id=ME, min_insync_replicas=min_isr
        )
        if lead:
            partition.make_leader(state(), now_ms=0)
        return partition

    yield make
    for log in logs:
        log.abandon()


def values(data: bytes) -> list[bytes | None]:
    return [r.value for batch in iter_decoded(data) for r in batch.records]


# -- roles -------------------------------------------------------------------------------------


def test_a_new_replica_serves_nothing(make_partition: MakePartition) -> None:
    p = make_partition(lead=False)
    assert p.role is Role.NEW and not p.is_leader and p.leader_epoch == -1
    with pytest.raises(errors.NotLeaderOrFollower):
        p.append_as_leader(make_batch([b"a"]), 1)
    with pytest.raises(errors.NotLeaderOrFollower):
        p.read(0, 1000)


def test_make_leader_takes_the_state_of_the_image(make_partition: MakePartition) -> None:
    p = make_partition()
    assert p.is_leader and p.role is Role.LEADER
    assert (p.leader_id, p.leader_epoch, p.partition_epoch) == (ME, 5, 7)
    assert (p.replicas, p.isr) == ((ME, 2, 3), (ME,))


def test_make_follower_stops_leader_requests(make_partition: MakePartition) -> None:
    p = make_partition()
    assert p.make_follower(state(leader=2, leader_epoch=6, partition_epoch=8))
    assert not p.is_leader and p.leader_id == 2 and p.leader_epoch == 6
    with pytest.raises(errors.NotLeaderOrFollower, match="leader 2, epoch 6"):
        p.append_as_leader(make_batch([b"a"]), 1)
    with pytest.raises(errors.NotLeaderOrFollower):
        p.read(0, 1000)
    with pytest.raises(errors.NotLeaderOrFollower):
        p.offsets_for_timestamp(LATEST_TIMESTAMP)
    assert p.make_leader(state(leader_epoch=7, partition_epoch=9), now_ms=0)
    assert p.is_leader and p.leader_epoch == 7


def test_a_state_with_an_older_partition_epoch_is_ignored(make_partition: MakePartition) -> None:
    p = make_partition()
    assert not p.make_follower(state(leader=2, leader_epoch=9, partition_epoch=6))
    assert p.is_leader and (p.leader_epoch, p.partition_epoch) == (5, 7)
    assert p.make_leader(state(partition_epoch=7, isr=(ME, 2)), now_ms=0)  # the same epoch applies
    assert p.isr == (ME, 2)


def test_a_stopped_replica_serves_nothing_and_cannot_restart(
    make_partition: MakePartition,
) -> None:
    p = make_partition()
    p.stop()
    assert p.role is Role.STOPPED
    with pytest.raises(errors.NotLeaderOrFollower):
        p.append_as_leader(make_batch([b"a"]), 1)
    with pytest.raises(storage_errors.InvariantViolation, match="illegal transition"):
        p.make_leader(state(partition_epoch=99), now_ms=0)


def test_make_leader_for_another_broker_is_a_bug(make_partition: MakePartition) -> None:
    p = make_partition(lead=False)
    with pytest.raises(storage_errors.InvariantViolation):
        p.make_leader(state(leader=2), now_ms=0)
    with pytest.raises(storage_errors.InvariantViolation):
        p.make_follower(state(leader=ME))


# -- leader epochs -----------------------------------------------------------------------------


def test_check_leader_epoch_fences_old_and_refuses_early_epochs(
    make_partition: MakePartition,
) -> None:
    p = make_partition()
    p.check_leader_epoch(-1)
    p.check_leader_epoch(5)
    with pytest.raises(errors.FencedLeaderEpoch) as fenced:
        p.check_leader_epoch(4)
    with pytest.raises(errors.UnknownLeaderEpoch) as unknown:
        p.check_leader_epoch(6)
    assert (fenced.value.code, unknown.value.code) == (74, 75)
    assert fenced.value.retriable and unknown.value.retriable


def test_reads_check_the_epoch_before_leadership(make_partition: MakePartition) -> None:
    p = make_partition()
    p.append_as_leader(make_batch([b"a"]), 1)
    with pytest.raises(errors.FencedLeaderEpoch):
        p.read(0, 1000, current_leader_epoch=4)
    with pytest.raises(errors.UnknownLeaderEpoch):
        p.offsets_for_timestamp(LATEST_TIMESTAMP, current_leader_epoch=6)
    p.make_follower(state(leader=2, leader_epoch=6, partition_epoch=8))
    with pytest.raises(errors.FencedLeaderEpoch):  # not NOT_LEADER: the epoch says more
        p.read(0, 1000, current_leader_epoch=5)


def test_appends_are_stamped_with_the_leader_epoch(make_partition: MakePartition) -> None:
    p = make_partition()
    p.append_as_leader(make_batch([b"a"]), 1)
    assert p.log.epoch_cache.latest_epoch == 5
    data = p.read(0, 1000).slice
    assert data is not None
    assert next(iter_decoded(data.read())).header.partition_leader_epoch == 5


def test_a_new_leader_epoch_is_written_on_the_first_append_only(
    make_partition: MakePartition,
) -> None:
    p = make_partition()
    p.append_as_leader(make_batch([b"a", b"b", b"c"]), 1)
    cache_file = p.log.epoch_cache.path
    before = cache_file.read_text()
    p.make_leader(state(leader_epoch=8, partition_epoch=9), now_ms=0)
    assert cache_file.read_text() == before == "0\n1\n5 0\n"
    assert p.leader_epoch_start_offset == 3
    # As if the cache held (8, 3), as Kafka's does from makeLeader on:
    assert p.end_offset_for_epoch(5) == (5, 3)
    assert p.end_offset_for_epoch(8) == (8, 3)
    assert p.end_offset_for_epoch(7) == (5, 3)
    assert p.end_offset_for_epoch(9) == (-1, -1)
    p.append_as_leader(make_batch([b"d"]), 1)
    assert cache_file.read_text() == "0\n2\n5 0\n8 3\n"
    assert p.end_offset_for_epoch(5) == (5, 3)
    assert p.end_offset_for_epoch(8) == (8, 4)


@pytest.mark.parametrize(
    ("requested", "latest", "pending", "expected"),
    [
        (3, 3, None, (3, 10)),  # no pending epoch: the cache's answer
        (-1, 3, (5, 10), (-1, -1)),
        (6, 3, (5, 10), (-1, -1)),
        (5, 3, (5, 10), (5, 12)),  # the leader's epoch ends at the log end
        (4, 3, (5, 10), (3, 10)),  # between the cache's latest and ours
        (3, 3, (5, 10), (3, 10)),
        (1, 3, (5, 10), (3, 10)),  # below the latest cached: the cache knows
        (2, None, (5, 10), (2, 10)),  # empty cache: ends where ours starts
    ],
)
def test_end_offset_with_a_pending_epoch(
    requested: int, latest: int | None, pending: tuple[int, int] | None, expected: tuple[int, int]
) -> None:
    from_cache = (3, 10)
    assert end_offset_with_pending_epoch(requested, from_cache, latest, pending, 12) == expected


# -- appends -----------------------------------------------------------------------------------


def test_append_moves_the_high_watermark_to_the_log_end_and_tells_listeners(
    make_partition: MakePartition,
) -> None:
    p = make_partition()
    heard: list[tuple[tuple[str, int], int]] = []
    p.on_append.append(lambda key, size: heard.append((key, size)))
    batch = make_batch([b"a", b"b"])
    info = p.append_as_leader(batch, -1)
    assert (info.first_offset, info.last_offset) == (0, 1)
    assert p.log_end_offset == p.high_watermark == p.last_stable_offset == 2
    assert p.log_start_offset == 0
    assert heard == [(("orders", 0), len(batch))]


def test_invalid_acks_are_refused_before_anything_else(make_partition: MakePartition) -> None:
    p = make_partition(lead=False)  # not even the leader: acks are checked first
    with pytest.raises(errors.InvalidRequiredAcks) as refused:
        p.append_as_leader(make_batch([b"a"]), 2)
    assert refused.value.code == 21
    assert p.log_end_offset == 0


def test_acks_zero_and_one_append(make_partition: MakePartition) -> None:
    p = make_partition()
    p.append_as_leader(make_batch([b"a"]), 0)
    p.append_as_leader(make_batch([b"b"]), 1)
    assert p.high_watermark == 2


def test_acks_all_needs_min_insync_replicas_in_the_isr(make_partition: MakePartition) -> None:
    p = make_partition(min_isr=2)
    p.make_leader(state(partition_epoch=8, isr=(ME,)), now_ms=0)
    with pytest.raises(errors.NotEnoughReplicas) as refused:
        p.append_as_leader(make_batch([b"a"]), -1)
    assert refused.value.code == 19 and refused.value.retriable
    assert p.log_end_offset == 0
    p.append_as_leader(make_batch([b"a"]), 1)  # acks=1 does not care
    p.make_leader(state(partition_epoch=9, isr=(ME, 3)), now_ms=0)
    p.append_as_leader(make_batch([b"b"]), -1)
    assert p.high_watermark == 1  # until follower 3 has it
    p.read_for_follower(3, 2, 1000, last_fetched_epoch=5, current_leader_epoch=5, now_ms=1)
    assert p.high_watermark == 2


def test_a_corrupt_batch_is_corrupt_message_and_appends_nothing(
    make_partition: MakePartition,
) -> None:
    p = make_partition()
    p.append_as_leader(make_batch([b"ok"]), 1)
    heard: list[int] = []
    p.on_append.append(lambda _key, size: heard.append(size))
    bad = bytearray(make_batch([b"hello", b"world"]))
    bad[-3] ^= 0xFF  # a record byte: covered by the CRC
    with pytest.raises(errors.CorruptMessage) as refused:
        p.append_as_leader(bad, 1)
    assert refused.value.code == 2
    assert isinstance(refused.value.__cause__, storage_errors.CorruptRecordError)
    assert (p.log_end_offset, p.high_watermark, heard) == (1, 1, [])


def test_a_batch_over_max_message_bytes_is_message_too_large(
    make_partition: MakePartition,
) -> None:
    p = make_partition(LogConfig(max_message_bytes=200))
    with pytest.raises(errors.MessageTooLarge) as refused:
        p.append_as_leader(make_batch([b"x" * 300]), 1)
    assert refused.value.code == 10
    assert p.log_end_offset == 0


def test_a_request_over_a_segment_is_record_list_too_large(make_partition: MakePartition) -> None:
    p = make_partition(LogConfig(segment_bytes=1024))
    request = make_batch([b"x" * 600]) + make_batch([b"y" * 600])
    with pytest.raises(errors.RecordListTooLarge) as refused:
        p.append_as_leader(request, 1)
    assert refused.value.code == 18
    assert p.log_end_offset == 0


def test_rule_breaking_batches_are_invalid_record(make_partition: MakePartition) -> None:
    p = make_partition()
    idempotent = make_batch([b"a"], producer_id=7, producer_epoch=0, base_sequence=0)
    with pytest.raises(errors.InvalidRecord) as refused:
        p.append_as_leader(idempotent + idempotent, 1)
    assert refused.value.code == 87 and refused.value.legacy_code == 2


def test_idempotent_producer_errors_keep_their_codes(make_partition: MakePartition) -> None:
    p = make_partition()
    p.append_as_leader(make_batch([b"a"], producer_id=7, producer_epoch=1, base_sequence=0), 1)
    with pytest.raises(errors.OutOfOrderSequenceNumber):
        p.append_as_leader(make_batch([b"b"], producer_id=7, producer_epoch=1, base_sequence=5), 1)
    with pytest.raises(errors.InvalidProducerEpoch):
        p.append_as_leader(make_batch([b"b"], producer_id=7, producer_epoch=0, base_sequence=1), 1)
    heard: list[int] = []
    p.on_append.append(lambda _key, size: heard.append(size))
    retry = p.append_as_leader(
        make_batch([b"a"], producer_id=7, producer_epoch=1, base_sequence=0), 1
    )
    assert retry.duplicate and retry.first_offset == 0
    assert heard == []  # nothing new became readable


def test_an_offline_log_is_kafka_storage_error(make_partition: MakePartition) -> None:
    p = make_partition()
    p.log.abandon()
    with pytest.raises(errors.KafkaStorageError) as refused:
        p.append_as_leader(make_batch([b"a"]), 1)
    assert refused.value.code == 56 and refused.value.retriable


# -- reads -------------------------------------------------------------------------------------


def test_reads_return_the_exact_bytes_appended(make_partition: MakePartition) -> None:
    p = make_partition()
    first = make_batch([b"a", b"b"], partition_leader_epoch=5)
    second = make_batch([b"c"], base_offset=2, partition_leader_epoch=5)
    p.append_as_leader(first, 1)
    p.append_as_leader(second, 1)
    data = p.read(0, 1_000_000)
    assert data.slice is not None
    # Base offset and epoch are the log's, and here the batches were built with them.
    assert data.slice.read() == first + second
    assert (data.high_watermark, data.log_end_offset, data.log_start_offset) == (3, 3, 0)
    later = p.read(2, 1_000_000).slice
    assert later is not None and later.read() == second


def test_a_read_returns_one_whole_batch_past_max_bytes(make_partition: MakePartition) -> None:
    p = make_partition()
    batch = make_batch([b"v" * 500], partition_leader_epoch=5)
    p.append_as_leader(batch, 1)
    whole = p.read(0, 10).slice
    assert whole is not None and whole.read() == batch
    partial = p.read(0, 10, min_one_batch=False).slice  # cut at max_bytes, as Kafka does
    assert partial is not None and partial.length == 10


def test_consumers_read_to_the_high_watermark_replicas_to_the_log_end(
    make_partition: MakePartition,
) -> None:
    p = make_partition()
    for v in (b"a", b"b", b"c"):
        p.append_as_leader(make_batch([v]), 1)
    p.log.update_high_watermark(1)  # as replication will: followers behind
    consumer = p.read(0, 1_000_000).slice
    assert consumer is not None and values(consumer.read()) == [b"a"]
    committed = p.read(0, 1_000_000, isolation="high_watermark").slice
    assert committed is not None and values(committed.read()) == [b"a"]
    assert p.read(2, 1000).slice is None  # above the HW, within the log: nothing yet
    follower = p.read_for_follower(
        2, 0, 1_000_000, last_fetched_epoch=-1, current_leader_epoch=-1, now_ms=0
    ).data
    for replica in (follower, p.read(0, 10**6, isolation="log_end")):
        assert replica is not None and replica.slice is not None
        assert values(replica.slice.read()) == [b"a", b"b", b"c"]


def test_a_read_outside_the_log_is_offset_out_of_range(make_partition: MakePartition) -> None:
    p = make_partition()
    p.append_as_leader(make_batch([b"a"]), 1)
    with pytest.raises(errors.OffsetOutOfRange) as refused:
        p.read(5, 1000)
    assert refused.value.code == 1


# -- offsets by timestamp ----------------------------------------------------------------------


def _timestamped(p: Partition) -> None:
    """Offsets 0-2 at TS+0, +10, +20; 3-5 at TS+30, +50 (the max), +40."""
    p.append_as_leader(make_batch([b"a", b"b", b"c"], timestamp_ms=TS), 1)  # deltas 0, 1, 2
    p.log.update_high_watermark(p.log_end_offset)
    records = [RecordInput(None, b"x", TS + ms) for ms in (30, 50, 40)]
    p.append_as_leader(build_batch(records), 1)


def test_earliest_and_latest(make_partition: MakePartition) -> None:
    p = make_partition()
    p.append_as_leader(make_batch([b"a", b"b"]), 1)
    assert p.offsets_for_timestamp(EARLIEST_TIMESTAMP) == OffsetAndTimestamp(0, -1, 5)
    assert p.offsets_for_timestamp(LATEST_TIMESTAMP) == (2, -1, 5)
    p.log.update_high_watermark(1)
    assert p.offsets_for_timestamp(LATEST_TIMESTAMP) == (1, -1, 5)
    assert p.offsets_for_timestamp(LATEST_TIMESTAMP, isolation="log_end") == (2, -1, 5)


def test_a_timestamp_finds_the_first_record_at_or_after_it(make_partition: MakePartition) -> None:
    p = make_partition()
    _timestamped(p)
    assert p.offsets_for_timestamp(0) == (0, TS, 5)
    assert p.offsets_for_timestamp(TS + 1) == (1, TS + 1, 5)  # inside the first batch
    assert p.offsets_for_timestamp(TS + 3) == (3, TS + 30, 5)
    assert p.offsets_for_timestamp(TS + 45) == (4, TS + 50, 5)
    assert p.offsets_for_timestamp(TS + 51) is None


def test_max_timestamp_finds_the_record_carrying_it(make_partition: MakePartition) -> None:
    p = make_partition()
    assert p.offsets_for_timestamp(MAX_TIMESTAMP) is None  # an empty log
    _timestamped(p)
    assert p.offsets_for_timestamp(MAX_TIMESTAMP) == (4, TS + 50, 5)


def test_lookups_above_the_high_watermark_find_nothing(make_partition: MakePartition) -> None:
    p = make_partition()
    _timestamped(p)
    p.log.update_high_watermark(3)
    assert p.offsets_for_timestamp(TS + 45) is None
    assert p.offsets_for_timestamp(MAX_TIMESTAMP) is None
    assert p.offsets_for_timestamp(TS + 45, isolation="log_end") == (4, TS + 50, 5)


def _over_three_epochs(p: Partition) -> None:
    """Offsets 0-1 at epoch 5 (TS, TS+1), 2-3 at epoch 6 (TS+10, TS+60: the max), 4 at
    epoch 8 (TS+20); then this replica leads at epoch 9, with nothing written in it."""
    p.append_as_leader(make_batch([b"a", b"b"], timestamp_ms=TS), 1)
    p.make_leader(state(leader_epoch=6, partition_epoch=8), now_ms=0)
    records = [RecordInput(None, b"x", TS + ms) for ms in (10, 60)]
    p.append_as_leader(build_batch(records), 1)
    p.make_leader(state(leader_epoch=8, partition_epoch=9), now_ms=0)
    p.append_as_leader(make_batch([b"e"], timestamp_ms=TS + 20), 1)
    p.make_leader(state(leader_epoch=9, partition_epoch=10), now_ms=0)
    assert [(e.epoch, e.start_offset) for e in p.log.epoch_cache.entries()] == [
        (5, 0),
        (6, 2),
        (8, 4),
    ]


def test_a_found_offset_carries_its_batch_epoch(make_partition: MakePartition) -> None:
    """Kafka's FileRecords.searchForTimestamp and KIP-734's lookup answer the found record's
    batch epoch, not the current leader epoch (9 here)."""
    p = make_partition()
    _over_three_epochs(p)
    assert p.offsets_for_timestamp(TS + 1) == (1, TS + 1, 5)
    assert p.offsets_for_timestamp(TS + 5) == (2, TS + 10, 6)
    assert p.offsets_for_timestamp(TS + 15) == (3, TS + 60, 6)
    assert p.offsets_for_timestamp(MAX_TIMESTAMP) == (3, TS + 60, 6)


def test_earliest_carries_the_log_start_epoch_and_latest_the_current_one(
    make_partition: MakePartition,
) -> None:
    """UnifiedLog.fetchOffsetByTimestamp answers earliest with the first cached epoch (the
    cache is cut to the log start as it moves); Partition.fetchOffsetForTimestamp answers
    latest with its leader epoch, even before anything is written in it."""
    p = make_partition()
    _over_three_epochs(p)
    assert p.offsets_for_timestamp(EARLIEST_TIMESTAMP) == (0, -1, 5)
    assert p.offsets_for_timestamp(LATEST_TIMESTAMP) == (5, -1, 9)
    p.log.maybe_increment_log_start_offset(3)  # inside epoch 6's range
    assert p.offsets_for_timestamp(EARLIEST_TIMESTAMP) == (3, -1, 6)


def test_offsets_written_without_an_epoch_carry_none(make_partition: MakePartition) -> None:
    """A batch without a partition leader epoch (-1) answers -1 when found, and earliest has
    no epoch while the first cached one starts above the log start (Kafka checks that)."""
    p = make_partition(lead=False)
    p.make_follower(state(leader=2, leader_epoch=6, partition_epoch=8))
    p.append_as_follower(make_batch([b"a"], timestamp_ms=TS), 0, 0)
    epoch_6 = make_batch([b"b"], timestamp_ms=TS + 10, base_offset=1, partition_leader_epoch=6)
    p.append_as_follower(epoch_6, 2, 0)
    p.make_leader(state(leader_epoch=7, partition_epoch=9), now_ms=0)
    assert p.offsets_for_timestamp(EARLIEST_TIMESTAMP) == (0, -1, -1)
    assert p.offsets_for_timestamp(TS) == (0, TS, -1)
    assert p.offsets_for_timestamp(TS + 5) == (1, TS + 10, 6)


# -- the error mapping -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("storage_error", "expected", "code"),
    [
        (storage_errors.CorruptRecordError, errors.CorruptMessage, 2),
        (storage_errors.RecordTooLargeError, errors.MessageTooLarge, 10),
        (storage_errors.InvalidRecordError, errors.InvalidRecord, 87),
        (storage_errors.OffsetOutOfRangeError, errors.OffsetOutOfRange, 1),
        (storage_errors.OutOfOrderSequenceError, errors.OutOfOrderSequenceNumber, 45),
        (storage_errors.InvalidProducerEpochError, errors.InvalidProducerEpoch, 47),
        (storage_errors.LogDirOfflineError, errors.KafkaStorageError, 56),
        (storage_errors.InconsistentLogError, errors.KafkaStorageError, 56),
        (storage_errors.OffsetOverflowError, errors.UnknownServerError, -1),
        (storage_errors.StorageError, errors.UnknownServerError, -1),
    ],
)
def test_every_storage_error_maps_to_a_kafka_code(
    storage_error: type[storage_errors.StorageError], expected: type[Exception], code: int
) -> None:
    mapped = from_storage_error(storage_error("boom"))
    assert type(mapped) is expected and mapped.code == code
    assert "boom" in str(mapped)


def test_codes_match_kafka() -> None:
    expected = {
        errors.UnknownServerError: -1,
        errors.OffsetOutOfRange: 1,
        errors.CorruptMessage: 2,
        errors.UnknownTopicOrPartition: 3,
        errors.NotLeaderOrFollower: 6,
        errors.RequestTimedOut: 7,
        errors.MessageTooLarge: 10,
        errors.RecordListTooLarge: 18,
        errors.NotEnoughReplicas: 19,
        errors.NotEnoughReplicasAfterAppend: 20,
        errors.InvalidRequiredAcks: 21,
        errors.InvalidTimestamp: 32,
        errors.OutOfOrderSequenceNumber: 45,
        errors.InvalidProducerEpoch: 47,
        errors.KafkaStorageError: 56,
        errors.FencedLeaderEpoch: 74,
        errors.UnknownLeaderEpoch: 75,
        errors.InvalidRecord: 87,
    }
    assert {cls: cls.code for cls in expected} == expected
