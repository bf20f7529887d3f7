"""A leader partition with followers, on a real log: the high watermark moves with follower
fetches, acks=-1 appends complete or fail with the right error, the ISR is proposed (never
changed) by the leader, consumers and followers are told of new data."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import FakeClock, make_batch

from controller.image import PartitionState
from replication import errors
from replication import partition as partition_module
from replication.errors import ReplicationError
from replication.partition import Partition
from storage.config import LogConfig
from storage.loader import load_log
from storage.log import AppendInfo, Log

ME = 1
TOPIC_ID = bytes(range(16))
LAG_MS = 1000


def state(
    isr: tuple[int, ...] = (ME, 2, 3),
    leader: int = ME,
    leader_epoch: int = 4,
    partition_epoch: int = 10,
) -> PartitionState:
    return PartitionState(TOPIC_ID, 0, (ME, 2, 3), isr, leader, leader_epoch, partition_epoch)


class Leader:
    """A leader replica with recorded ISR proposals, commits and notifications."""

    def __init__(self, log: Log, min_isr: int = 1, accept_proposals: bool = True) -> None:
        self.partition = Partition(
            "t",
            TOPIC_ID,
            0,
            log,
            local_broker_id=ME,
            min_insync_replicas=min_isr,
            replica_lag_time_max_ms=LAG_MS,
        )
        self.proposals: list[tuple[int, ...]] = []
        self.accept = accept_proposals
        self.exposed: list[int] = []
        self.appended: list[int] = []
        self.partition.propose_isr = self._propose
        self.partition.on_append.append(lambda key, size: self.exposed.append(size))
        self.partition.on_log_append.append(lambda key, size: self.appended.append(size))

    def _propose(self, partition: Partition, isr: tuple[int, ...]) -> bool:
        self.proposals.append(isr)
        return self.accept

    def append(self, *values: bytes, acks: int = -1) -> tuple[AppendInfo, list[object]]:
        info = self.partition.append_as_leader(make_batch(list(values)), acks)
        outcome: list[object] = []
        self.partition.await_commit(info, outcome.append)
        return info, outcome

    def fetch(self, replica: int, offset: int, now_ms: int = 0, epoch: int = 4) -> None:
        self.partition.read_for_follower(
            replica,
            offset,
            1 << 20,
            last_fetched_epoch=epoch,
            current_leader_epoch=4,
            now_ms=now_ms,
        )


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Leader]:
    log = load_log(tmp_path / "t-0", LogConfig(), clock=FakeClock())
    made = Leader(log)
    made.partition.make_leader(state(), now_ms=0)
    yield made
    log.abandon()


def test_acks_all_completes_once_every_isr_follower_has_the_batch(leader: Leader) -> None:
    info, outcome = leader.append(b"a", b"b")
    assert leader.appended and outcome == [] and leader.partition.high_watermark == 0
    leader.fetch(2, 2)
    assert outcome == [] and leader.partition.high_watermark == 0  # 3 has not fetched
    leader.fetch(3, 1)
    assert outcome == [] and leader.partition.high_watermark == 1
    assert leader.exposed == []  # the batch is not wholly below the HW yet
    leader.fetch(3, 2)
    assert outcome == [None] and leader.partition.high_watermark == 2
    assert leader.exposed == [info.size_bytes]


def test_a_committed_append_completes_at_once_and_acks_one_does_not_wait(leader: Leader) -> None:
    leader.append(b"a", acks=1)
    leader.fetch(2, 1)
    leader.fetch(3, 1)
    info = leader.partition.append_as_leader(make_batch([b"b"]), 1)
    assert leader.partition.high_watermark == 1  # acks=1 returned without the followers
    done: list[object] = []
    leader.partition.await_commit(AppendInfo(0, 0, -1, -1, 1, 10), done.append)
    assert done == [None]
    assert info.first_offset == 1


def test_a_forgotten_commit_wait_is_not_kept_nor_called(leader: Leader) -> None:
    info = leader.partition.append_as_leader(make_batch([b"a"]), -1)
    kept: list[object] = []
    forgotten: list[object] = []
    leader.partition.await_commit(info, kept.append)
    forget = leader.partition.await_commit(info, forgotten.append)
    forget()  # the produce request timed out
    forget()  # twice is harmless
    assert len(leader.partition._waiting) == 1
    leader.fetch(2, 1)
    leader.fetch(3, 1)
    assert kept == [None] and forgotten == []
    assert not leader.partition._waiting


def test_the_isr_shrinking_below_the_minimum_fails_waiting_appends(tmp_path: Path) -> None:
    log = load_log(tmp_path / "t-0", LogConfig(), clock=FakeClock())
    made = Leader(log, min_isr=2)
    made.partition.make_leader(state(), now_ms=0)
    _, outcome = made.append(b"a")
    made.fetch(2, 1)  # 2 has it; 3 is stuck
    made.partition.make_leader(state(isr=(ME,), partition_epoch=11), now_ms=5)
    (error,) = outcome  # committed by the ISR left, but that ISR is too small (Kafka's rule)
    assert isinstance(error, errors.NotEnoughReplicasAfterAppend) and error.code == 20
    log.abandon()


def test_an_append_committed_by_an_isr_too_small_before_its_wait_fails_too(
    tmp_path: Path,
) -> None:
    """The produce handler asks for the commit a loop turn after the append; an ISR shrink
    applied in between commits the append by the leader alone. Asked then, it must fail as
    a waiting one would (it used to succeed: an acknowledged record on one replica)."""
    log = load_log(tmp_path / "t-0", LogConfig(), clock=FakeClock())
    made = Leader(log, min_isr=2)
    made.partition.make_leader(state(), now_ms=0)
    info = made.partition.append_as_leader(make_batch([b"a"]), -1)
    made.partition.make_leader(state(isr=(ME,), partition_epoch=11), now_ms=5)
    assert made.partition.high_watermark == 1  # committed by the leader alone
    done: list[object] = []
    made.partition.await_commit(info, done.append)
    (error,) = done
    assert isinstance(error, errors.NotEnoughReplicasAfterAppend) and error.code == 20
    log.abandon()


def test_appends_waiting_on_a_replica_when_the_isr_is_too_small_fail(tmp_path: Path) -> None:
    log = load_log(tmp_path / "t-0", LogConfig(), clock=FakeClock())
    made = Leader(log, min_isr=3)
    made.partition.make_leader(state(), now_ms=0)
    _, outcome = made.append(b"a")
    made.partition.make_leader(state(isr=(ME, 3), partition_epoch=11), now_ms=5)
    (error,) = outcome  # 3 has not fetched: not committed, and can no longer be enough
    assert isinstance(error, errors.NotEnoughReplicasAfterAppend)
    log.abandon()


def test_a_shrink_that_keeps_the_minimum_commits_what_waited_for_the_removed_replica(
    leader: Leader,
) -> None:
    _, outcome = leader.append(b"a")
    leader.fetch(2, 1)
    leader.partition.make_leader(state(isr=(ME, 2), partition_epoch=11), now_ms=5)
    assert outcome == [None] and leader.partition.high_watermark == 1


def test_losing_leadership_fails_waiting_appends(leader: Leader) -> None:
    _, outcome = leader.append(b"a")
    leader.partition.make_follower(state(leader=2, leader_epoch=5, partition_epoch=11))
    (error,) = outcome
    assert isinstance(error, errors.NotLeaderOrFollower)
    late: list[object] = []
    leader.partition.await_commit(AppendInfo(0, 0, -1, -1, 1, 10), late.append)
    assert isinstance(late[0], ReplicationError)


def test_a_lagging_follower_is_proposed_out_and_a_caught_up_one_back_in(leader: Leader) -> None:
    p = leader.partition
    leader.append(b"a")
    leader.fetch(2, 1, now_ms=100)
    leader.fetch(3, 0, now_ms=100)  # behind
    assert p.maybe_shrink_isr(now_ms=LAG_MS) == ()  # within the lag time since becoming leader
    leader.fetch(2, 1, now_ms=LAG_MS + 1)
    assert p.maybe_shrink_isr(now_ms=LAG_MS + 1) == (3,)
    assert leader.proposals == [(ME, 2)] and p.pending_isr == (ME, 2)
    assert p.maybe_shrink_isr(now_ms=LAG_MS + 2) == ()  # one proposal in flight at a time
    p.isr_change_committed(state(isr=(ME, 2), partition_epoch=11), LAG_MS + 3, (ME, 2))
    assert p.isr == (ME, 2) and p.pending_isr is None and p.high_watermark == 1
    leader.fetch(3, 1, now_ms=LAG_MS + 4)  # caught up to the HW and the epoch start
    assert leader.proposals[-1] == (ME, 2, 3) and p.pending_isr == (ME, 2, 3)
    p.isr_change_failed((ME, 2), 11)  # another proposal's refusal: this one stays
    assert p.pending_isr == (ME, 2, 3)
    p.isr_change_failed((ME, 2, 3), 10)  # refused at an older partition epoch: stays too
    assert p.pending_isr == (ME, 2, 3)
    p.isr_change_failed((ME, 2, 3), 11)  # refused for good: a later fetch may propose again
    assert p.isr == (ME, 2) and p.pending_isr is None


def test_a_caught_up_follower_that_stops_fetching_leaves_the_isr_only_after_the_lag_time(
    leader: Leader,
) -> None:
    """A paused follower (test_cluster_replication.py pauses one): caught up at its last
    fetch, it stays in the ISR until replica_lag_time_max_ms after it, and no longer."""
    p = leader.partition
    leader.append(b"a")
    leader.fetch(2, 1, now_ms=500)
    leader.fetch(3, 1, now_ms=500)  # both caught up at 500; then 3 fetches no more
    leader.fetch(2, 1, now_ms=500 + LAG_MS)
    assert p.maybe_shrink_isr(now_ms=500 + LAG_MS) == () and leader.proposals == []
    leader.fetch(2, 1, now_ms=501 + LAG_MS)
    assert p.maybe_shrink_isr(now_ms=501 + LAG_MS) == (3,)
    assert leader.proposals == [(ME, 2)]


def test_a_pending_proposal_ends_only_by_its_answer_or_a_newer_partition_epoch(
    leader: Leader,
) -> None:
    p = leader.partition
    leader.append(b"a")
    leader.fetch(2, 1, now_ms=LAG_MS + 1)
    assert p.maybe_shrink_isr(now_ms=LAG_MS + 1) == (3,)
    # The answer is lost: the controller may have committed (ME, 2). Until it is known, the
    # HW still counts 3 (the maximal ISR), so nothing commits without it.
    assert p.pending_isr == (ME, 2) and p.high_watermark == 0
    assert p.proposal_pending((ME, 2), 10)
    # An image at a newer partition epoch is the controller's word, even with the same ISR.
    p.make_leader(state(partition_epoch=11), now_ms=LAG_MS + 2)
    assert p.pending_isr is None and not p.proposal_pending((ME, 2), 10)
    # A late answer to that proposal still applies what it committed, if newer.
    p.isr_change_committed(state(isr=(ME, 2), partition_epoch=12), LAG_MS + 3, (ME, 2))
    assert p.isr == (ME, 2) and p.partition_epoch == 12 and p.high_watermark == 1


def test_a_refused_send_leaves_no_pending_change(tmp_path: Path) -> None:
    log = load_log(tmp_path / "t-0", LogConfig(), clock=FakeClock())
    made = Leader(log, accept_proposals=False)
    made.partition.make_leader(state(isr=(ME, 2)), now_ms=0)
    made.fetch(3, 0)
    assert made.proposals == [(ME, 2, 3)] and made.partition.pending_isr is None
    log.abandon()


def test_a_follower_whose_last_epoch_diverges_gets_the_epoch_end_and_no_records(
    leader: Leader,
) -> None:
    leader.append(b"a", b"b")  # epoch 4 starts at 0 here
    found = leader.partition.read_for_follower(
        2, 5, 1 << 20, last_fetched_epoch=3, current_leader_epoch=4, now_ms=0
    )
    # Epoch 3 is older than any here: it "ends" where the first epoch here starts (Kafka's
    # answer), below the fetch offset, so the follower must truncate to 0.
    assert found.data is None and found.diverging == (3, 0)
    found = leader.partition.read_for_follower(
        2, 2, 1 << 20, last_fetched_epoch=4, current_leader_epoch=4, now_ms=0
    )
    assert found.diverging is None and found.data is not None


def test_only_replicas_may_fetch_as_followers(leader: Leader) -> None:
    with pytest.raises(errors.NotLeaderOrFollower):
        leader.fetch(9, 0)


def test_a_new_leader_epoch_forgets_the_followers_positions(leader: Leader) -> None:
    leader.append(b"a")
    leader.fetch(2, 1)
    leader.fetch(3, 1)
    assert leader.partition.high_watermark == 1
    leader.append(b"b")
    leader.partition.make_leader(state(leader_epoch=5, partition_epoch=11), now_ms=0)
    assert leader.partition.high_watermark == 1  # never back, and no further without fetches
    leader.partition.read_for_follower(
        2, 2, 1 << 20, last_fetched_epoch=4, current_leader_epoch=5, now_ms=1
    )
    assert leader.partition.high_watermark == 1  # 3 has not fetched in epoch 5


# -- a quiet follower read: nothing to read, diverge on or move ----------------------------------


def quiet(leader: Leader, replica: int, offset: int, *, now_ms: int = 0, **epochs: int) -> bool:
    return leader.partition.read_for_quiet_follower(
        replica,
        offset,
        last_fetched_epoch=epochs.get("last", 4),
        current_leader_epoch=epochs.get("current", 4),
        now_ms=now_ms,
    )


def test_a_quiet_follower_read_notes_the_fetch_as_a_read_would(tmp_path: Path) -> None:
    """Two leaders with one history: where one takes the cheap read, the other the full one;
    their HWs, ISR proposals and lag decisions stay the same."""
    twins = []
    for name in ("quiet", "full"):
        log = load_log(tmp_path / name / "t-0", LogConfig(), clock=FakeClock())
        made = Leader(log)
        made.partition.make_leader(state(), now_ms=0)
        made.append(b"a", b"b")
        made.fetch(2, 2, now_ms=100)
        made.fetch(3, 2, now_ms=100)
        twins.append(made)
    cheap, full = twins
    for now_ms in (LAG_MS, 2 * LAG_MS):
        for replica in (2, 3):
            assert quiet(cheap, replica, 2, now_ms=now_ms)
            found = full.partition.read_for_follower(
                replica, 2, 1 << 20, last_fetched_epoch=4, current_leader_epoch=4, now_ms=now_ms
            )
            assert found.diverging is None and found.data is not None
            assert found.data.slice is None  # nothing to read
    for made in twins:
        # caught up at 2 * LAG_MS: in sync until 3 * LAG_MS, out after
        assert made.partition.maybe_shrink_isr(now_ms=3 * LAG_MS) == ()
        assert made.partition.maybe_shrink_isr(now_ms=3 * LAG_MS + 1) == (2, 3)
    assert [m.partition.high_watermark for m in twins] == [2, 2]
    assert cheap.proposals == full.proposals == [(ME,)]
    for made in twins:
        made.partition.log.abandon()


def test_a_follower_read_with_anything_to_do_is_never_quiet(leader: Leader) -> None:
    p = leader.partition
    leader.append(b"a")
    leader.fetch(2, 1)
    leader.fetch(3, 0)
    assert not quiet(leader, 3, 1)  # its position moves (and with it the HW)
    assert not quiet(leader, 2, 0)  # below the log end: there is something to read
    assert not quiet(leader, 2, 1, last=3)  # an older last epoch: may diverge
    assert not quiet(leader, 2, 1, current=3)  # a stale leader epoch: fenced
    assert not quiet(leader, 2, 1, current=-1)  # unchecked epoch: the full read decides
    assert not quiet(leader, 9, 1)  # not a replica
    assert p.high_watermark == 0 and leader.proposals == []  # none of them did anything
    assert quiet(leader, 2, 1)
    p.make_follower(state(leader=2, leader_epoch=5, partition_epoch=11))
    assert not quiet(leader, 2, 1) and not quiet(leader, 2, 1, current=5)


def test_an_out_of_sync_follower_is_never_quiet(tmp_path: Path) -> None:
    """A caught-up follower outside the ISR must be offered it by a read."""
    log = load_log(tmp_path / "t-0", LogConfig(), clock=FakeClock())
    made = Leader(log)
    made.partition.make_leader(state(isr=(ME, 2)), now_ms=0)
    made.append(b"a", acks=1)
    made.fetch(2, 1)
    made.fetch(3, 1)  # caught up: proposed to join
    assert made.proposals == [(ME, 2, 3)]
    made.partition.isr_change_failed((ME, 2, 3), 10)  # refused: may be proposed again
    assert not quiet(made, 3, 1)
    made.fetch(3, 1)
    assert made.proposals == [(ME, 2, 3), (ME, 2, 3)]
    log.abandon()


def test_an_empty_log_s_caught_up_follower_is_quiet_without_a_last_epoch(leader: Leader) -> None:
    leader.fetch(2, 0, epoch=-1)
    assert quiet(leader, 2, 0, last=-1)


def crashed_below_its_high_watermark(directory: Path) -> Log:
    """A log whose high watermark was 4 when the machine lost power, with only offsets 0-1
    (the flushed first batch) surviving: the loader notes the committed records lost."""
    log = load_log(directory, LogConfig(), clock=FakeClock())
    log.append_as_leader(make_batch([b"a", b"b"]), 4)
    log.flush()
    flushed = (directory / f"{0:020d}.log").stat().st_size
    log.append_as_leader(make_batch([b"c", b"d"]), 4)
    log.update_high_watermark(4)
    log.abandon()  # no clean shutdown
    os.truncate(directory / f"{0:020d}.log", flushed)  # the page cache's part is gone
    return load_log(directory, LogConfig(), recovery_point=2, high_watermark=4, clock=FakeClock())


def test_a_leader_whose_crash_lost_committed_records_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The last in-sync replica losing power (Kafka's KIP-966 case): leading with a log
    that ends below its checkpointed high watermark loses those records for good."""
    with caplog.at_level(logging.WARNING):
        log = crashed_below_its_high_watermark(tmp_path / "t-0")
    try:
        assert log.log_end_offset == 2 and log.committed_end_before_crash == 4
        assert any("committed records [2, 4) were lost" in m for m in caplog.messages)
        caplog.clear()
        made = Leader(log)
        with caplog.at_level(logging.ERROR, logger="replication.partition"):
            made.partition.make_leader(state(isr=(ME,)), now_ms=0)
            made.partition.make_leader(state(isr=(ME,), leader_epoch=5), now_ms=0)
        (said,) = caplog.messages
        assert "committed records [2, 4)" in said and "are lost" in said
    finally:
        log.abandon()


