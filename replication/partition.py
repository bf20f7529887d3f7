"""One partition replica on this broker: its log, its place in the partition (leader or
follower, at which epochs), and the Kafka rules for appending to and reading from it.

How this works. The broker's replica manager applies each metadata image's ``PartitionState``
with ``make_leader`` or ``make_follower``; produce, fetch and list-offsets requests then call
``append_as_leader``, ``read`` and ``offsets_for_timestamp``, which check the request against
the replica's state (leadership, the client's leader epoch, acks, the ISR size) before they
touch the log, and turn storage errors into the typed errors of ``replication.errors``.

Roles and their legal transitions (an illegal one is a bug and raises InvariantViolation)::

    NEW       -> LEADER | FOLLOWER | STOPPED     first state from the image, or never served
    LEADER    -> LEADER | FOLLOWER | STOPPED     new epochs / ISR, leadership moved, removed
    FOLLOWER  -> LEADER | FOLLOWER | STOPPED
    STOPPED   (final: the topic was deleted or the replica moved away; its log is deleted)

A state whose partition epoch is older than the one applied is ignored (the image only moves
forward, but a caller could replay an old one); every role change is in memory only.

Leader epochs and the log's epoch cache. ``make_leader`` with a new leader epoch writes
nothing to disk: storage records ``(epoch, start offset)`` in the leader-epoch cache on the
first append stamped with that epoch (``Log.append_as_leader``). Kafka's ``makeLeader``
writes the entry at once, so that a follower asking for the end of an older epoch learns
where the new one starts even before anything is appended in it; ``end_offset_for_epoch``
gives that same answer from the start offset kept in memory (``leader_epoch_start_offset``),
so the difference is invisible to clients, and becoming leader of many partitions costs no
file writes.

High watermark and ISR. The leader keeps its followers' fetch positions (``replication.isr``):
the high watermark is the smallest log end offset in the ISR (never moving back), and moves
when a follower fetch reports a new position (``read_for_follower``) or the leader appends
with no other ISR member. An acks=-1 append waits for the HW to pass its last offset
(``await_commit``: a callback, so this module stays free of asyncio); it fails with
NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR falls below ``min_insync_replicas`` first, and
NOT_LEADER_OR_FOLLOWER if leadership moves. ISR changes are proposed through
``propose_isr`` (the broker sends AlterPartition) and take effect only when committed: from
the controller's answer (``isr_change_committed``) or the next metadata image.
A follower appends the leader's batches verbatim (``append_as_follower``), takes the HW from
the leader's answers, and truncates where the epochs say (``replication.follower``).
Transactions are not supported, so the last stable offset is the high watermark and a
read_committed fetch reads exactly what a read_uncommitted one does.

DeleteRecords (``delete_records``) moves the leader's log start offset up to at most the
HW; followers take it from the leader's fetch answers and say theirs in their fetches. The
request is done where the partition's *low watermark* reaches (``low_watermark``: the
smallest log start of the leader and its live followers); ``watch_low_watermark`` calls
back when it may have moved (a follower said a higher log start, or leadership ended).

Concurrency: not thread-safe. One owner (the broker's event loop) calls every method; the
log beneath has its own lock, so a later issue may move appends to a worker thread.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from replication.errors import (
    FencedLeaderEpoch,
    InvalidRequiredAcks,
    NotEnoughReplicas,
    NotEnoughReplicasAfterAppend,
    NotLeaderOrFollower,
    OffsetNotAvailable,
    OffsetOutOfRange,
    PolicyViolation,
    RecordListTooLarge,
    ReplicationError,
    UnknownLeaderEpoch,
    from_storage_error,
)
from replication.isr import IsrState
from storage.batch import validate_batch
from storage.config import LogConfig
from storage.epoch_cache import UNDEFINED_EPOCH, UNDEFINED_OFFSET
from storage.errors import StorageError, invariant
from storage.log import AppendInfo, FetchData, Isolation, Log
from storage.records import DecodedBatch, decode_batch

__all__ = [
    "EARLIEST_LOCAL_TIMESTAMP",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIERED_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "MAX_TIMESTAMP",
    "NO_LEADER_EPOCH",
    "VALID_ACKS",
    "AppendListener",
    "CommitCallback",
    "DEFAULT_REPLICA_LAG_TIME_MAX_MS",
    "DELETE_TO_HIGH_WATERMARK",
    "FollowerRead",
    "IsrProposer",
    "OffsetAndTimestamp",
    "Partition",
    "PartitionKey",
    "PartitionStateView",
    "ReplicaState",
    "Role",
    "check_current_leader_epoch",
    "check_min_insync",
    "check_required_acks",
    "end_offset_with_pending_epoch",
    "is_stale",
]

_log = logging.getLogger(__name__)

# ListOffsets' special timestamps (Kafka's ListOffsetsRequest).
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3  # KIP-734
EARLIEST_LOCAL_TIMESTAMP = -4  # KIP-405: no tiered storage here, so the same as earliest
LATEST_TIERED_TIMESTAMP = -5  # KIP-1005: nothing is tiered, so there is no such offset
NO_LEADER_EPOCH = -1  # a request's current leader epoch when the client does not check it
NO_TIMESTAMP = -1
VALID_ACKS = (-1, 0, 1)

PartitionKey = tuple[str, int]  # (topic name, partition id)
# Called with (key, bytes that became readable by consumers) when the high watermark moves,
# or (``on_log_append``) with the bytes a leader append added to the log.
AppendListener = Callable[[PartitionKey, int], None]
# An acks=-1 append's completion: None once committed, else the error that ends the wait.
CommitCallback = Callable[[ReplicationError | None], None]
# Sends a proposed ISR to the controller; False when it could not be sent now.
IsrProposer = Callable[["Partition", tuple[int, ...]], bool]
DEFAULT_REPLICA_LAG_TIME_MAX_MS = 30_000  # Kafka's replica.lag.time.max.ms
DELETE_TO_HIGH_WATERMARK = -1  # DeleteRecords' offset meaning "up to the high watermark"
MAX_UNEXPOSED_ENTRIES = 1024  # appends remembered until the HW passes them (bytes told)


class QuietWatch(Protocol):
    """A follower's fetch session watching a partition it found quiet for that follower
    (``read_for_quiet_follower``): the session stops looking at the partition, and the
    partition counts the follower as having fetched at its log end at every fetch of the
    session (``last_fetch_ms``) until it changes; then it calls ``disturbed`` once and
    forgets the watch. ``appended_bytes`` > 0: a leader append of that many bytes; 0: some
    other change the follower must hear (the HW, leadership, the ISR); ``leadership``: the
    partition changed leader or stopped, so a parked fetch should answer now."""

    @property
    def last_fetch_ms(self) -> int: ...

    def disturbed(self, appended_bytes: int, leadership: bool) -> None: ...


class PartitionStateView(Protocol):
    """What the replica reads of a metadata image's ``PartitionState`` (controller/image.py);
    a protocol, because replication does not import the controller."""

    @property
    def replicas(self) -> tuple[int, ...]: ...
    @property
    def isr(self) -> tuple[int, ...]: ...
    @property
    def leader(self) -> int: ...
    @property
    def leader_epoch(self) -> int: ...
    @property
    def partition_epoch(self) -> int: ...


class FollowerRead(NamedTuple):
    """A follower fetch's answer: the batches (``data``), or, when the follower's last
    fetched epoch disagrees with this log, the diverging ``(epoch, end offset)``."""

    data: FetchData | None
    diverging: tuple[int, int] | None


class OffsetAndTimestamp(NamedTuple):
    """A ListOffsets answer: the offset, the record's timestamp (-1 for earliest/latest), and
    the leader epoch that goes with the offset (-1 when unknown), which a consumer uses to
    validate its position after a reset (KIP-320)."""

    offset: int
    timestamp: int
    leader_epoch: int = UNDEFINED_EPOCH


class Role(enum.Enum):
    NEW = "new"
    LEADER = "leader"
    FOLLOWER = "follower"
    STOPPED = "stopped"


_TRANSITIONS: dict[Role, frozenset[Role]] = {
    Role.NEW: frozenset({Role.LEADER, Role.FOLLOWER, Role.STOPPED}),
    Role.LEADER: frozenset({Role.LEADER, Role.FOLLOWER, Role.STOPPED}),
    Role.FOLLOWER: frozenset({Role.LEADER, Role.FOLLOWER, Role.STOPPED}),
    Role.STOPPED: frozenset(),
}


# -- the pure part: epochs, acks and the high watermark ------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """The partition as the latest applied image has it."""

    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    @classmethod
    def of(cls, state: PartitionStateView) -> ReplicaState:
        return cls(
            state.leader,
            state.leader_epoch,
            state.partition_epoch,
            tuple(state.replicas),
            tuple(state.isr),
        )


def is_stale(current: ReplicaState | None, new: ReplicaState) -> bool:
    """Whether ``new`` is older than what was applied (an equal epoch is applied again)."""
    return current is not None and new.partition_epoch < current.partition_epoch


def check_current_leader_epoch(ours: int, theirs: int) -> None:
    """KIP-320: a request naming an older leader epoch is fenced (the client must refresh
    its metadata), one naming a newer epoch is early (this broker has not caught up)."""
    if theirs == NO_LEADER_EPOCH:
        return
    if theirs < ours:
        raise FencedLeaderEpoch(f"leader epoch {theirs} is older than the current {ours}")
    if theirs > ours:
        raise UnknownLeaderEpoch(f"leader epoch {theirs} is newer than the current {ours}")


def check_required_acks(required_acks: int) -> None:
    if required_acks not in VALID_ACKS:
        raise InvalidRequiredAcks(f"acks must be -1, 0 or 1, not {required_acks}")


def check_min_insync(required_acks: int, isr_size: int, min_insync_replicas: int) -> None:
    """acks=-1 is refused before anything is written while the ISR is too small."""
    if required_acks == -1 and isr_size < min_insync_replicas:
        raise NotEnoughReplicas(
            f"the ISR has {isr_size} replicas, below min.insync.replicas {min_insync_replicas}"
        )


def end_offset_with_pending_epoch(
    requested: int,
    from_cache: tuple[int, int],
    latest_cached: int | None,
    pending: tuple[int, int] | None,
    log_end_offset: int,
) -> tuple[int, int]:
    """Answer OffsetsForLeaderEpoch as if the leader's own epoch were in the epoch cache.

    ``from_cache`` is the cache's answer; ``pending`` is (leader epoch, its start offset)
    when this leader has not appended in its epoch yet (the cache does not hold it, see the
    module doc). Kafka's cache would hold it, and answers so: the requested epoch itself ends
    at the log end, a newer one is unknown, and any older one ends where ours starts unless a
    cached epoch above it ends it sooner."""
    if pending is None:
        return from_cache
    epoch, start = pending
    if requested == UNDEFINED_EPOCH or requested > epoch:
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    if requested == epoch:
        return epoch, log_end_offset
    if latest_cached is None:
        return requested, start  # older than every epoch known: ends where ours starts
    if requested >= latest_cached:
        return latest_cached, start
    return from_cache


# -- the replica ---------------------------------------------------------------------------------


class Partition:
    """One replica of ``topic``/``partition_id`` on broker ``local_broker_id``."""

    def __init__(
        self,
        topic: str,
        topic_id: bytes,
        partition_id: int,
        log: Log,
        *,
        local_broker_id: int,
        min_insync_replicas: int = 1,
        replica_lag_time_max_ms: int = DEFAULT_REPLICA_LAG_TIME_MAX_MS,
    ) -> None:
        if min_insync_replicas < 1:
            raise ValueError(f"min_insync_replicas must be at least 1, got {min_insync_replicas}")
        self.topic = topic
        self.topic_id = topic_id
        self.partition_id = partition_id
        self.key: PartitionKey = (topic, partition_id)
        self.log = log
        self.local_broker_id = local_broker_id
        self.min_insync_replicas = min_insync_replicas
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.role = Role.NEW
        self.state: ReplicaState | None = None
        # Where the current leader epoch starts (the LEO when this replica became its
        # leader); None when not leader. See the module doc on epochs.
        self.leader_epoch_start_offset: int | None = None
        self.on_append: list[AppendListener] = []  # the HW moved: consumers' long polls
        self.on_log_append: list[AppendListener] = []  # a leader append: followers' polls
        self.propose_isr: IsrProposer | None = None
        self._followers: IsrState | None = None  # when leader
        # Followers' sessions watching this partition as quiet for them, by replica id: the
        # fetches they skip here are noted when it matters (``_note_quiet_fetches``).
        self._quiet: dict[int, QuietWatch] = {}
        # acks=-1 appends waiting for the HW: (offset it must reach, callback), in order.
        self._waiting: deque[tuple[int, CommitCallback]] = deque()
        # Appended bytes not yet below the HW: (log end after the append, bytes), in order;
        # at most MAX_UNEXPOSED_ENTRIES (then the last entry takes the next appends).
        self._unexposed: deque[tuple[int, int]] = deque()
        # Called (then forgotten) when the low watermark may have moved: DeleteRecords
        # requests waiting for the followers (``watch_low_watermark``).
        self._low_watermark_watchers: set[Callable[[], None]] = set()

    def __repr__(self) -> str:
        epoch = self.leader_epoch
        return f"Partition({self.topic}-{self.partition_id}, {self.role.value}, epoch {epoch})"

    # -- state from the image ----------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    @property
    def leader_id(self) -> int:
        return -1 if self.state is None else self.state.leader

    @property
    def leader_epoch(self) -> int:
        return NO_LEADER_EPOCH if self.state is None else self.state.leader_epoch

    @property
    def partition_epoch(self) -> int:
        return -1 if self.state is None else self.state.partition_epoch

    @property
    def replicas(self) -> tuple[int, ...]:
        return () if self.state is None else self.state.replicas

    @property
    def isr(self) -> tuple[int, ...]:
        return () if self.state is None else self.state.isr

    def make_leader(self, state: PartitionStateView, *, now_ms: int) -> bool:
        """Lead the partition as ``state`` says; False (nothing changed) if it is stale. A new
        leader epoch forgets the followers' positions (``replication.isr``)."""
        new = ReplicaState.of(state)
        invariant(
            new.leader == self.local_broker_id,
            f"{self}: make_leader with leader {new.leader}, not this broker",
        )
        if is_stale(self.state, new):
            return False
        if self.role is not Role.LEADER or new.leader_epoch != self.leader_epoch:
            self._say_if_leading_without_committed_records()
            self.leader_epoch_start_offset = self.log.log_end_offset
            self._followers = IsrState.reset(new.leader, new.isr, new.replicas, now_ms)
            self._unexposed.clear()
            self._low_watermark_may_have_moved()
        elif self._followers is not None and (
            new.partition_epoch != self.partition_epoch
            or (new.isr, new.replicas) != (self.isr, self.replicas)
        ):
            # A newer partition epoch is the controller's word on the ISR: it ends any
            # proposal in flight (committed in it, or refused for naming an older epoch).
            self._followers.update_membership(new.isr, new.replicas)
        self._transition(Role.LEADER, new)
        self._after_isr_change()
        return True

    def _say_if_leading_without_committed_records(self) -> None:
        """A leader whose log lost committed records in an unclean shutdown (a power loss of
        the last in-sync replica, the case Kafka's KIP-966 handles by electing another
        replica): those records are gone for good, since the followers truncate to this
        log. Said loudly, once; nothing else can be done here."""
        log = self.log
        lost = log.committed_end_before_crash
        if lost is None:
            return
        if log.log_end_offset < lost:
            _log.error(
                "%r leads with log end %d, below the high watermark %d it had before an "
                "unclean shutdown: committed records [%d, %d), acknowledged to acks=all "
                "producers, are lost (no other in-sync replica had them)",
                self,
                log.log_end_offset,
                lost,
                log.log_end_offset,
                lost,
            )
        log.committed_end_before_crash = None

    def make_follower(self, state: PartitionStateView) -> bool:
        """Follow the partition's leader (or wait for one: leader -1); False if stale. The log
        is not truncated here: the fetcher does it from the epochs (``replication.follower``)."""
        new = ReplicaState.of(state)
        invariant(
            new.leader != self.local_broker_id and self.local_broker_id in new.replicas,
            f"{self}: make_follower with leader {new.leader}, replicas {new.replicas}",
        )
        if is_stale(self.state, new):
            return False
        self._stop_leading(new.leader, new.leader_epoch)
        self._transition(Role.FOLLOWER, new)
        return True

    def stop(self) -> None:
        """Stop serving for good (the topic is gone or the replica moved away): every later
        request is NOT_LEADER_OR_FOLLOWER. The owner deletes the log afterwards."""
        if self.role is not Role.STOPPED:
            self._transition(Role.STOPPED, self.state)
        self._stop_leading(-1, self.leader_epoch)

    def _stop_leading(self, leader: int, epoch: int) -> None:
        self.leader_epoch_start_offset = None
        self._followers = None
        self._unexposed.clear()
        self._low_watermark_may_have_moved()
        if self._waiting:
            error = NotLeaderOrFollower(
                f"{self.topic}-{self.partition_id}: leadership moved to broker {leader} "
                f"(epoch {epoch}) before the append was committed"
            )
            self._fail_waiting(error)

    def update_config(self, config: LogConfig, min_insync_replicas: int) -> None:
        """A topic config change: limits apply from the next call (index sizes from the next
        segment, since open segments keep their pre-allocated indexes)."""
        if min_insync_replicas < 1:
            raise ValueError(f"min_insync_replicas must be at least 1, got {min_insync_replicas}")
        self.log.config = config
        self.min_insync_replicas = min_insync_replicas

    def _transition(self, role: Role, state: ReplicaState | None) -> None:
        invariant(
            role in _TRANSITIONS[self.role], f"{self}: illegal transition {self.role} -> {role}"
        )
        leadership = role is not self.role or self.leader_epoch != (
            NO_LEADER_EPOCH if state is None else state.leader_epoch
        )
        self._release_quiet(0, leadership=leadership)
        self.role = role
        self.state = state

    # -- requests ------------------------------------------------------------------------------
    def check_leader_epoch(self, current_leader_epoch: int) -> None:
        """FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH for a stale / early client epoch
        (-1: the client does not check)."""
        check_current_leader_epoch(self.leader_epoch, current_leader_epoch)

    def _require_leader(self, current_leader_epoch: int = NO_LEADER_EPOCH) -> None:
        # Kafka's order: the epoch first (it tells the client more), then leadership.
        if current_leader_epoch != NO_LEADER_EPOCH:
            self.check_leader_epoch(current_leader_epoch)
        if self.role is not Role.LEADER:
            raise NotLeaderOrFollower(
                f"broker {self.local_broker_id} is not the leader of {self.topic}-"
                f"{self.partition_id} (leader {self.leader_id}, epoch {self.leader_epoch})"
            )

    def append_as_leader(
        self, data: bytes | bytearray | memoryview, required_acks: int
    ) -> AppendInfo:
        """Append a produce request's batches for this partition; the log assigns offsets
        and stamps the leader epoch. Checks, in Kafka's order: acks, leadership, the ISR
        size for acks=-1, the request size; a failed check or a refused batch appends
        nothing. The high watermark then moves (module doc) and ``on_append`` hears of it."""
        check_required_acks(required_acks)
        self._require_leader()
        check_min_insync(required_acks, len(self.isr), self.min_insync_replicas)
        size, segment_bytes = memoryview(data).nbytes, self.log.config.segment_bytes
        if size > segment_bytes:
            raise RecordListTooLarge(
                f"a {size}-byte produce request exceeds the segment size {segment_bytes}"
            )
        self._release_quiet(size)
        try:
            info = self.log.append_as_leader(data, self.leader_epoch)
        except StorageError as e:
            raise from_storage_error(e) from e
        if not info.duplicate:
            end, size, unexposed = self.log.log_end_offset, info.size_bytes, self._unexposed
            if len(unexposed) >= MAX_UNEXPOSED_ENTRIES:
                # The HW is stuck (a follower gone, no controller to shrink the ISR): the
                # last entry grows instead of the queue; its bytes are told a little later.
                size += unexposed.pop()[1]
            unexposed.append((end, size))
            for listener in self.on_log_append:
                listener(self.key, info.size_bytes)
        self._maybe_advance_high_watermark()
        return info

    def await_commit(self, info: AppendInfo, callback: CommitCallback) -> Callable[[], None]:
        """Call ``callback(None)`` once the high watermark passes ``info``'s last offset (at
        once if it has), or ``callback(error)`` when the wait fails (module doc). The
        caller bounds the wait with its own timeout, and then calls the function returned,
        which forgets the wait (the callback is not called, nothing is kept for it). An
        append already committed is judged as a waiting one is when its commit comes
        (Kafka's checkEnoughReplicasReachOffset): by an ISR below the minimum it is
        NOT_ENOUGH_REPLICAS_AFTER_APPEND, since the ISR may have shrunk between the append
        and this call."""
        if not self.is_leader:
            callback(NotLeaderOrFollower(f"{self}: no longer the leader"))
        elif info.last_offset < self.high_watermark:
            followers = self._followers
            callback(None if followers is None else self._isr_too_small(len(followers.maximal_isr)))
        else:
            entry = (info.last_offset + 1, callback)
            self._waiting.append(entry)
            return lambda: self._forget_wait(entry)
        return _nothing_to_forget

    def _forget_wait(self, entry: tuple[int, CommitCallback]) -> None:
        # Rare (a timed-out acks=-1 produce), so a linear search of the waiting appends.
        if entry in self._waiting:
            self._waiting.remove(entry)

    def _maybe_advance_high_watermark(self) -> bool:
        """Move the HW to the smallest log end offset in the ISR; wake what it commits."""
        followers, log = self._followers, self.log
        if followers is None:
            return False
        try:
            moved = log.maybe_increment_high_watermark(followers.high_watermark(log.log_end_offset))
        except StorageError as e:
            raise from_storage_error(e) from e
        if not moved:
            return False
        self._release_quiet(0)  # the followers must hear the new HW
        hw, exposed, unexposed = log.high_watermark, 0, self._unexposed
        while unexposed and unexposed[0][0] <= hw:
            exposed += unexposed.popleft()[1]
        if exposed:
            for listener in self.on_append:
                listener(self.key, exposed)
        waiting = self._waiting
        if waiting and waiting[0][0] <= hw:
            # Kafka's rule: committed, but by an ISR below the minimum is still an error.
            error = self._isr_too_small(len(followers.maximal_isr))
            while waiting and waiting[0][0] <= hw:
                waiting.popleft()[1](error)
        return True

    def _isr_too_small(self, isr_size: int) -> NotEnoughReplicasAfterAppend | None:
        if isr_size >= self.min_insync_replicas:
            return None
        return NotEnoughReplicasAfterAppend(
            f"the ISR has {isr_size} replicas, below min.insync.replicas "
            f"{self.min_insync_replicas}, since the append"
        )

    def _fail_waiting(self, error: ReplicationError) -> None:
        waiting, self._waiting = self._waiting, deque()
        for _, callback in waiting:
            callback(error)

    def read(
        self,
        fetch_offset: int,
        max_bytes: int,
        *,
        current_leader_epoch: int = NO_LEADER_EPOCH,
        isolation: Isolation | str = Isolation.HIGH_WATERMARK,
        min_one_batch: bool = True,
    ) -> FetchData:
        """A zero-copy slice of batches from ``fetch_offset``: up to the high watermark for
        a consumer (read_committed too: LSO = HW, no transactions), the log end for
        ``isolation="log_end"``. Served by the leader only; a follower's fetch goes through
        ``read_for_follower``, which also records its position."""
        self._require_leader(current_leader_epoch)
        try:
            return self.log.read(
                fetch_offset, max_bytes, isolation=Isolation(isolation), min_one_batch=min_one_batch
            )
        except StorageError as e:
            raise from_storage_error(e) from e

    # -- the leader's followers -------------------------------------------------------------
    def read_for_follower(
        self,
        replica_id: int,
        fetch_offset: int,
        max_bytes: int,
        *,
        last_fetched_epoch: int,
        current_leader_epoch: int,
        now_ms: int,
        min_one_batch: bool = True,
        broker_epoch: int = -1,
        log_start_offset: int = -1,
    ) -> FollowerRead:
        """A follower's fetch: the diverging epoch if its last fetched epoch does not end at
        or after ``fetch_offset`` here (KIP-320: nothing read, its position not taken),
        else the batches from ``fetch_offset`` to the log end. The fetch offset is the
        follower's log end: it may move the HW and let the follower join the ISR, as the
        incarnation of ``broker_epoch`` (what the fetch says, -1 if nothing; the proposal's
        sender checks it against the metadata: ``follower_broker_epoch``). The follower's
        ``log_start_offset`` (-1: not said) feeds the low watermark."""
        self._require_leader(current_leader_epoch)
        if self._quiet:
            self._quiet.pop(replica_id, None)  # read afresh: its session watches no more
        followers = self._followers
        if followers is None or replica_id not in followers.followers:
            raise NotLeaderOrFollower(
                f"broker {replica_id} is not a follower of {self.topic}-{self.partition_id} "
                f"(replicas {self.replicas})"
            )
        log = self.log
        log_end = log.log_end_offset
        diverging = self._diverging(last_fetched_epoch, fetch_offset)
        if diverging is not None:
            return FollowerRead(None, diverging)
        if fetch_offset == log_end and log.log_start_offset <= fetch_offset:
            # Caught up: nothing to read (most partitions of most fetches).
            hw, start = log.high_watermark, log.log_start_offset
            data = FetchData(None, fetch_offset, hw, start, log_end)
        else:
            try:
                data = log.read(
                    fetch_offset,
                    max_bytes,
                    isolation=Isolation.LOG_END,
                    min_one_batch=min_one_batch,
                )
            except StorageError as e:
                raise from_storage_error(e) from e
        state = followers.followers[replica_id]
        moved = state.log_end_offset != fetch_offset
        start_before = state.log_start_offset
        followers.follower_fetched(replica_id, fetch_offset, log_end, now_ms, log_start_offset)
        state.broker_epoch = broker_epoch
        if state.log_start_offset > start_before:
            self._low_watermark_may_have_moved()
        if moved:  # the HW depends on the followers' positions only
            self._maybe_advance_high_watermark()
        if (
            replica_id not in self.isr  # joining is checked at every fetch: the HW may have
            and followers.pending is None  # reached this follower meanwhile, or a refused
            and followers.ready_to_join(  # proposal may be due again
                replica_id, self.high_watermark, self.leader_epoch_start_offset or 0
            )
        ):
            self._propose_isr((*self.isr, replica_id))
        return FollowerRead(data, None)

    # -- DeleteRecords -------------------------------------------------------------------
    def delete_records(self, offset: int) -> int:
        """Move the log start offset up to ``offset`` (-1: the high watermark), as Kafka's
        ``deleteRecordsOnLeader``; returns the log start offset after it. Refused: not the
        leader (NOT_LEADER_OR_FOLLOWER), a topic whose cleanup.policy lacks "delete"
        (POLICY_VIOLATION), an offset below -1 or above the HW (OFFSET_OUT_OF_RANGE). An
        offset at or below the log start changes nothing. The followers' sessions stop
        treating the partition as quiet, so they hear the new log start."""
        self._require_leader()
        log = self.log
        if not log.config.delete:
            raise PolicyViolation(
                f"records of {self.topic}-{self.partition_id} cannot be deleted: its "
                "cleanup.policy does not include delete"
            )
        target = log.high_watermark if offset == DELETE_TO_HIGH_WATERMARK else offset
        if target < 0:
            raise OffsetOutOfRange(f"cannot delete records below offset {offset}")
        try:
            moved = log.maybe_increment_log_start_offset(target)
        except StorageError as e:
            raise from_storage_error(e) from e
        if moved:
            self._release_quiet(0)
        return log.log_start_offset

    def low_watermark(self, alive: Callable[[int], bool]) -> int:
        """The smallest log start offset of this leader and the followers ``alive`` says are
        up (-1 while such a follower has not said its own since this epoch began)."""
        self._require_leader()
        followers = self._followers
        start = self.log.log_start_offset
        return start if followers is None else followers.low_watermark(start, alive)

    def watch_low_watermark(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` once, when the low watermark may have moved or leadership ended;
        returns what forgets it (a request that timed out or was cancelled)."""
        self._low_watermark_watchers.add(callback)
        return lambda: self._low_watermark_watchers.discard(callback)

    def _low_watermark_may_have_moved(self) -> None:
        watchers = self._low_watermark_watchers
        if watchers:
            self._low_watermark_watchers = set()
            for callback in watchers:
                callback()

    def follower_broker_epoch(self, replica_id: int) -> int:
        """The broker epoch the latest fetch of follower ``replica_id`` read here said it
        has (-1: it said none, or none was read in this leader epoch)."""
        followers = self._followers
        state = None if followers is None else followers.followers.get(replica_id)
        return -1 if state is None else state.broker_epoch

    def diverging_epoch(
        self,
        fetch_offset: int,
        last_fetched_epoch: int,
        *,
        current_leader_epoch: int = NO_LEADER_EPOCH,
    ) -> tuple[int, int] | None:
        """A consumer's fetch with a last fetched epoch (Fetch v12+): the diverging
        ``(epoch, end offset)`` when that epoch does not end at or after ``fetch_offset``
        here, which the fetch answers instead of records (Kafka's Partition.readRecords
        checks every fetch that sets it, a consumer's as a follower's); else None. An
        epoch whose end is unknown here (later than any this log has) is OFFSET_OUT_OF_RANGE,
        as in Kafka."""
        self._require_leader(current_leader_epoch)
        diverging = self._diverging(last_fetched_epoch, fetch_offset)
        if diverging is not None and (
            diverging[0] == UNDEFINED_EPOCH or diverging[1] == UNDEFINED_OFFSET
        ):
            raise OffsetOutOfRange(
                f"{self.topic}-{self.partition_id}: the end of last fetched epoch "
                f"{last_fetched_epoch} is unknown here"
            )
        return diverging

    def _diverging(self, last_fetched_epoch: int, fetch_offset: int) -> tuple[int, int] | None:
        """KIP-320: where the fetcher's log leaves this one, or None (-1: it does not say)."""
        if last_fetched_epoch < 0:
            return None
        log = self.log
        # The last fetched epoch is the latest here and the fetcher is not past our end:
        # that epoch ends at our log end, so nothing diverges (the common case, cheaply).
        if last_fetched_epoch == log.epoch_cache.latest_epoch and fetch_offset <= (
            log.log_end_offset
        ):
            return None
        epoch, end = self.end_offset_for_epoch(last_fetched_epoch)
        if epoch < last_fetched_epoch or end < fetch_offset:
            return epoch, end
        return None

    def read_for_quiet_follower(
        self,
        replica_id: int,
        fetch_offset: int,
        *,
        last_fetched_epoch: int,
        current_leader_epoch: int,
        now_ms: int,
        watch: QuietWatch | None = None,
        log_start_offset: int = -1,
    ) -> bool:
        """``read_for_follower`` of an ISR follower caught up at our log end, cheaply: True
        (the fetch noted, as that would) when this replica leads at ``current_leader_epoch``,
        the follower's last fetched epoch is our latest (or none, on an empty log) and its
        position (and ``log_start_offset``, if said) is our log end and unchanged, so there is
        nothing to read, diverge on, or move (HW, ISR, low watermark); False, with nothing
        done, otherwise. Most partitions of a follower's
        incremental fetch are so. With ``watch``, a True also starts the watch (replacing
        the follower's previous one): its session may skip this partition until it is
        ``disturbed``."""
        state, followers, log = self.state, self._followers, self.log
        if (
            self.role is not Role.LEADER
            or state is None
            or followers is None
            or current_leader_epoch != state.leader_epoch
            or fetch_offset != log.log_end_offset
            or (last_fetched_epoch >= 0 and last_fetched_epoch != log.epoch_cache.latest_epoch)
            or replica_id not in state.isr
        ):
            return False
        follower = followers.followers.get(replica_id)
        if (
            follower is None
            or follower.log_end_offset != fetch_offset
            or (log_start_offset >= 0 and follower.log_start_offset != log_start_offset)
        ):
            return False
        followers.follower_fetched(replica_id, fetch_offset, fetch_offset, now_ms)
        if watch is not None:
            self._quiet[replica_id] = watch
        return True

    def _note_quiet_fetches(self) -> None:
        """Note the fetches the watching sessions skipped: each was one at our log end,
        unchanged since the watch began (any change ends it), so the follower was caught up
        at its session's latest fetch."""
        followers = self._followers
        if followers is None:
            return
        log_end = self.log.log_end_offset
        for replica_id, watch in self._quiet.items():
            state = followers.followers.get(replica_id)
            if state is not None and state.log_end_offset == log_end:
                followers.follower_fetched(replica_id, log_end, log_end, watch.last_fetch_ms)

    def _release_quiet(self, appended_bytes: int, *, leadership: bool = False) -> None:
        """Something a follower must hear is about to change: note the watched fetches as
        they stand, then end every watch (their sessions look at this partition again)."""
        if not self._quiet:
            return
        self._note_quiet_fetches()
        watches = list(self._quiet.values())
        self._quiet.clear()
        for watch in watches:
            watch.disturbed(appended_bytes, leadership)

    def maybe_shrink_isr(self, now_ms: int) -> tuple[int, ...]:
        """Propose an ISR without the followers not caught up within
        ``replica_lag_time_max_ms``; returns them (empty: nothing proposed)."""
        followers = self._followers
        if followers is None or followers.pending is not None:
            return ()
        if self._quiet:
            self._note_quiet_fetches()
        late = followers.out_of_sync(now_ms, self.replica_lag_time_max_ms)
        if late and not self._propose_isr(tuple(r for r in self.isr if r not in late)):
            return ()
        return late

    def _propose_isr(self, isr: tuple[int, ...]) -> bool:
        followers, propose = self._followers, self.propose_isr
        if followers is None or propose is None or not propose(self, isr):
            return False
        followers.pending = isr
        return True

    def isr_change_committed(
        self, state: PartitionStateView, now_ms: int, proposed: tuple[int, ...]
    ) -> None:
        """The controller's answer to the proposal of ``proposed``: the partition as it is
        committed (applied now, before the image has it). An answer to an older proposal
        applies too if its state is newer, and ends only the proposal it answers."""
        if state.leader == self.local_broker_id and state.leader_epoch == self.leader_epoch:
            self.make_leader(state, now_ms=now_ms)  # a newer partition epoch ends the proposal
        followers = self._followers
        if followers is not None and followers.pending == proposed and tuple(state.isr) == self.isr:
            followers.pending = None  # the answer of a change already made
            self._maybe_advance_high_watermark()

    def isr_change_failed(self, proposed: tuple[int, ...], partition_epoch: int) -> None:
        """The proposal of ``proposed`` at ``partition_epoch`` was refused for good (nothing
        was written: the controller found a member ineligible, or the request malformed):
        the next fetch or check may propose again. Call this only when the controller is
        known not to have committed it; a lost answer is not such a refusal."""
        followers = self._followers
        if (
            followers is not None
            and followers.pending == proposed
            and self.partition_epoch == partition_epoch
        ):
            followers.pending = None
            self._maybe_advance_high_watermark()  # a joiner no longer holds the HW back

    def proposal_pending(self, proposed: tuple[int, ...], partition_epoch: int) -> bool:
        """Whether the proposal of ``proposed`` at ``partition_epoch`` still waits for an
        answer (this replica leads, at that partition epoch, with that proposal)."""
        return self.pending_isr == proposed and self.partition_epoch == partition_epoch

    @property
    def pending_isr(self) -> tuple[int, ...] | None:
        return None if self._followers is None else self._followers.pending

    def _after_isr_change(self) -> None:
        """A shrink may commit what waited for the removed replica; one below the minimum
        fails the acks=-1 appends still waiting (Kafka checks it as they complete)."""
        if self.role is not Role.LEADER:
            return
        self._maybe_advance_high_watermark()
        error = self._isr_too_small(len(self.isr))
        if self._waiting and error is not None:
            self._fail_waiting(error)

    # -- the follower's side -------------------------------------------------------------------
    def fetch_position(self) -> tuple[int, int]:
        """(fetch offset = the log end, the epoch of the last batch or -1) for a follower."""
        latest = self.log.epoch_cache.latest_epoch
        return self.log.log_end_offset, -1 if latest is None else latest

    def append_as_follower(
        self,
        data: bytes | bytearray | memoryview,
        leader_high_watermark: int,
        leader_log_start_offset: int,
    ) -> AppendInfo | None:
        """Append the leader's batches verbatim (none: just the offsets), then take the
        leader's HW (up to this log's end) and log start (up to the HW)."""
        self._require_follower()
        log = self.log
        try:
            view = memoryview(data)
            if view.nbytes and log.log_end_offset == log.log_start_offset:
                self._start_at_first_batch(view)
            info = log.append_as_follower(view) if view.nbytes else None
            log.update_high_watermark(leader_high_watermark)
            start = min(leader_log_start_offset, log.high_watermark)
            if start > log.log_start_offset:
                log.maybe_increment_log_start_offset(start)
        except StorageError as e:
            raise from_storage_error(e) from e
        return info

    def _start_at_first_batch(self, data: memoryview) -> None:
        """This empty log starts inside the leader's first batch (the leader's log start lies
        inside a batch, after a DeleteRecords, and this follower restarted at it): start it
        at that batch's base offset instead, so the batch can be appended whole, as Kafka's
        follower does (``Partition.appendRecordsToFollowerOrFutureReplica``); the log start
        moves back up to the leader's after the append. The batch is checked whole (CRC
        too) first: a corrupt one must not move the log; the append then refuses it."""
        try:
            first = validate_batch(data)
        except StorageError:
            return
        end = self.log.log_end_offset
        if first.base_offset < end <= first.base_offset + first.last_offset_delta:
            self.log.truncate_fully_and_start_at(first.base_offset)

    def truncate_to(self, offset: int) -> bool:
        """Drop everything at and above ``offset`` (a follower's divergence)."""
        self._require_follower()
        try:
            return self.log.truncate_to(offset)
        except StorageError as e:
            raise from_storage_error(e) from e

    def restart_at(self, offset: int) -> None:
        """Drop the whole log and start empty at ``offset`` (the leader's log start passed
        this follower's log end)."""
        self._require_follower()
        try:
            self.log.truncate_fully_and_start_at(offset)
        except StorageError as e:
            raise from_storage_error(e) from e

    def _require_follower(self) -> None:
        if self.role is not Role.FOLLOWER:
            raise NotLeaderOrFollower(f"{self}: not a follower")

    def offsets_for_timestamp(
        self,
        timestamp: int,
        *,
        current_leader_epoch: int = NO_LEADER_EPOCH,
        isolation: Isolation | str = Isolation.HIGH_WATERMARK,
    ) -> OffsetAndTimestamp | None:
        """ListOffsets on the leader. -2 (earliest): (log start, -1); -1 (latest): (the high
        watermark, or the log end for ``isolation="log_end"``, -1); -3 (max timestamp): the
        record with the largest timestamp; a timestamp >= 0: the first record whose
        timestamp is at least that, found through the time index. None when there is no
        such record below the bound (the handler answers offset -1).

        The leader epoch answered is Kafka's: for earliest, the epoch of the epoch cache's
        first entry if it covers the log start (UnifiedLog.fetchOffsetByTimestamp), else -1;
        for latest, this replica's current leader epoch (Partition.fetchOffsetForTimestamp);
        for a record found, the partition leader epoch of the batch holding it (-1 if the
        batch has none).

        A consumer's lookup (the high watermark bounds it) raises OffsetNotAvailable while
        this new leader's high watermark is below the start of its epoch, for "latest" and
        for a lookup finding nothing below the high watermark, as Kafka does: answering the
        lagging high watermark could send a consumer resetting to the end back over records
        it has read. "earliest" is answered all the same."""
        self._require_leader(current_leader_epoch)
        log = self.log
        bound = log.high_watermark
        consumer = Isolation(isolation) is Isolation.HIGH_WATERMARK
        if not consumer:
            bound = log.log_end_offset
        if timestamp in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
            return OffsetAndTimestamp(log.log_start_offset, NO_TIMESTAMP, self._earliest_epoch())
        if timestamp == LATEST_TIERED_TIMESTAMP:
            return None
        if timestamp == LATEST_TIMESTAMP:
            if consumer:
                self._check_high_watermark_caught_up()
            return OffsetAndTimestamp(bound, NO_TIMESTAMP, self.leader_epoch)
        try:
            found = self._max_timestamp() if timestamp == MAX_TIMESTAMP else self._search(timestamp)
        except StorageError as e:
            raise from_storage_error(e) from e
        if found is not None and found.offset < bound:
            return found
        if consumer:
            self._check_high_watermark_caught_up()
        return None

    def _check_high_watermark_caught_up(self) -> None:
        start = self.leader_epoch_start_offset
        if start is not None and start > self.log.high_watermark:
            raise OffsetNotAvailable(
                f"{self.topic}-{self.partition_id}: leader epoch {self.leader_epoch} starts at "
                f"offset {start}, and the high watermark ({self.log.high_watermark}) is still "
                "below it"
            )

    def _earliest_epoch(self) -> int:
        """The epoch of the log start offset: the first cached epoch, if it starts at or
        below the log start (it may not for batches written without an epoch)."""
        first = self.log.epoch_cache.earliest_entry
        if first is None or first.start_offset > self.log.log_start_offset:
            return UNDEFINED_EPOCH
        return first.epoch

    def _search(self, timestamp: int) -> OffsetAndTimestamp | None:
        found = self.log.offset_for_timestamp(timestamp)
        if found is None:
            return None
        batch_offset, batch_max_timestamp = found
        # The index finds the batch; Kafka answers with the record inside it.
        batch = self._batch_at(batch_offset)
        if batch is None:
            return OffsetAndTimestamp(batch_offset, batch_max_timestamp)
        epoch = _batch_epoch(batch)
        record = next(
            (r for r in batch.records if r.offset >= batch_offset and r.timestamp >= timestamp),
            None,
        )
        if record is None:  # a batch whose header max timestamp disagrees with its records
            return OffsetAndTimestamp(batch_offset, batch_max_timestamp, epoch)
        return OffsetAndTimestamp(record.offset, record.timestamp, epoch)

    def _max_timestamp(self) -> OffsetAndTimestamp | None:
        """KIP-734 from the segments' own (max timestamp, its batch's last offset): the first
        segment holding the largest, then the first record of that batch carrying it.

        As exact as the segments' figures: exact for rolled segments and for anything
        appended since start-up; after a restart the active segment's figure comes from its
        sparse time index, so a later record with a larger timestamp may be missed until the
        segment rolls (Kafka writes the final time-index entry on close; storage does not)."""
        best = None
        for segment in self.log.segments:
            if segment.max_timestamp >= 0 and (
                best is None or segment.max_timestamp > best.max_timestamp
            ):
                best = segment
        if best is None:
            return None
        max_timestamp, last_offset = best.max_timestamp, best.offset_of_max_timestamp
        batch = self._batch_at(last_offset)
        if batch is None:
            return OffsetAndTimestamp(last_offset, max_timestamp)
        record = next((r for r in batch.records if r.timestamp == max_timestamp), None)
        offset = last_offset if record is None else record.offset
        return OffsetAndTimestamp(offset, max_timestamp, _batch_epoch(batch))

    def _batch_at(self, offset: int) -> DecodedBatch | None:
        """The batch holding ``offset``, decoded (within the log's decompression limit)."""
        data = self.log.read(offset, 1, isolation=Isolation.LOG_END, min_one_batch=True)
        if data.slice is None:
            return None
        # Decoding gives LogAppendTime batches' records the append time, so they match too.
        return decode_batch(
            data.slice.read(), max_uncompressed_bytes=self.log.config.max_decompressed_batch_bytes
        )

    def end_offset_for_epoch(self, leader_epoch: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch on the leader: (the largest epoch <= ``leader_epoch`` this
        log knows, where it ends), or (-1, -1). Includes the current epoch even before its
        first append (module doc)."""
        self._require_leader()
        log = self.log
        latest = log.epoch_cache.latest_epoch
        pending = None
        if self.leader_epoch_start_offset is not None and (
            latest is None or latest < self.leader_epoch
        ):
            pending = (self.leader_epoch, self.leader_epoch_start_offset)
        return end_offset_with_pending_epoch(
            leader_epoch,
            log.end_offset_for_epoch(leader_epoch),
            latest,
            pending,
            log.log_end_offset,
        )

    # -- offsets -------------------------------------------------------------------------------
    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def last_stable_offset(self) -> int:
        """No transactions: nothing is pending below the high watermark."""
        return self.log.high_watermark

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset


def _batch_epoch(batch: DecodedBatch) -> int:
    """The batch's partition leader epoch, or -1 for a batch written without one."""
    epoch = batch.header.partition_leader_epoch
    return epoch if epoch >= 0 else UNDEFINED_EPOCH


def _nothing_to_forget() -> None:
    """``await_commit``'s answer when the wait ended at once."""
