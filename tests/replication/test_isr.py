"""The leader's bookkeeping of its followers (replication/isr.py), as pure logic: caught-up
times, the high watermark over the maximal ISR, and who may join or must leave the ISR."""

from __future__ import annotations

from replication.isr import UNKNOWN_OFFSET, IsrState

LEADER = 1
LAG_MS = 1000


def fresh(isr: tuple[int, ...] = (1, 2, 3), now_ms: int = 0) -> IsrState:
    return IsrState.reset(LEADER, isr, (1, 2, 3), now_ms)


def test_a_new_leader_knows_no_positions_and_trusts_its_isr_for_a_while() -> None:
    state = fresh(isr=(1, 2), now_ms=500)
    assert state.followers[2].log_end_offset == UNKNOWN_OFFSET
    assert state.followers[2].last_caught_up_ms == 500  # benefit of the doubt
    assert state.followers[3].last_caught_up_ms == -1  # not in the ISR
    assert state.high_watermark(10) == UNKNOWN_OFFSET  # follower 2's end is unknown
    assert state.out_of_sync(500 + LAG_MS, LAG_MS) == ()
    assert state.out_of_sync(501 + LAG_MS, LAG_MS) == (2,)


def test_the_high_watermark_is_the_smallest_log_end_in_the_isr() -> None:
    state = fresh()
    state.follower_fetched(2, 7, 10, now_ms=1)
    assert state.high_watermark(10) == UNKNOWN_OFFSET  # 3 has not fetched
    state.follower_fetched(3, 9, 10, now_ms=2)
    assert state.high_watermark(10) == 7
    state.follower_fetched(2, 10, 10, now_ms=3)
    assert state.high_watermark(10) == 9
    assert state.high_watermark(8) == 8  # never above the leader's own end


def test_a_replica_outside_the_isr_does_not_hold_the_high_watermark_back() -> None:
    state = fresh(isr=(1, 2))
    state.follower_fetched(2, 10, 10, now_ms=1)
    assert state.high_watermark(10) == 10  # 3 has fetched nothing: not in the ISR


def test_a_pending_change_counts_both_the_joining_and_the_leaving_replica() -> None:
    state = fresh(isr=(1, 2))
    state.follower_fetched(2, 10, 10, now_ms=1)
    state.follower_fetched(3, 4, 10, now_ms=1)
    state.pending = (1, 2, 3)  # expansion in flight: 3 already holds the HW back
    assert state.high_watermark(10) == 4
    state.update_membership((1, 2, 3), (1, 2, 3))
    assert state.pending is None and state.high_watermark(10) == 4
    state.pending = (1, 3)  # shrink in flight: 2 still counts until it is committed
    state.follower_fetched(2, 5, 10, now_ms=2)
    state.follower_fetched(3, 10, 10, now_ms=2)
    assert state.high_watermark(10) == 5


def test_one_fetch_behind_a_busy_leader_still_counts_as_caught_up() -> None:
    state = fresh(isr=(1, 2))
    end = 10
    for now in range(100, 2000, 100):  # 5 behind, the leader 10 further on at each fetch
        state.follower_fetched(2, end - 5, end, now_ms=now)
        end += 10
    assert state.out_of_sync(2000, LAG_MS) == ()


def test_caught_up_at_a_fetch_reaching_the_log_end_or_the_previous_fetch_s_end() -> None:
    state = fresh()
    state.follower_fetched(2, 5, 10, now_ms=100)  # behind: not caught up
    assert state.followers[2].last_caught_up_ms == 0  # still the reset time
    state.follower_fetched(2, 10, 15, now_ms=200)  # reached what the leader had at 100
    assert state.followers[2].last_caught_up_ms == 100
    state.follower_fetched(2, 15, 15, now_ms=300)  # reached the end now
    assert state.followers[2].last_caught_up_ms == 300


def test_a_follower_that_keeps_fetching_but_never_catches_up_leaves_the_isr() -> None:
    state = fresh(isr=(1, 2))
    end = 10
    for now in range(100, 2000, 100):  # never reaching even the previous fetch's end
        state.follower_fetched(2, end - 50, end, now_ms=now)
        end += 10
    assert state.out_of_sync(2000, LAG_MS) == (2,)


def test_joining_needs_the_high_watermark_and_the_epoch_start() -> None:
    state = fresh(isr=(1, 2))
    state.follower_fetched(3, 8, 10, now_ms=1)
    assert not state.ready_to_join(3, high_watermark=9, epoch_start_offset=0)
    assert not state.ready_to_join(3, high_watermark=5, epoch_start_offset=9)
    assert state.ready_to_join(3, high_watermark=8, epoch_start_offset=8)
    assert not state.ready_to_join(2, high_watermark=0, epoch_start_offset=0)  # already in
    assert not state.ready_to_join(9, high_watermark=0, epoch_start_offset=0)  # no replica


def test_membership_changes_keep_positions_and_drop_removed_replicas() -> None:
    state = fresh()
    state.follower_fetched(2, 6, 10, now_ms=1)
    state.update_membership((1, 2), (1, 2, 4))
    assert state.followers[2].log_end_offset == 6
    assert 3 not in state.followers and state.followers[4].log_end_offset == UNKNOWN_OFFSET
    assert not state.follower_fetched(3, 1, 10, now_ms=2)  # no longer a replica
