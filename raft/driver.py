"""The asyncio shell around the Raft core: it owns the core's deadlines, carries out each
Ready in order (quorum state, log write + fsync, sends, commits, log deletion) and offers the
API the state machine above uses.

One task runs the loop: wait for a message or the core's next deadline, call the core, apply
the Ready. Committed records go to the state machine a chunk at a time
(``APPLY_CHUNK_RECORDS``): the first chunk within the Ready, the rest from a second task that
takes the lock chunk by chunk, so the loop keeps answering while a huge commit is applied.
Proposals wait in a queue that the loop hands to the core in one call (everything proposed
while the previous Ready was being carried out is written together, in batches within
``max_batch_bytes``, as KRaft's accumulator does; see ``RaftCore.propose_all``). The loop
and snapshots call the core under one lock, so the core sees one caller at a time and every
Ready is complete before the next call, as the core assumes.
Blocking file work (fsync) runs in a worker thread so the loop keeps serving.
Received messages wait in an inbox bounded by count (``MAX_INBOX_MESSAGES``) and by their
estimated size in memory (``max_inbox_bytes``, ``envelope_bytes``); one that does not fit is
dropped (Raft tolerates a lost message), counted, and logged at most every
``LOG_INTERVAL_S`` (``raft.log_throttle``). An inbox holding nothing takes any message, so
one larger than the bound is never refused for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from raft.core import NotLeader, RaftConfig, RaftCore, RecordTooLarge, decode_records
from raft.log_store import RaftLogStore
from raft.log_throttle import LogThrottle, more
from raft.messages import (
    Envelope,
    FetchResponse,
    FetchSnapshotResponse,
    Ready,
    SnapshotId,
)
from raft.quorum_state import QuorumStateStore
from raft.snapshots import SnapshotStore

__all__ = [
    "NotLeader",
    "RaftNode",
    "RaftNodeConfig",
    "RecordTooLarge",
    "StateMachine",
    "Transport",
    "envelope_bytes",
]

_log = logging.getLogger(__name__)
APPLY_CHUNK_RECORDS = 2_000  # committed records applied before the Raft loop may run again
MAX_INBOX_MESSAGES = 10_000  # received messages (and wake-ups) waiting for the loop
# What a received message holds in memory besides its record or snapshot bytes, rounded up
# from tracemalloc on decoded envelopes (Python 3.11): about 170-220 bytes for the envelope
# and its payload, about 180 more for each batch.
ENVELOPE_BASE_BYTES = 256
BATCH_BASE_BYTES = 192


def envelope_bytes(envelope: Envelope) -> int:
    """An estimate of the memory ``envelope`` holds: its batches' or snapshot chunk's bytes
    plus a fixed cost per object. Cheap (no encoding): a loop over a fetch answer's batches."""
    payload = envelope.payload
    if isinstance(payload, FetchResponse):
        batches = payload.batches
        data = sum([len(b.data) for b in batches])  # a list is quicker to sum than a generator
        return ENVELOPE_BASE_BYTES + BATCH_BASE_BYTES * len(batches) + data
    if isinstance(payload, FetchSnapshotResponse):
        return ENVELOPE_BASE_BYTES + len(payload.chunk)
    return ENVELOPE_BASE_BYTES


class StateMachine(Protocol):
    """What runs on top of the log: fed committed records in offset order."""

    def apply(self, offset: int, record: bytes) -> None: ...

    def snapshot(self) -> bytes: ...

    def restore(self, data: bytes) -> None: ...


class Transport(Protocol):
    """Best-effort delivery of envelopes between nodes (see raft/transport.py)."""

    async def send(self, envelope: Envelope) -> None: ...

    def set_receiver(self, callback: Callable[[Envelope], None]) -> None: ...

    def set_unreachable_listener(self, callback: Callable[[int], None]) -> None: ...


