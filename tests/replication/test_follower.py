"""A follower's truncation decisions (replication/follower.py): the pure rules first, then the
divergence scenarios of KIP-101 and KIP-279 replayed step by step on real partitions and
logs, leader and follower exchanging fetches directly (no network, no clock)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import FakeClock, make_batch

from controller.image import PartitionState
from replication.follower import (
    FetchAnswer,
    Outcome,
    apply_fetch_answer,
    out_of_range_action,
    truncation_offset,
    whole_batches,
)
from replication.partition import Partition
from storage.config import LogConfig
from storage.loader import load_log
from storage.log import Log
from storage.records import iter_decoded

TOPIC_ID = bytes(range(16))


def ends(table: dict[int, tuple[int, int]]) -> Callable[[int], tuple[int, int]]:
    """A follower's end_offset_for_epoch from {asked epoch: answer}; unknown -> (-1, -1)."""
    return lambda epoch: table.get(epoch, (-1, -1))


# -- the pure rules ----------------------------------------------------------------------------


def test_both_have_the_epoch_they_agree_up_to_the_smaller_end() -> None:
    assert truncation_offset(3, 120, ends({3: (3, 150)}), 150, 0) == 120
    assert truncation_offset(3, 120, ends({3: (3, 100)}), 150, 0) == 100


def test_the_follower_lacks_the_leader_s_epoch_it_goes_back_to_its_own_and_asks_again() -> None:
    # KIP-279: the follower's largest epoch <= 3 is 2, ending at 90: truncate there first.
    assert truncation_offset(3, 120, ends({3: (2, 90)}), 150, 0) == 90


def test_the_leader_knows_no_such_epoch_only_its_log_start_is_common() -> None:
    assert truncation_offset(-1, -1, ends({}), 150, 40) == 40


def test_a_follower_without_epochs_takes_the_leader_s_end() -> None:
    assert truncation_offset(3, 120, ends({}), 150, 0) == 120


def test_never_above_the_follower_s_log_end() -> None:
    assert truncation_offset(3, 500, ends({3: (3, 500)}), 150, 0) == 150
    assert truncation_offset(-1, -1, ends({}), 10, 40) == 10


def test_out_of_range_below_the_log_start_restarts_above_the_end_truncates_to_the_hw() -> None:
    assert out_of_range_action(5, 40, 100) == (True, 40)
    assert out_of_range_action(150, 0, 100) == (False, 100)
    assert out_of_range_action(150, 0, -1) == (True, 0)  # no usable HW: start afresh


def test_a_trailing_partial_batch_is_left_for_the_next_fetch() -> None:
    one, two = make_batch([b"a"]), make_batch([b"b", b"c"])
    records = memoryview(one + two[:-3])
    assert bytes(whole_batches(records)) == one
    assert bytes(whole_batches(memoryview(one + two))) == one + two
    assert bytes(whole_batches(memoryview(one[:5]))) == b""


# -- scenarios on real partitions --------------------------------------------------------------


