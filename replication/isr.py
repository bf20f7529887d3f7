"""The leader's view of its followers: their fetch positions, the high watermark and the ISR.

How this works. A pure state machine (no clock, no I/O: time is an argument) that a leader
``Partition`` keeps for its current leader epoch:

* every follower fetch reports the follower's log end offset (its fetch offset) and the
  time: ``follower_fetched``. A follower is *caught up* at a fetch whose offset reaches the
  leader's log end then; one that reaches the log end the leader had at the follower's
  previous fetch was caught up at that previous fetch (Kafka's ``lastCaughtUpTimeMs``);
* the high watermark is the smallest log end offset in the *maximal ISR*: the committed
  ISR plus any member an in-flight ISR change adds or removes (Kafka's ``maximalIsr``), so
  the HW never counts on a replica before the controller has committed it, and never stops
  counting one it is removing before the removal is committed. It never moves back;
* a follower outside the ISR whose log end reaches the high watermark and the start of this
  leader's epoch may join (``ready_to_join``); an ISR follower not caught up within
  ``lag_time_max_ms`` should leave (``out_of_sync``). The leader proposes the change to the
  controller (AlterPartition); only one proposal is in flight at a time (``pending``), and
  the committed ISR only changes when the controller's answer or the metadata image says so.

Becoming leader (``reset``) forgets every position, and gives ISR members the benefit of the
doubt (caught up "now"), as Kafka does: a new leader does not shrink the ISR before its
followers have had ``lag_time_max_ms`` to fetch from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["FollowerState", "IsrState", "UNKNOWN_OFFSET"]

UNKNOWN_OFFSET = -1


@dataclass(slots=True)
class FollowerState:
    """One follower as the leader has seen it in this epoch."""

    log_end_offset: int = UNKNOWN_OFFSET
    last_fetch_ms: int = -1
    last_fetch_leader_end: int = UNKNOWN_OFFSET  # the leader's LEO at that fetch
    last_caught_up_ms: int = -1
    # The broker epoch its latest read fetch said it has (Fetch v15+, KIP-903; -1: not
    # said): a fetch of a previous incarnation must not bring a restarted broker into the
    # ISR, since the new one may have lost what the old one had.
    broker_epoch: int = -1
    # Its log start offset as its latest read fetch said (-1: not said yet). The smallest
    # of the live replicas' is the partition's low watermark (DeleteRecords).
    log_start_offset: int = UNKNOWN_OFFSET


@dataclass(slots=True)
class IsrState:
    """The followers of one leader epoch. ``leader`` is this broker; ``isr`` the committed
    ISR (the leader included); ``pending`` the ISR proposed to the controller, if any."""

    leader: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    followers: dict[int, FollowerState] = field(default_factory=dict)
    pending: tuple[int, ...] | None = None

    @classmethod
    def reset(
        cls, leader: int, isr: tuple[int, ...], replicas: tuple[int, ...], now_ms: int
    ) -> IsrState:
        state = cls(leader, isr, replicas)
        for replica in replicas:
            if replica != leader:
                caught_up = now_ms if replica in isr else -1
                state.followers[replica] = FollowerState(last_caught_up_ms=caught_up)
        return state

    def update_membership(self, isr: tuple[int, ...], replicas: tuple[int, ...]) -> None:
        """A committed ISR (or replica set) in the same leader epoch; positions are kept."""
        self.isr, self.replicas = isr, replicas
        for replica in replicas:
            if replica != self.leader and replica not in self.followers:
                self.followers[replica] = FollowerState()
        for gone in [r for r in self.followers if r not in replicas]:
            del self.followers[gone]
        self.pending = None

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        if self.pending is None:
            return self.isr
        return self.isr + tuple(r for r in self.pending if r not in self.isr)

    # -- follower fetches ------------------------------------------------------------------
    def follower_fetched(
        self,
        replica: int,
        fetch_offset: int,
        leader_end_offset: int,
        now_ms: int,
        log_start_offset: int = UNKNOWN_OFFSET,
    ) -> bool:
        """Record a fetch of ``replica`` at ``fetch_offset`` (valid: at most the leader's
        log end), and the log start offset it said (-1, as in a Fetch request: not said, the
        one recorded stands). False if ``replica`` is not a follower of this partition."""
        state = self.followers.get(replica)
        if state is None:
            return False
        if fetch_offset >= leader_end_offset:
            state.last_caught_up_ms = max(state.last_caught_up_ms, now_ms)
        elif fetch_offset >= state.last_fetch_leader_end >= 0:
            state.last_caught_up_ms = max(state.last_caught_up_ms, state.last_fetch_ms)
        state.log_end_offset = fetch_offset
        if log_start_offset >= 0:
            state.log_start_offset = log_start_offset
        state.last_fetch_ms = now_ms
        state.last_fetch_leader_end = leader_end_offset
        return True

    def high_watermark(self, leader_end_offset: int) -> int:
        """The smallest log end offset in the maximal ISR (an unknown one counts as -1)."""
        low = leader_end_offset
        for replica in self.maximal_isr:
            if replica == self.leader:
                continue
            state = self.followers.get(replica)
            low = min(low, UNKNOWN_OFFSET if state is None else state.log_end_offset)
        return low

    def low_watermark(self, leader_log_start: int, alive: Callable[[int], bool]) -> int:
        """The smallest log start offset of the leader (``leader_log_start``) and of the
        followers ``alive`` says are up (Kafka's ``lowWatermarkIfLeader``; -1 while a live
        follower has not said its own): DeleteRecords is done where this reaches."""
        low = leader_log_start
        for replica, state in self.followers.items():
            if state.log_start_offset < low and alive(replica):
                low = state.log_start_offset
        return low

    # -- ISR changes -----------------------------------------------------------------------
    def ready_to_join(self, replica: int, high_watermark: int, epoch_start_offset: int) -> bool:
        """``replica`` is outside the ISR and has caught up enough to join it (Kafka's
        ``isFollowerInSync``: at least the HW and the start of this leader's epoch)."""
        state = self.followers.get(replica)
        return (
            state is not None
            and replica not in self.isr
            and state.log_end_offset >= max(high_watermark, epoch_start_offset)
        )

    def out_of_sync(self, now_ms: int, lag_time_max_ms: int) -> tuple[int, ...]:
        """ISR followers not caught up within ``lag_time_max_ms``."""
        late = []
        for replica in self.isr:
            if replica == self.leader:
                continue
            state = self.followers.get(replica)
            if state is None or now_ms - state.last_caught_up_ms > lag_time_max_ms:
                late.append(replica)
        return tuple(late)