@dataclass(frozen=True, slots=True)
class RaftNodeConfig:
    node_id: int
    voters: frozenset[int]
    data_dir: Path
    raft: RaftConfig = field(default_factory=RaftConfig)
    snapshot_interval_records: int = 10_000  # snapshot after this many applied records
    snapshot_interval_bytes: int = 2**62  # ... or after this many bytes of applied records
    snapshot_interval_ms: int = 2**62  # ... or this long after the last one, if anything new
    max_pending_proposals: int = 10_000  # proposals awaiting commit before propose waits
    # Received messages waiting for the loop, by ``envelope_bytes``; more are dropped. A node
    # takes it from ``raft_transport.max_inbox_bytes``.
    max_inbox_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in (
            "snapshot_interval_records",
            "snapshot_interval_bytes",
            "max_pending_proposals",
            "max_inbox_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class RaftNode:
    """One Raft voter or observer. Use from one event loop."""

    def __init__(
        self, config: RaftNodeConfig, transport: Transport, state_machine: StateMachine
    ) -> None:
        self.config = config
        self._transport = transport
        self._machine = state_machine
        directory = config.data_dir
        directory.mkdir(parents=True, exist_ok=True)
        self._quorum_store = QuorumStateStore(directory)
        self._snapshots = SnapshotStore(directory / "snapshots")
        self._log = RaftLogStore(directory)
        # None: tick; an int: the transport says that node is unreachable
        # (a message, its envelope_bytes); an int: that node is unreachable; None: tick
        self._inbox: asyncio.Queue[tuple[Envelope, int] | int | None] = asyncio.Queue(
            MAX_INBOX_MESSAGES
        )
        self.inbox_bytes = 0  # envelope_bytes of the envelopes in the inbox
        self.inbox_full_drops = 0  # received messages dropped: MAX_INBOX_MESSAGES reached
        self.inbox_bytes_drops = 0  # ... and dropped: max_inbox_bytes would be exceeded
        self._drop_log = LogThrottle()
        self._lock = asyncio.Lock()
        self._proposals: list[tuple[Sequence[bytes], asyncio.Future[int]]] = []  # not yet proposed
        self._pending: deque[tuple[int, asyncio.Future[int]]] = deque()  # by last offset
        self._slots = asyncio.Semaphore(config.max_pending_proposals)
        self._listeners: list[Callable[[int, int], None]] = []
        self._applied_end = 0
        self._applied_epoch = 0
        self._since_snapshot = 0
        self._since_snapshot_bytes = 0
        self._last_snapshot_ms = _now_ms()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._applier: asyncio.Task[None] | None = None
        self._commit_target = 0  # committed: apply up to here
        self._apply_wanted = asyncio.Event()
        # Told once, with the reason, when a Raft task fails (``_on_task_done``).
        self.on_fatal: Callable[[str], None] | None = None
        self.failed: str | None = None
        self._core = self._restore()
        transport.set_receiver(self._receive)
        transport.set_unreachable_listener(self._peer_unreachable)

    # -- start-up --------------------------------------------------------------------------
    def _restore(self) -> RaftCore:
        snapshot = self._snapshots.latest()
        if snapshot is not None:
            self._machine.restore(self._snapshots.load(snapshot))
            self._applied_end, self._applied_epoch = snapshot.end_offset, snapshot.epoch
            if self._log.log.log_end_offset < snapshot.end_offset:
                self._log.log.truncate_fully_and_start_at(snapshot.end_offset)
        meta = self._log.meta(snapshot)
        return RaftCore(
            self.config.raft,
            self.config.node_id,
            self.config.voters,
            state=self._quorum_store.load(),
            log=meta,
            seed=int.from_bytes(os.urandom(8), "big"),
            now_ms=_now_ms(),
        )

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"raft-{self.config.node_id}")
        self._applier = asyncio.create_task(
            self._apply_in_background(), name=f"raft-{self.config.node_id}-apply"
        )
        for task in (self._task, self._applier):
            task.add_done_callback(self._on_task_done)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        """A Raft task that ends with an error (the metadata log's disk failed, say) leaves
        the node without its log: said loudly, and ``on_fatal`` tells the node, which must
        stop (Kafka halts on a metadata log directory failure too)."""
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        _log.critical(
            "raft %d: %s failed: %r; this node cannot go on without its metadata log",
            self.config.node_id,
            task.get_name(),
            error,
            exc_info=error,
        )
        self.failed = f"{task.get_name()} failed: {error!r}"
        if self.on_fatal is not None:
            self.on_fatal(self.failed)

    async def close(self) -> None:
        """Stop; a leader first resigns (EndQuorumEpoch) so the others elect at once."""
        if self._task is not None and not self._task.done() and self._core.role == "leader":
            async with self._lock:
                await self._apply(self._core.resign(_now_ms()))
        for task in (self._task, self._applier):
            if task is not None and not task.done():  # a failed one was reported already
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._fail_pending()
        await asyncio.to_thread(self._log.close)

    def close_unstarted(self) -> None:
        """Close the log of a node that was never started (what built it failed next)."""
        if self._task is not None:
            raise RuntimeError("close_unstarted on a started Raft node: use close")
        self._log.close()

    # -- the API ---------------------------------------------------------------------------
    @property
    def role(self) -> str:
        return self._core.role

    @property
    def epoch(self) -> int:
        return self._core.epoch

    @property
    def leader_id(self) -> int:
        return self._core.leader_id

    @property
    def applied_end(self) -> int:
        """Every committed record below this offset has been handed to the state machine."""
        return self._applied_end

    @property
    def high_watermark(self) -> int:
        return self._core.high_watermark

    def add_leader_listener(self, callback: Callable[[int, int], None]) -> None:
        """``callback(epoch, leader_id)`` on every change of the known leader."""
        self._listeners.append(callback)

    async def propose(self, records: Sequence[bytes]) -> int:
        """Append records through the leader; returns the last record's offset once it is
        committed. Raises NotLeader (with the leader's id and epoch) elsewhere, and
        RecordTooLarge for a record the metadata log cannot store. Waits while
        ``max_pending_proposals`` proposals are outstanding."""
        async with self._slots:
            return await self.submit(records)

    def submit(self, records: Sequence[bytes]) -> asyncio.Future[int]:
        """Queue records at once, in call order, without waiting for a slot: the caller
        bounds what it has outstanding. The future gives the last record's offset once it is
        committed, or NotLeader. Raises NotLeader at once on a node that does not lead, and
        ValueError or RecordTooLarge for records the core would refuse (checked here, so one
        bad proposal fails alone rather than every proposal queued with it)."""
        self._core.check_proposal(records)
        if self._core.role != "leader":
            raise NotLeader(self._core.leader_id, self._core.epoch)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._proposals.append((records, future))
        if len(self._proposals) == 1:
            self._wake()
        return future

    async def read_barrier(self, timeout_s: float = 10.0) -> None:
        """Linearizable reads: on the leader, wait until its HW covers its epoch's start and
        the state machine has applied up to it."""
        async with asyncio.timeout(timeout_s):
            while True:
                start = self._core.leader_epoch_start_offset
                if start is None:
                    raise NotLeader(self._core.leader_id, self._core.epoch)
                hw = self._core.high_watermark
                if hw > start and self._applied_end >= hw:
                    return
                self._changed.clear()
                await self._changed.wait()

    # -- the loop --------------------------------------------------------------------------
    def _receive(self, envelope: Envelope) -> None:
        size = envelope_bytes(envelope)
        if self.inbox_bytes and self.inbox_bytes + size > self.config.max_inbox_bytes:
            self.inbox_bytes_drops += 1
            self._dropped(envelope, f"{self.inbox_bytes} of max_inbox_bytes")
            return
        try:
            self._inbox.put_nowait((envelope, size))
        except asyncio.QueueFull:
            self.inbox_full_drops += 1
            self._dropped(envelope, f"{MAX_INBOX_MESSAGES} messages")
            return
        self.inbox_bytes += size

    def _dropped(self, envelope: Envelope, why: str) -> None:
        """Say an inbox drop, throttled: a flood of messages would otherwise flood the log."""
        quiet = self._drop_log.ready(time.monotonic())
        if quiet is not None:
            _log.warning(
                "raft %d: inbox full (%s), dropping %s from node %d%s",
                self.config.node_id,
                why,
                type(envelope.payload).__name__,
                envelope.source,
                more(quiet),
            )

    def _peer_unreachable(self, node_id: int) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self._inbox.put_nowait(node_id)

    def _wake(self) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self._inbox.put_nowait(None)

    async def _run(self) -> None:
        while True:
            delay_ms = max(0, self._core.next_deadline_ms - _now_ms())
            item: tuple[Envelope, int] | int | None = None
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            # that races with a completed get(), and close() would wait forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay_ms / 1000):
                    item = await self._inbox.get()
            async with self._lock:
                if item is None:
                    ready = self._core.tick(_now_ms())
                elif isinstance(item, int):
                    ready = self._core.peer_unreachable(item, _now_ms())
                else:
                    envelope, size = item
                    self.inbox_bytes -= size
                    ready = self._core.step(envelope, _now_ms())
                await self._apply(ready)
                if self._proposals:
                    await self._apply(self._propose_queued())

    def _propose_queued(self) -> Ready:
        """Hand every queued proposal to the core at once; each future learns its last
        record's offset once that is committed."""
        proposals, self._proposals = self._proposals, []
        try:
            lasts, ready = self._core.propose_all([records for records, _ in proposals], _now_ms())
        except NotLeader as e:
            for _, future in proposals:
                if not future.done():
                    future.set_exception(NotLeader(e.leader_id, e.epoch))
            return Ready()
        for last, (_, future) in zip(lasts, proposals, strict=True):
            self._pending.append((last, future))
        return ready

    async def _apply(self, ready: Ready) -> None:
        """Carry out one Ready in the documented order."""
        for event in ready.events:  # role changes: rare, and what an operator asks about
            _log.info("raft %d: %s", self.config.node_id, event)
        if ready.quorum_state is not None:
            await asyncio.to_thread(self._quorum_store.save, ready.quorum_state)
        if ready.log_write is not None:
            await asyncio.to_thread(self._log.apply, ready.log_write)
        for snapshot_id, position, chunk in ready.snapshot_chunks:
            self._snapshots.write_chunk(snapshot_id, position, chunk)
        if ready.snapshot_loaded is not None:
            await self._load_snapshot(ready.snapshot_loaded)
        for envelope in ready.messages:
            await self._transport.send(self._fill(envelope))
        if ready.commit_offset is not None:
            await self._commit(ready.commit_offset)
        if ready.delete_before is not None:
            await asyncio.to_thread(self._log.delete_before, ready.delete_before)
        if ready.leader_changed is not None:
            epoch, leader = ready.leader_changed
            if leader != self.config.node_id:
                self._fail_pending()
            for callback in self._listeners:
                callback(epoch, leader)
        self._changed.set()

    def _fill(self, envelope: Envelope) -> Envelope:
        """Fill lazy replies with log records or snapshot bytes."""
        payload = envelope.payload
        if isinstance(payload, FetchResponse) and payload.read_from is not None:
            batches = self._log.read(payload.read_from, payload.read_max_bytes)
            payload = replace(payload, batches=batches, read_from=None, read_max_bytes=0)
        elif isinstance(payload, FetchSnapshotResponse) and payload.read_position is not None:
            snapshot = payload.snapshot_id
            chunk = self._snapshots.read(snapshot, payload.read_position, payload.read_max_bytes)
            payload = replace(
                payload,
                size=self._snapshots.size(snapshot),
                chunk=chunk,
                read_position=None,
                read_max_bytes=0,
            )
        return Envelope(envelope.source, envelope.destination, payload)

    async def _load_snapshot(self, snapshot: SnapshotId) -> None:
        await asyncio.to_thread(self._snapshots.finish, snapshot)
        self._machine.restore(self._snapshots.load(snapshot))
        self._applied_end, self._applied_epoch = snapshot.end_offset, snapshot.epoch
        self._since_snapshot = self._since_snapshot_bytes = 0
        _log.info(
            "raft %d: loaded the leader's snapshot up to offset %d (epoch %d)",
            self.config.node_id,
            snapshot.end_offset,
            snapshot.epoch,
        )

    async def _commit(self, commit_offset: int) -> None:
        """Apply newly committed records: a first chunk now, the rest in the background a
        chunk at a time, so a huge commit (a broker holding 100,000 partitions fenced) does
        not stop this node from answering fetches and votes for seconds."""
        self._log.set_high_watermark(commit_offset)
        self._commit_target = max(self._commit_target, commit_offset)
        await self._apply_chunk()
        if self._applied_end < self._commit_target:
            self._apply_wanted.set()

    async def _apply_in_background(self) -> None:
        while True:
            await self._apply_wanted.wait()
            self._apply_wanted.clear()
            while self._applied_end < self._commit_target:
                await asyncio.sleep(0)  # the Raft loop may take the lock first
                async with self._lock:
                    await self._apply_chunk()
                self._changed.set()

    async def _apply_chunk(self) -> None:
        """Apply whole batches from the applied end towards the commit target until about
        ``APPLY_CHUNK_RECORDS`` records are done; answer proposals that are applied; take a
        snapshot when one is due. Runs under the lock (the log store is single-user)."""
        target, applied = self._commit_target, 0
        while self._applied_end < target and applied < APPLY_CHUNK_RECORDS:
            batches = self._log.read(self._applied_end, 1024 * 1024)
            if not batches:
                break
            for batch in batches:
                if batch.next_offset <= self._applied_end or batch.base_offset >= target:
                    continue
                if not batch.is_control:
                    for i, record in enumerate(decode_records(batch.data)):
                        self._machine.apply(batch.base_offset + i, record)
                        self._since_snapshot += 1
                        self._since_snapshot_bytes += len(record)
                    applied += batch.next_offset - batch.base_offset
                self._applied_end, self._applied_epoch = batch.next_offset, batch.epoch
                if applied >= APPLY_CHUNK_RECORDS:
                    break
        pending = self._pending
        while pending and pending[0][0] < self._applied_end:
            offset, future = pending.popleft()
            if not future.done():
                future.set_result(offset)
        if self._snapshot_due():
            await self._take_snapshot()

    def _snapshot_due(self) -> bool:
        config = self.config
        return (
            self._since_snapshot >= config.snapshot_interval_records
            or self._since_snapshot_bytes >= config.snapshot_interval_bytes
            or (
                self._since_snapshot > 0
                and _now_ms() - self._last_snapshot_ms >= config.snapshot_interval_ms
            )
        )

    async def _take_snapshot(self) -> None:
        snapshot = SnapshotId(self._applied_end, self._applied_epoch)
        data = self._machine.snapshot()
        await asyncio.to_thread(self._snapshots.save, snapshot, data)
        self._since_snapshot = self._since_snapshot_bytes = 0
        self._last_snapshot_ms = _now_ms()
        await self._apply(self._core.snapshot_taken(snapshot, _now_ms()))

    def _fail_pending(self) -> None:
        pending, self._pending = self._pending, deque()
        queued, self._proposals = self._proposals, []
        for _, future in [*pending, *queued]:
            if not future.done():
                future.set_exception(NotLeader(self._core.leader_id, self._core.epoch))