class Replicas:
    """Partitions of one topic-partition on brokers 1, 2, 3, each on its own real log."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.logs: list[Log] = []
        self.by_id: dict[int, Partition] = {}
        self.partition_epoch = 0

    def open(self, broker: int) -> Partition:
        log = load_log(self.root / f"b{broker}" / "t-0", LogConfig(), clock=FakeClock())
        self.logs.append(log)
        partition = Partition("t", TOPIC_ID, 0, log, local_broker_id=broker)
        self.by_id[broker] = partition
        return partition

    def crash(self, broker: int) -> Partition:
        """The broker's process dies (its files survive) and starts again."""
        partition = self.by_id.pop(broker)
        partition.log.close()
        return self.open(broker)

    def elect(self, leader: int, epoch: int, isr: tuple[int, ...], now_ms: int = 0) -> None:
        """What the controller's image tells every live broker."""
        self.partition_epoch += 1
        state = PartitionState(TOPIC_ID, 0, (1, 2, 3), isr, leader, epoch, self.partition_epoch)
        for broker, partition in self.by_id.items():
            if broker == leader:
                partition.make_leader(state, now_ms=now_ms)
            else:
                partition.make_follower(state)

    def fetch_once(self, follower: int, leader: int, now_ms: int = 0) -> Outcome:
        f, lead = self.by_id[follower], self.by_id[leader]
        offset, last_epoch = f.fetch_position()
        found = lead.read_for_follower(
            follower,
            offset,
            1 << 20,
            last_fetched_epoch=last_epoch,
            current_leader_epoch=f.leader_epoch,
            now_ms=now_ms,
        )
        records = b"" if found.data is None or found.data.slice is None else found.data.slice.read()
        answer = FetchAnswer(
            0, lead.high_watermark, lead.log_start_offset, memoryview(records), found.diverging
        )
        return apply_fetch_answer(f, answer).outcome

    def catch_up(self, follower: int, leader: int) -> list[Outcome]:
        """Fetch until the follower has the leader's log end and HW (at most 10 rounds)."""
        outcomes = []
        for _ in range(10):
            outcomes.append(self.fetch_once(follower, leader))
            f, lead = self.by_id[follower], self.by_id[leader]
            if (f.log_end_offset, f.high_watermark) == (lead.log_end_offset, lead.high_watermark):
                return outcomes
        raise AssertionError(f"follower {follower} did not catch up: {outcomes}")

    def values(self, broker: int) -> list[bytes | None]:
        log = self.by_id[broker].log
        data = log.read(log.log_start_offset, 1 << 20, isolation="log_end").slice
        raw = b"" if data is None else data.read()
        return [r.value for batch in iter_decoded(raw) for r in batch.records]

    def epochs(self, broker: int) -> list[tuple[int, int]]:
        return [(e.epoch, e.start_offset) for e in self.by_id[broker].log.epoch_cache.entries()]


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[Replicas]:
    r = Replicas(tmp_path)
    yield r
    for log in r.logs:
        if not log.closed:
            log.abandon()


def test_kip_101_a_restarted_follower_keeps_records_above_its_stale_hw(
    replicas: Replicas,
) -> None:
    """Scenario 1: B has m1, m2 but only HW 1 when it restarts; truncating to its HW would
    lose m2, which A had committed. B keeps its log; when A dies, B leads with m2."""
    a, b = replicas.open(1), replicas.open(2)
    replicas.elect(leader=1, epoch=0, isr=(1, 2))
    a.append_as_leader(make_batch([b"m1"]), -1)
    replicas.fetch_once(2, 1)  # B: m1, HW 0
    a.append_as_leader(make_batch([b"m2"]), -1)
    replicas.fetch_once(2, 1)  # B: m1 m2; A's HW moves to 1 with this fetch, B learns HW 1
    replicas.fetch_once(2, 1)  # A's HW 2 (committed m2); B still HW 1 when it crashes here
    assert a.high_watermark == 2
    b.log.update_high_watermark(1)
    b = replicas.crash(2)
    replicas.elect(leader=1, epoch=0, isr=(1, 2))
    assert b.log_end_offset == 2  # nothing truncated on becoming follower
    replicas.by_id.pop(1).log.close()  # A dies for good
    replicas.elect(leader=2, epoch=1, isr=(2,))
    assert replicas.values(2) == [b"m1", b"m2"]


def test_kip_101_a_returning_leader_truncates_its_uncommitted_tail(replicas: Replicas) -> None:
    """Scenario 2: A wrote m2 that B never got; both die; B returns first and leads epoch 1
    with m3 at A's m2 offset. A returns as follower: its m2 diverges and is replaced by m3."""
    replicas.open(1), replicas.open(2)
    replicas.elect(leader=1, epoch=0, isr=(1, 2))
    replicas.by_id[1].append_as_leader(make_batch([b"m1"]), 1)
    replicas.catch_up(2, 1)
    replicas.by_id[1].append_as_leader(make_batch([b"m2"]), 1)  # acks=1: B never gets it
    replicas.by_id.pop(1).log.close()
    replicas.elect(leader=2, epoch=1, isr=(2,))
    replicas.by_id[2].append_as_leader(make_batch([b"m3"]), 1)
    replicas.open(1)
    replicas.elect(leader=2, epoch=1, isr=(2,))
    assert replicas.values(1) == [b"m1", b"m2"]
    outcomes = replicas.catch_up(1, 2)
    assert outcomes[0] is Outcome.TRUNCATED
    assert replicas.values(1) == replicas.values(2) == [b"m1", b"m3"]
    assert replicas.epochs(1) == replicas.epochs(2) == [(0, 0), (1, 1)]