def test_a_replica_that_caught_up_before_leading_says_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = crashed_below_its_high_watermark(tmp_path / "t-0")
    try:
        made = Leader(log)
        made.partition.make_follower(state(leader=2, leader_epoch=4))
        again = make_batch([b"c", b"d"], base_offset=2, partition_leader_epoch=4)
        made.partition.append_as_follower(again, 4, 0)  # fetched back from the leader
        with caplog.at_level(logging.ERROR, logger="replication.partition"):
            made.partition.make_leader(state(leader_epoch=5), now_ms=0)
        said = [r.getMessage() for r in caplog.records if r.name == "replication.partition"]
        assert said == [] and log.committed_end_before_crash is None
    finally:
        log.abandon()


def test_bytes_appended_while_the_hw_is_stuck_are_remembered_in_bounded_memory(
    leader: Leader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the HW stuck (a follower that stopped fetching, no controller to shrink the ISR)
    the leader kept one entry per append; now at most MAX_UNEXPOSED_ENTRIES, and every byte
    is still told to the consumers' purgatory once the HW passes it."""
    monkeypatch.setattr(partition_module, "MAX_UNEXPOSED_ENTRIES", 4)
    sizes = []
    for i in range(10):
        info, _ = leader.append(b"v%d" % i, acks=1)
        sizes.append(info.size_bytes)
    assert len(leader.partition._unexposed) == 4
    leader.fetch(2, 10)
    leader.fetch(3, 10)
    assert leader.partition.high_watermark == 10
    assert sum(leader.exposed) == sum(sizes) and not leader.partition._unexposed
