"""Carrying out a node's ``Ready`` on the simulated storage and network, crashes included.

How this works. ``_carry_out`` does what a ``Ready`` asks in its documented order: persist the
quorum state, write snapshot chunks and log operations, check the node, send (after the fsync),
apply committed records, delete the log prefix a snapshot covers. A node marked to crash inside
a Ready stops at a random step, after a random prefix of its storage operations (the unflushed
rest is lost). Each storage step checks what it is asked to do (no append past the log end, no
batch larger than the log stores, no truncation inside a batch, no log restart without a
snapshot; how proposals are packed within ``max_batch_bytes`` is tested in
tests/raft/test_core.py). The state machine applies committed records, snapshots every
``snapshot_every_records`` and is rebuilt from the latest snapshot on restart; ``_restart``
rebuilds ``LogMeta`` from the durable log.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from raft.core import LogMeta, RaftCore, decode_records, record_bytes
from raft.messages import (
    NO_LEADER,
    Batch,
    Envelope,
    FetchRequest,
    FetchResponse,
    FetchSnapshotResponse,
    LogWrite,
    QuorumState,
    Ready,
    SnapshotId,
    VoteResponse,
)
from raft.testing.sim_invariants import Invariants
from raft.testing.sim_network import Deliver, Restart, Tick, Unreachable
from raft.testing.sim_state import brief
from raft.testing.sim_storage import SimNode, StateMachine, decode_snapshot, encode_snapshot

__all__ = ["ReadySteps"]


class ReadySteps(Invariants):
    """How a node carries out its core's Readys, applies commits, crashes and restarts."""

    # -- carrying out a Ready ----------------------------------------------------------------
    def _carry_out(self, node: SimNode, ready: Ready) -> None:
        """Do what ``Ready`` asks in its order; a pending crash stops it at a random step."""
        for event in ready.events:
            self._note(f"core@{node.node_id}", event)
        crash_at = self.rng.randint(0, 5) if node.crash_in_ready else -1
        if crash_at == 0:
            return self._crash(node)
        if ready.quorum_state is not None:
            self._persist_quorum(node, ready.quorum_state)
        if crash_at == 1:
            return self._crash(node)
        ops = self._storage_ops(node, ready)
        if crash_at == 2:
            for op in ops[: self.rng.randint(0, len(ops))]:
                op()
            return self._crash(node)
        for op in ops:
            op()
        self._check_node(node)  # before anything is sent: a crash later must not hide a role
        if crash_at == 3:
            return self._crash(node)
        messages = ready.messages
        if crash_at == 4:
            messages = tuple(m for m in messages if self.rng.random() < 0.5)
        for envelope in messages:
            self._send(node, envelope)
        if crash_at == 4:
            return self._crash(node)
        self._apply(node, ready)
        if crash_at == 5:
            if ready.delete_before is not None and self.rng.random() < 0.5:
                self._delete_before(node, ready.delete_before)
            return self._crash(node)
        if ready.delete_before is not None:
            self._delete_before(node, ready.delete_before)
        self._check_node(node)
        self._schedule_tick(node)
        self._maybe_snapshot(node)
        return None

    def _persist_quorum(self, node: SimNode, state: QuorumState) -> None:
        old = node.quorum
        if state.epoch < old.epoch:
            self._fail(f"node {node.node_id} persists epoch {state.epoch} after {old.epoch}")
        if state.epoch == old.epoch:
            if old.voted_for not in (NO_LEADER, state.voted_for):
                self._fail(f"node {node.node_id} changes its vote in epoch {old.epoch}: {state}")
            if state.leader_id not in (NO_LEADER, old.leader_id) and old.leader_id != NO_LEADER:
                self._fail(f"node {node.node_id} changes leader in epoch {old.epoch}: {state}")
        node.quorum = state
        self._note(f"persist@{node.node_id}", state)

    def _storage_ops(self, node: SimNode, ready: Ready) -> list[Callable[[], None]]:
        ops: list[Callable[[], None]] = []
        for snapshot_id, position, chunk in ready.snapshot_chunks:
            ops.append(partial(self._write_chunk, node, snapshot_id, position, chunk))
        if ready.snapshot_loaded is not None:
            ops.append(partial(self._finish_snapshot, node, ready.snapshot_loaded))
        write = ready.log_write
        if write is not None:
            ops.extend(self._log_ops(node, write))
        return ops

    def _log_ops(self, node: SimNode, write: LogWrite) -> list[Callable[[], None]]:
        ops: list[Callable[[], None]] = []
        if write.restart_at is not None:
            ops.append(partial(self._restart_log, node, write.restart_at))
        if write.truncate_to is not None:
            ops.append(partial(self._truncate, node, write.truncate_to))
        ops.extend(partial(self._append, node, batch) for batch in write.batches)
        return ops

    def _write_chunk(
        self, node: SimNode, snapshot_id: SnapshotId, position: int, chunk: bytes
    ) -> None:
        buffer = node.partial.setdefault(snapshot_id, bytearray())
        if position == 0:
            buffer.clear()
        if position != len(buffer):
            self._fail(
                f"node {node.node_id}: snapshot chunk at {position} but {len(buffer)} bytes "
                f"of {snapshot_id} received"
            )
        buffer.extend(chunk)

    def _finish_snapshot(self, node: SimNode, snapshot_id: SnapshotId) -> None:
        data = node.partial.pop(snapshot_id, None)
        if data is None:
            if snapshot_id in node.snapshots:
                return
            self._fail(f"node {node.node_id} loads snapshot {snapshot_id} it never received")
        try:
            end, _ = decode_snapshot(bytes(data))
        except (ValueError, struct.error) as e:
            self._fail(f"node {node.node_id}: snapshot {snapshot_id} is corrupt: {e}")
        if end != snapshot_id.end_offset:
            self._fail(f"node {node.node_id}: snapshot {snapshot_id} holds state up to {end}")
        self._store_snapshot(node, snapshot_id, bytes(data))
        self.result.snapshots_loaded += 1

    def _store_snapshot(self, node: SimNode, snapshot_id: SnapshotId, data: bytes) -> None:
        node.snapshots[snapshot_id] = data
        node.snap_end = max(node.snap_end, snapshot_id.end_offset)
        keep = sorted(node.snapshots, key=lambda s: (s.end_offset, s.epoch))
        for old in keep[: -self.config.snapshots_kept]:
            del node.snapshots[old]

    def _restart_log(self, node: SimNode, offset: int) -> None:
        log = node.log
        old_start, old_end = log.start_offset, log.end_offset
        if node.snapshot_end() < offset:
            self._fail(f"node {node.node_id} restarts its log at {offset} without a snapshot")
        log.restart(offset)
        node.verified_upto = min(node.verified_upto, offset)
        self._recheck(node, max(old_start, offset), old_end)

    def _truncate(self, node: SimNode, offset: int) -> None:
        log = node.log
        old_end = log.end_offset
        if offset < log.start_offset:
            self._fail(f"node {node.node_id} truncates to {offset}, below its log start")
        if offset < old_end and not log.is_boundary(offset):
            self._fail(f"node {node.node_id} truncates inside a batch at {offset}")
        log.truncate(offset)
        node.verified_upto = min(node.verified_upto, log.end_offset)
        self._recheck(node, log.end_offset, old_end)

    def _append(self, node: SimNode, batch: Batch) -> None:
        log = node.log
        if batch.base_offset != log.end_offset:
            self._fail(
                f"node {node.node_id} appends a batch at {batch.base_offset} to a log ending at "
                f"{log.end_offset}"
            )
        if batch.last_offset < batch.base_offset:
            self._fail(f"node {node.node_id} appends an empty batch {batch}")
        records = decode_records(batch.data)
        if not batch.is_control and len(records) != batch.last_offset - batch.base_offset + 1:
            self._fail(f"node {node.node_id} appends a batch whose record count is wrong: {batch}")
        self._check_batch_size(node, batch, sum(record_bytes(r) for r in records))
        log.append(batch)

    def _check_batch_size(self, node: SimNode, batch: Batch, size: int) -> None:
        """The real log refuses a batch beyond its max_message_bytes, and that ends the node."""
        if size > self.config.log_max_batch_bytes:
            self._fail(
                f"node {node.node_id} appends {brief(batch)} of {size} bytes, more than its "
                f"log stores ({self.config.log_max_batch_bytes})"
            )

    def _delete_before(self, node: SimNode, offset: int) -> None:
        log = node.log
        if offset > node.snapshot_end():
            self._fail(
                f"node {node.node_id} deletes its log before {offset}, beyond its snapshot "
                f"({node.snapshot_end()})"
            )
        old_start = log.start_offset
        log.delete_before(offset)
        self._recheck(node, old_start, min(offset, log.start_offset))

    def _send(self, node: SimNode, envelope: Envelope) -> None:
        envelope = self._fill(node, envelope)
        payload = envelope.payload
        if isinstance(payload, VoteResponse) and payload.granted and not payload.pre_vote:
            state = node.quorum
            if state.epoch != payload.epoch or state.voted_for != envelope.destination:
                self._fail(
                    f"node {node.node_id} grants its vote to {envelope.destination} in epoch "
                    f"{payload.epoch} but its durable state is {state}"
                )
        if isinstance(payload, FetchRequest) and payload.fetch_offset > node.log.end_offset:
            self._fail(
                f"node {node.node_id} fetches from {payload.fetch_offset} beyond its durable log "
                f"end {node.log.end_offset}"
            )
        self.result.messages += 1
        for delay in self.net.delays(envelope.source, envelope.destination):
            self._push(self.now + delay, Deliver(envelope))

    def _fill(self, node: SimNode, envelope: Envelope) -> Envelope:
        """Fill a lazy reply from the sender's log or snapshot store."""
        payload = envelope.payload
        if isinstance(payload, FetchResponse) and payload.read_from is not None:
            batches = node.log.read(payload.read_from, payload.read_max_bytes)
            filled: FetchResponse | FetchSnapshotResponse = replace(
                payload, batches=batches, read_from=None
            )
        elif isinstance(payload, FetchSnapshotResponse) and payload.read_position is not None:
            data = node.snapshots.get(payload.snapshot_id)
            if data is None:
                filled = replace(payload, read_position=None, missing=True)
            else:
                start = payload.read_position
                chunk = data[start : start + payload.read_max_bytes]
                filled = replace(payload, read_position=None, chunk=chunk, size=len(data))
        else:
            return envelope
        return Envelope(envelope.source, envelope.destination, filled)

    def _schedule_tick(self, node: SimNode) -> None:
        core = node.core
        if core is None:
            return
        deadline = core.next_deadline_ms
        if deadline == node.tick_at or deadline > self.deadline_ms:
            return
        node.tick_gen += 1
        node.tick_at = deadline
        self._push(max(deadline, self.now), Tick(node.node_id, node.tick_gen))

    # -- the state machine -----------------------------------------------------------------
    def _apply(self, node: SimNode, ready: Ready) -> None:
        sm = node.sm
        if ready.snapshot_loaded is not None:
            loaded = ready.snapshot_loaded
            if loaded.end_offset > sm.applied_end:
                node.sm = sm = self._load_state_machine(node, loaded)
        if ready.commit_offset is None or ready.commit_offset <= sm.applied_end:
            return
        core = node.core
        assert core is not None
        if ready.commit_offset > core.high_watermark:
            self._fail(
                f"node {node.node_id} commits to {ready.commit_offset} beyond its HW "
                f"{core.high_watermark}"
            )
        if sm.applied_end < node.log.start_offset:
            self._fail(
                f"node {node.node_id} must apply from {sm.applied_end} but its log starts at "
                f"{node.log.start_offset} (snapshot {node.snapshot_end()})"
            )
        if ready.commit_offset > node.log.end_offset:
            self._fail(
                f"node {node.node_id} commits to {ready.commit_offset} beyond its log end "
                f"{node.log.end_offset}"
            )
        for offset, entry in node.log.entries(sm.applied_end, ready.commit_offset):
            self._commit(offset, entry, node)
            if not entry[1]:
                self._check_applied(node, offset, entry[2])
                sm.records.append((offset, entry[2]))
                sm.since_snapshot += 1
        sm.applied_end = ready.commit_offset

    def _maybe_snapshot(self, node: SimNode) -> None:
        if node.sm.since_snapshot >= self.config.snapshot_every_records:
            self._take_snapshot(node)

    def _take_snapshot(self, node: SimNode) -> None:
        sm, core = node.sm, node.core
        assert core is not None
        end = sm.applied_end
        if end == 0 or (sm.snapshot is not None and sm.snapshot.end_offset >= end):
            return
        entry = node.log.entry(end - 1)
        if entry is None:
            return  # only a loaded snapshot covers it: nothing new to save
        snapshot_id = SnapshotId(end, entry[0])
        self._store_snapshot(node, snapshot_id, encode_snapshot(end, sm.records))
        sm.snapshot, sm.since_snapshot = snapshot_id, 0
        self.result.snapshots_taken += 1
        self._note(f"snapshot@{node.node_id}", snapshot_id)
        self._carry_out(node, core.snapshot_taken(snapshot_id, self.now))

    # -- crash and restart -----------------------------------------------------------------
    def _crash(self, node: SimNode) -> None:
        self._note(f"crash@{node.node_id}")
        self.result.crashes += 1
        self._report_crash(node)
        node.core = None
        node.tick_gen += 1
        node.tick_at = None
        node.partial.clear()
        node.crash_in_ready = False
        node.sm = StateMachine()
        if not self.healed:
            down = self.rng.randint(self.config.down_min_ms, self.config.down_max_ms)
            self._push(self.now + down, Restart(node.node_id))

    def _report_crash(self, crashed: SimNode) -> None:
        """Each live node's transport notices the crash (a reset connection) with some
        probability, a network delay later."""
        for node in self.nodes.values():
            up = node is not crashed and node.core is not None
            if up and self.rng.random() < self.config.crash_report_probability:
                delay = self.rng.randint(self.config.delay_min_ms, self.config.delay_max_ms)
                self._push(self.now + delay, Unreachable(node.node_id, crashed.node_id))

    def _restart(self, node: SimNode) -> None:
        snapshot = node.latest_snapshot()
        log = node.log
        if snapshot is not None and snapshot.end_offset > log.end_offset:
            log.restart(snapshot.end_offset)  # as Kafka's log does at start-up
        meta = LogMeta(
            log.start_offset,
            log.end_offset,
            log.epochs(),
            snapshot,
            max_batch_bytes=self.config.log_max_batch_bytes,
        )
        self._note(f"start@{node.node_id}", f"{node.quorum} {meta}")
        node.core = core = RaftCore(
            self.config.raft,
            node.node_id,
            self.voters,
            state=node.quorum,
            log=meta,
            seed=self.rng.randrange(2**31),
            now_ms=self.now,
        )
        node.sm = self._load_state_machine(node, snapshot)
        node.hw_seen = core.high_watermark
        node.verified_upto = log.start_offset
        self._check_node(node)
        self._schedule_tick(node)

    def _load_state_machine(self, node: SimNode, snapshot: SnapshotId | None) -> StateMachine:
        sm = StateMachine()
        if snapshot is None:
            return sm
        end, records = decode_snapshot(node.snapshots[snapshot])
        for offset, data in records:
            self._check_applied(node, offset, data)
        sm.applied_end, sm.records, sm.snapshot = end, records, snapshot
        return sm