def test_kip_279_back_to_back_elections_leave_the_follower_an_epoch_the_leader_lacks(
    replicas: Replicas,
) -> None:
    """A leads epoch 0 (m1); B leads epoch 1 and appends m2 alone; A leads epoch 2 again
    (it never saw epoch 1) and appends m3, m4. B follows: its epoch 1 is unknown to A, so A
    answers with epoch 0's end; B truncates to 1 and then fetches A's epoch-2 records."""
    replicas.open(1), replicas.open(2)
    replicas.elect(leader=1, epoch=0, isr=(1, 2))
    replicas.by_id[1].append_as_leader(make_batch([b"m1"]), 1)
    replicas.catch_up(2, 1)
    replicas.elect(leader=2, epoch=1, isr=(1, 2))
    replicas.by_id[2].append_as_leader(make_batch([b"m2"]), 1)
    replicas.elect(leader=1, epoch=2, isr=(1, 2))
    replicas.by_id[1].append_as_leader(make_batch([b"m3", b"m4"]), 1)
    outcomes = replicas.catch_up(2, 1)
    assert outcomes[0] is Outcome.TRUNCATED
    assert replicas.values(2) == replicas.values(1) == [b"m1", b"m3", b"m4"]
    assert replicas.epochs(2) == replicas.epochs(1) == [(0, 0), (2, 1)]


def test_several_divergent_epochs_are_unwound_one_fetch_at_a_time(replicas: Replicas) -> None:
    """B wrote alone in epochs 1 and 3 (never replicated); A led 0, 2 and now 4. B goes
    back epoch by epoch until both logs agree, and never below what is common."""
    replicas.open(1), replicas.open(2)
    replicas.elect(leader=1, epoch=0, isr=(1, 2))
    replicas.by_id[1].append_as_leader(make_batch([b"a0"]), 1)
    replicas.catch_up(2, 1)
    for epoch, leader in ((1, 2), (2, 1), (3, 2), (4, 1)):
        replicas.elect(leader=leader, epoch=epoch, isr=(1, 2))
        replicas.by_id[leader].append_as_leader(make_batch([f"e{epoch}".encode()]), 1)
    outcomes = replicas.catch_up(2, 1)
    assert Outcome.TRUNCATED in outcomes and outcomes[-1] is Outcome.APPENDED
    assert replicas.values(2) == replicas.values(1) == [b"a0", b"e2", b"e4"]


def test_a_stale_leader_epoch_in_the_fetch_is_fenced(replicas: Replicas) -> None:
    replicas.open(1), replicas.open(2)
    replicas.elect(leader=1, epoch=3, isr=(1, 2))
    lead = replicas.by_id[1]
    with pytest.raises(Exception) as fenced:
        lead.read_for_follower(2, 0, 100, last_fetched_epoch=-1, current_leader_epoch=2, now_ms=0)
    assert getattr(fenced.value, "code", None) == 74  # FENCED_LEADER_EPOCH
    with pytest.raises(Exception) as early:
        lead.read_for_follower(2, 0, 100, last_fetched_epoch=-1, current_leader_epoch=4, now_ms=0)
    assert getattr(early.value, "code", None) == 75  # UNKNOWN_LEADER_EPOCH


def test_a_follower_far_behind_the_leader_s_log_start_starts_again_there(
    replicas: Replicas,
) -> None:
    replicas.open(1), replicas.open(2)
    replicas.elect(leader=1, epoch=0, isr=(1,))
    lead = replicas.by_id[1]
    for i in range(4):
        lead.append_as_leader(make_batch([f"r{i}".encode()]), 1)
    lead.log.maybe_increment_log_start_offset(3)  # retention deleted offsets 0-2
    follower = replicas.by_id[2]
    answer = FetchAnswer(1, lead.high_watermark, lead.log_start_offset, memoryview(b""))
    assert apply_fetch_answer(follower, answer).outcome is Outcome.RESTARTED
    assert follower.log_start_offset == follower.log_end_offset == 3
    replicas.catch_up(2, 1)
    assert replicas.values(2) == [b"r3"]
