"""DeleteRecords on a leader partition with followers, on a real log: the log start moves
(never past the HW), Kafka's refusals, and the low watermark that the request waits for,
fed by the log starts the followers say in their fetches."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import FakeClock, make_batch
from test_leader import Leader, state

from replication import errors
from replication.partition import DELETE_TO_HIGH_WATERMARK, Partition
from storage.config import LogConfig
from storage.loader import load_log


def everyone_alive(broker_id: int) -> bool:
    return True


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Leader]:
    made = _leader(tmp_path, LogConfig())
    yield made
    made.partition.log.abandon()


def _leader(tmp_path: Path, config: LogConfig) -> Leader:
    made = Leader(load_log(tmp_path / "t-0", config, clock=FakeClock()))
    made.partition.make_leader(state(), now_ms=0)
    return made


def _committed(leader: Leader, count: int) -> int:
    """``count`` one-record batches, fetched by both followers: the HW at the log end."""
    for i in range(count):
        leader.append(b"v%d" % i)
    end = leader.partition.log_end_offset
    for follower in (2, 3):
        leader.fetch(follower, end)
    assert leader.partition.high_watermark == end
    return end


def _fetch(leader: Leader, replica: int, log_start: int) -> None:
    """A caught-up fetch of ``replica`` saying ``log_start`` as its log start offset."""
    leader.partition.read_for_follower(
        replica,
        leader.partition.log_end_offset,
        1 << 20,
        last_fetched_epoch=4,
        current_leader_epoch=4,
        now_ms=0,
        log_start_offset=log_start,
    )


def test_the_log_start_moves_and_reads_below_it_are_out_of_range(leader: Leader) -> None:
    _committed(leader, 5)
    assert leader.partition.delete_records(3) == 3
    assert leader.partition.log_start_offset == 3
    with pytest.raises(errors.OffsetOutOfRange):
        leader.partition.read(2, 1 << 20)
    assert leader.partition.read(3, 1 << 20).slice is not None
    assert leader.partition.delete_records(1) == 3  # below the log start: nothing changes


def test_minus_one_deletes_up_to_the_high_watermark(leader: Leader) -> None:
    end = _committed(leader, 4)
    leader.append(b"uncommitted")  # above the HW: never deleted
    assert leader.partition.delete_records(DELETE_TO_HIGH_WATERMARK) == end
    assert leader.partition.log_start_offset == end


def test_an_offset_past_the_high_watermark_or_below_minus_one_is_refused(leader: Leader) -> None:
    end = _committed(leader, 3)
    leader.append(b"uncommitted")
    for offset in (end + 1, -2):
        with pytest.raises(errors.OffsetOutOfRange):
            leader.partition.delete_records(offset)
    assert leader.partition.log_start_offset == 0


@pytest.mark.parametrize(("policy", "allowed"), [("compact", False), ("compact,delete", True)])
def test_a_topic_without_the_delete_policy_refuses(
    tmp_path: Path, policy: str, allowed: bool
) -> None:
    made = _leader(tmp_path, LogConfig(cleanup_policy=policy))  # type: ignore[arg-type]
    try:
        made.partition.append_as_leader(make_batch([b"a"], keys=[b"k"]), 1)
        made.fetch(2, 1)
        made.fetch(3, 1)
        if allowed:
            assert made.partition.delete_records(1) == 1
        else:
            with pytest.raises(errors.PolicyViolation) as refused:
                made.partition.delete_records(1)
            assert refused.value.code == 44
            assert made.partition.log_start_offset == 0
    finally:
        made.partition.log.abandon()


def test_only_the_leader_deletes(leader: Leader) -> None:
    leader.partition.make_follower(state(leader=2, leader_epoch=5))
    with pytest.raises(errors.NotLeaderOrFollower):
        leader.partition.delete_records(0)
    with pytest.raises(errors.NotLeaderOrFollower):
        leader.partition.low_watermark(everyone_alive)


def test_an_offline_log_is_kafka_storage_error(leader: Leader) -> None:
    _committed(leader, 2)
    leader.partition.log._go_offline(OSError(5, "Input/output error"))  # a failed write
    with pytest.raises(errors.KafkaStorageError):
        leader.partition.delete_records(1)
    assert leader.partition.log.log_start_offset == 0


def test_the_low_watermark_is_the_smallest_log_start_of_the_live_replicas(
    leader: Leader,
) -> None:
    _committed(leader, 6)  # the followers' fetches said no log start: unknown
    p = leader.partition
    p.delete_records(4)
    assert p.low_watermark(everyone_alive) == -1
    _fetch(leader, 2, 4)
    assert p.low_watermark(everyone_alive) == -1  # follower 3 has not said
    _fetch(leader, 3, 0)
    assert p.low_watermark(everyone_alive) == 0
    assert p.low_watermark(lambda broker: broker != 3) == 4  # a dead follower does not count
    _fetch(leader, 3, -1)  # a fetch not saying it keeps what was said
    assert p.low_watermark(everyone_alive) == 0
    _fetch(leader, 3, 4)
    assert p.low_watermark(everyone_alive) == 4
    p.delete_records(5)
    assert p.low_watermark(everyone_alive) == 4  # the followers' starts lag the leader's


def test_watchers_hear_a_higher_follower_log_start_and_lost_leadership(leader: Leader) -> None:
    _committed(leader, 3)
    p = leader.partition
    heard: list[str] = []
    p.watch_low_watermark(lambda: heard.append("first"))
    _fetch(leader, 2, 0)  # its first word: from unknown (-1) to 0 is higher
    assert heard == ["first"]
    p.watch_low_watermark(lambda: heard.append("second"))
    _fetch(leader, 2, 0)  # the same start: nothing moved
    assert heard == ["first"]
    _fetch(leader, 2, 2)
    assert heard == ["first", "second"]  # each watcher is called once
    forget = p.watch_low_watermark(lambda: heard.append("forgotten"))
    forget()
    p.watch_low_watermark(lambda: heard.append("leadership"))
    _fetch(leader, 3, 1)
    assert heard == ["first", "second", "leadership"]
    p.watch_low_watermark(lambda: heard.append("moved"))
    p.make_follower(state(leader=2, leader_epoch=5))
    assert heard[-1] == "moved"


def test_a_new_leader_epoch_forgets_the_followers_log_starts(leader: Leader) -> None:
    _committed(leader, 3)
    p = leader.partition
    _fetch(leader, 2, 1)
    _fetch(leader, 3, 1)
    p.delete_records(1)
    assert p.low_watermark(everyone_alive) == 1
    heard: list[int] = []
    p.watch_low_watermark(lambda: heard.append(1))
    p.make_leader(state(leader_epoch=5, partition_epoch=11), now_ms=0)
    assert heard == [1]
    assert p.low_watermark(everyone_alive) == -1


def test_a_follower_saying_a_new_log_start_is_not_quiet(leader: Leader) -> None:
    """A follower session's caught-up partition is skipped as quiet only while the follower
    says the log start the leader has recorded for it: else the low watermark never moves."""
    end = _committed(leader, 3)
    p = leader.partition
    _fetch(leader, 2, 0)

    def quiet(log_start: int) -> bool:
        return p.read_for_quiet_follower(
            2,
            end,
            last_fetched_epoch=4,
            current_leader_epoch=4,
            now_ms=0,
            log_start_offset=log_start,
        )

    assert quiet(0) and quiet(-1)
    p.delete_records(2)
    assert not quiet(2)  # read in full instead, which records it
    _fetch(leader, 2, 2)
    assert quiet(2)


def test_a_follower_restarted_inside_a_batch_starts_at_that_batch(
    leader: Leader, tmp_path: Path
) -> None:
    """The leader's log start may lie inside a batch (DeleteRecords). A follower whose log
    end fell below it restarts there, empty, and the leader's answer then begins with the
    batch holding it, from an earlier base offset: the follower starts its log at that base
    (as Kafka's follower does) and moves its log start back up to the leader's."""
    p = leader.partition
    for first in (0, 5, 10):
        p.append_as_leader(make_batch([b"v%d" % i for i in range(first, first + 5)]), 1)
    for replica in (2, 3):
        leader.fetch(replica, 15)
    assert p.delete_records(7) == 7
    follower_log = load_log(tmp_path / "follower" / "t-0", LogConfig(), clock=FakeClock())
    try:
        follower = Partition("t", p.topic_id, 0, follower_log, local_broker_id=2)
        follower.make_follower(state())
        follower.restart_at(7)  # its log end was below the leader's log start
        read = p.read_for_follower(
            2, 7, 1 << 20, last_fetched_epoch=-1, current_leader_epoch=4, now_ms=0
        )
        assert read.data is not None and read.data.slice is not None
        data = read.data.slice.read()
        assert int.from_bytes(data[:8], "big") == 5  # the batch holding offset 7
        corrupt = bytearray(data)
        corrupt[70] ^= 0xFF  # in the first batch's records: its CRC no longer matches
        with pytest.raises(errors.CorruptMessage):
            follower.append_as_follower(corrupt, p.high_watermark, p.log_start_offset)
        assert (follower.log_start_offset, follower.log_end_offset) == (7, 7)  # not moved
        follower.append_as_follower(data, p.high_watermark, p.log_start_offset)
        assert (follower.log_start_offset, follower.log_end_offset) == (7, 15)
        assert follower.log.read(7, 1 << 20).slice.read() == data  # type: ignore[union-attr]
    finally:
        follower_log.abandon()
