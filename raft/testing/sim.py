"""A deterministic simulation of a Raft cluster driving real ``RaftCore`` instances.

How this works. One seeded ``random.Random`` decides everything (message delays, drops,
duplicates, faults, the cores' own seeds), time is a virtual clock in milliseconds, and one
heap of ``(time, seq, event)`` orders what happens. Running a seed twice gives the same run.

- Network: every message gets a random delay (a few are very slow, which reorders them), may be
  dropped or duplicated, and is lost if a partition blocks its (source, destination) link.
  Partitions are symmetric splits, one-way links, or an isolated leader; each heals later.
- Transport reports: when a node crashes, each live node is usually told it is unreachable
  (as a reset connection would tell it), and during the fault phase random reports name live
  nodes (wrong ones), so early elections are exercised and must stay safe.
- Storage, per node: the log (batches), the quorum-state file (replaced atomically) and the
  snapshot store (complete snapshots; partial ones being received are volatile). A node carries
  out each ``Ready`` in the documented order and fsyncs before it sends, so between Readys its
  log *is* its durable log; a crash inside a Ready stops it at a random step, after a random
  prefix of that Ready's storage operations: the unflushed rest is lost.
- State machine, per node: the applied records (control records skipped). It snapshots every
  ``snapshot_every_records`` applied records (and on random requests) and loads snapshots the
  core fetched. A restarted node rebuilds ``LogMeta`` from its log and latest snapshot.
- Invariants, after every event (each event touches one node; the checks cover it): at most one
  leader per epoch and one leader believed per epoch; a node's epoch never goes back, even
  across restarts (durable quorum state); one vote per node per epoch; a node's HW never goes
  back while it is up; entries below a node's HW equal the committed log (offset -> (epoch,
  control, data), learnt as HWs advance); applied records equal it; every committed offset is
  held by a majority of voters' durable logs or snapshots, rechecked whenever a log shrinks.
- Phases: faults for ``safety_ms``, then heal everything (restart crashed nodes, stop drops) and
  require, within ``liveness_ms``, a leader that commits a set of client records that every node
  then applies.

A violation raises ``SimulationFailure`` naming the seed, the virtual time, the command that
replays it and the tail of the event trace.
"""

from __future__ import annotations

import heapq
import random
import struct
import zlib
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import NoReturn

from raft.core import LogMeta, NotLeader, RaftConfig, RaftCore, decode_records
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

__all__ = ["SimConfig", "SimResult", "Simulation", "SimulationFailure", "run_seed"]

Entry = tuple[int, bool, bytes]  # one offset of the log: (epoch, is control, record bytes)

_SIM_RAFT = RaftConfig(
    max_batch_bytes=512,  # small limits so batches split, fetches page and snapshots chunk
    fetch_max_bytes=1024,
    snapshot_chunk_bytes=256,
)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """A simulated cluster and its faults; times in virtual milliseconds."""

    voters: int = 3
    observers: int = 1
    raft: RaftConfig = _SIM_RAFT
    safety_ms: int = 30_000
    liveness_ms: int = 30_000
    # network
    delay_min_ms: int = 1
    delay_max_ms: int = 40
    slow_probability: float = 0.03
    slow_max_ms: int = 1_500
    drop_probability: float = 0.05
    duplicate_probability: float = 0.03
    # faults (mean time between them) and their durations
    fault_interval_ms: int = 1_500
    down_min_ms: int = 100
    down_max_ms: int = 4_000
    partition_min_ms: int = 300
    partition_max_ms: int = 5_000
    # "peer unreachable" reports from the transport: after a crash, and wrong ones at random
    crash_report_probability: float = 0.8
    wrong_report_interval_ms: int = 2_000
    # clients and the state machine
    proposal_interval_ms: int = 120
    records_per_proposal_max: int = 4
    snapshot_every_records: int = 25
    snapshot_request_interval_ms: int = 3_000
    snapshots_kept: int = 2
    liveness_records: int = 10
    liveness_client_interval_ms: int = 50
    trace_len: int = 80

    def replay_command(self, seed: int) -> str:
        return (
            f"python -m raft.testing.simulate --seeds 1 --first-seed {seed} "
            f"--voters {self.voters} --observers {self.observers}"
        )


@dataclass(slots=True)
class SimResult:
    seed: int
    virtual_ms: int = 0
    events: int = 0
    messages: int = 0
    crashes: int = 0
    partitions: int = 0
    proposals_acked: int = 0
    records_committed: int = 0
    snapshots_taken: int = 0
    snapshots_loaded: int = 0
    elections: int = 0
    liveness_ms: int = 0  # from healing to every liveness record applied everywhere
    liveness_lost_acks: int = 0  # acknowledged, then overwritten after a leader change


class SimulationFailure(AssertionError):
    """A broken invariant (or liveness bound), with what it takes to replay it."""

    def __init__(self, seed: int, time_ms: int, problem: str, replay: str, trace: str) -> None:
        super().__init__(
            f"seed {seed} at t={time_ms} ms: {problem}\n  replay: {replay}\n"
            f"  trace (most recent last):\n{trace}"
        )
        self.seed = seed
        self.time_ms = time_ms
        self.problem = problem
        self.replay = replay


# -- storage -----------------------------------------------------------------------------------

_batch_entries: dict[int, tuple[Batch, list[Entry]]] = {}


def entries_of(batch: Batch) -> list[Entry]:
    """The per-offset entries of a batch (cached by identity: batches travel unchanged)."""
    cached = _batch_entries.get(id(batch))
    if cached is not None and cached[0] is batch:
        return cached[1]
    if batch.is_control:
        entries = [(batch.epoch, True, b"")] * (batch.last_offset - batch.base_offset + 1)
    else:
        entries = [(batch.epoch, False, r) for r in decode_records(batch.data)]
    if len(_batch_entries) > 200_000:
        _batch_entries.clear()
    _batch_entries[id(batch)] = (batch, entries)
    return entries


class SimLog:
    """A node's Raft log: batches in offset order; ``start_offset`` may fall inside the first.

    Not a copy of anything: the simulation applies each Ready's operations here and counts them
    durable once the Ready's fsync step is reached (a crash earlier keeps only a prefix)."""

    __slots__ = ("bases", "batches", "start_offset")

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.bases: list[int] = []
        self.start_offset = 0

    @property
    def end_offset(self) -> int:
        return self.batches[-1].next_offset if self.batches else self.start_offset

    def _index(self, offset: int) -> int:
        """Index of the batch holding ``offset`` (or -1)."""
        i = bisect_right(self.bases, offset) - 1
        if i >= 0 and self.batches[i].last_offset >= offset:
            return i
        return -1

    def entry(self, offset: int) -> Entry | None:
        if offset < self.start_offset:
            return None
        i = self._index(offset)
        if i < 0:
            return None
        batch = self.batches[i]
        return entries_of(batch)[offset - batch.base_offset]

    def entries(self, lo: int, hi: int) -> Iterator[tuple[int, Entry]]:
        lo = max(lo, self.start_offset)
        if lo >= hi:
            return
        i = max(bisect_right(self.bases, lo) - 1, 0)
        for batch in self.batches[i:]:
            if batch.base_offset >= hi:
                break
            for k, entry in enumerate(entries_of(batch)):
                offset = batch.base_offset + k
                if lo <= offset < hi:
                    yield offset, entry

    def is_boundary(self, offset: int) -> bool:
        return (
            offset >= self.end_offset
            or offset <= self.start_offset
            or self._index(offset) < 0
            or (self.batches[self._index(offset)].base_offset == offset)
        )

    def truncate(self, offset: int) -> None:
        """Drop every batch holding an offset at or above ``offset`` (Kafka's truncateTo)."""
        while self.batches and self.batches[-1].last_offset >= offset:
            self.batches.pop()
            self.bases.pop()
        self.start_offset = (
            min(self.start_offset, max(offset, 0)) if not self.batches else (self.start_offset)
        )

    def append(self, batch: Batch) -> None:
        self.batches.append(batch)
        self.bases.append(batch.base_offset)

    def restart(self, offset: int) -> None:
        self.batches.clear()
        self.bases.clear()
        self.start_offset = offset

    def delete_before(self, offset: int) -> None:
        keep = 0
        while keep < len(self.batches) and self.batches[keep].next_offset <= offset:
            keep += 1
        del self.batches[:keep]
        del self.bases[:keep]
        self.start_offset = max(self.start_offset, offset)

    def read(self, offset: int, max_bytes: int) -> tuple[Batch, ...]:
        """Batches from the one holding ``offset``: at least one, then up to ``max_bytes``."""
        i = bisect_right(self.bases, offset) - 1
        if i < 0 or self.batches[i].last_offset < offset:
            i += 1
        out: list[Batch] = []
        size = 0
        for batch in self.batches[max(i, 0) :]:
            if out and size + len(batch.data) > max_bytes:
                break
            out.append(batch)
            size += len(batch.data)
        return tuple(out)

    def epochs(self) -> tuple[tuple[int, int], ...]:
        """(epoch, start offset) ascending, as an epoch cache rebuilt from the batches."""
        out: list[tuple[int, int]] = []
        for batch in self.batches:
            if not out or batch.epoch > out[-1][0]:
                out.append((batch.epoch, max(batch.base_offset, self.start_offset)))
        return tuple(out)


_SNAP_HEAD = struct.Struct(">qI")
_SNAP_CRC = struct.Struct(">I")


def encode_snapshot(end_offset: int, records: list[tuple[int, bytes]]) -> bytes:
    body = b"".join(_SNAP_HEAD.pack(o, len(d)) + d for o, d in records)
    payload = _SNAP_HEAD.pack(end_offset, len(records)) + body
    return payload + _SNAP_CRC.pack(zlib.crc32(payload))


def decode_snapshot(data: bytes) -> tuple[int, list[tuple[int, bytes]]]:
    payload, (crc,) = data[:-4], _SNAP_CRC.unpack_from(data, len(data) - 4)
    if zlib.crc32(payload) != crc:
        raise ValueError("snapshot checksum mismatch")
    end_offset, count = _SNAP_HEAD.unpack_from(payload, 0)
    pos, records = _SNAP_HEAD.size, []
    for _ in range(count):
        offset, length = _SNAP_HEAD.unpack_from(payload, pos)
        pos += _SNAP_HEAD.size
        records.append((offset, payload[pos : pos + length]))
        pos += length
    return end_offset, records


@dataclass(slots=True)
class StateMachine:
    """The applied records (volatile: rebuilt from the latest snapshot on restart)."""

    applied_end: int = 0  # next offset to apply
    records: list[tuple[int, bytes]] = field(default_factory=list)
    since_snapshot: int = 0
    snapshot: SnapshotId | None = None  # the last one taken or loaded


@dataclass(slots=True)
class SimNode:
    node_id: int
    is_voter: bool
    log: SimLog = field(default_factory=SimLog)
    quorum: QuorumState = field(default_factory=QuorumState)  # the durable file
    snapshots: dict[SnapshotId, bytes] = field(default_factory=dict)  # complete, durable
    partial: dict[SnapshotId, bytearray] = field(default_factory=dict)  # being received
    core: RaftCore | None = None  # None while crashed
    sm: StateMachine = field(default_factory=StateMachine)
    tick_gen: int = 0
    tick_at: int | None = None
    crash_in_ready: bool = False
    epoch_seen: int = 0  # highest epoch this node exposed (in memory or durable)
    hw_seen: int = 0  # while up
    verified_upto: int = 0  # log offsets below this were checked against the committed log
    snap_end: int = 0  # the latest complete snapshot's end offset (0: none)

    @property
    def up(self) -> bool:
        return self.core is not None

    def latest_snapshot(self) -> SnapshotId | None:
        return max(self.snapshots, key=lambda s: (s.end_offset, s.epoch), default=None)

    def snapshot_end(self) -> int:
        return self.snap_end


# -- network -----------------------------------------------------------------------------------


class Network:
    """Delays, drops, duplicates and partitions; reordering comes from the random delays."""

    def __init__(self, rng: random.Random, config: SimConfig) -> None:
        self.rng = rng
        self.config = config
        self.blocked: set[tuple[int, int]] = set()
        self.drop_probability = config.drop_probability
        self.duplicate_probability = config.duplicate_probability
        self.slow_probability = config.slow_probability

    def delays(self, source: int, destination: int) -> list[int]:
        if (source, destination) in self.blocked:
            return []
        rng = self.rng
        if rng.random() < self.drop_probability:
            return []
        first = self._delay()
        if rng.random() < self.duplicate_probability:
            return [first, self._delay()]
        return [first]

    def _delay(self) -> int:
        config, rng = self.config, self.rng
        if rng.random() < self.slow_probability:
            return rng.randint(config.delay_max_ms, config.slow_max_ms)
        return rng.randint(config.delay_min_ms, config.delay_max_ms)

    def heal(self) -> None:
        self.blocked.clear()
        self.drop_probability = 0.0
        self.duplicate_probability = 0.0
        self.slow_probability = 0.0


# -- events ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Deliver:
    envelope: Envelope


@dataclass(frozen=True, slots=True)
class _Tick:
    node_id: int
    gen: int


@dataclass(frozen=True, slots=True)
class _Propose:
    pass


@dataclass(frozen=True, slots=True)
class _Fault:
    pass


@dataclass(frozen=True, slots=True)
class _Unreachable:
    node_id: int  # told by its transport
    peer: int  # that this node is down


@dataclass(frozen=True, slots=True)
class _WrongReport:
    pass


@dataclass(frozen=True, slots=True)
class _Restart:
    node_id: int


@dataclass(frozen=True, slots=True)
class _Heal:
    gen: int


@dataclass(frozen=True, slots=True)
class _SnapshotRequest:
    pass


@dataclass(frozen=True, slots=True)
class _StartLiveness:
    pass


@dataclass(frozen=True, slots=True)
class _LivenessClient:
    pass


_Event = (
    _Deliver
    | _Tick
    | _Propose
    | _Fault
    | _Unreachable
    | _WrongReport
    | _Restart
    | _Heal
    | _SnapshotRequest
    | _StartLiveness
    | _LivenessClient
)


@dataclass(slots=True)
class _ClientRecord:
    """A liveness-phase record: proposed (again) until it is committed."""

    data: bytes
    epoch: int | None = None  # the epoch of the leader that acknowledged it


# -- the simulation ----------------------------------------------------------------------------


class Simulation:
    """One seeded run. ``run()`` returns a ``SimResult`` or raises ``SimulationFailure``."""

    def __init__(self, seed: int, config: SimConfig | None = None) -> None:
        self.seed = seed
        self.config = config = config or SimConfig()
        self.rng = random.Random(seed)
        self.now = 0
        self.queue: list[tuple[int, int, _Event]] = []
        self.seq = 0
        self.voters = frozenset(range(1, config.voters + 1))
        self.majority = config.voters // 2 + 1
        ids = range(1, config.voters + config.observers + 1)
        self.nodes = {i: SimNode(i, i in self.voters) for i in ids}
        self.net = Network(self.rng, config)
        self.result = SimResult(seed)
        self.trace: deque[tuple[int, str, object]] = deque(maxlen=config.trace_len)
        self.committed: dict[int, Entry] = {}
        self.committed_data: dict[bytes, int] = {}  # record -> its committed offset
        self.commit_end = 0
        self.leaders: dict[int, int] = {}  # epoch -> the node that was leader in it
        self.believed: dict[int, int] = {}  # epoch -> the leader some node followed in it
        self.partition_gen = 0
        self.client_leader = NO_LEADER
        self.proposal_count = 0
        self.healed = False
        self.deadline_ms = config.safety_ms + config.liveness_ms
        self.liveness: list[_ClientRecord] = []
        self.done = False
        self.full_trace: list[str] | None = None
        self._handlers: dict[type, Callable[[_Event], None]] = {
            _Deliver: self._on_deliver,  # type: ignore[dict-item]
            _Tick: self._on_tick,  # type: ignore[dict-item]
            _Propose: self._on_propose,  # type: ignore[dict-item]
            _Fault: self._on_fault,  # type: ignore[dict-item]
            _Unreachable: self._on_unreachable,  # type: ignore[dict-item]
            _WrongReport: self._on_wrong_report,  # type: ignore[dict-item]
            _Restart: self._on_restart,  # type: ignore[dict-item]
            _Heal: self._on_heal,  # type: ignore[dict-item]
            _SnapshotRequest: self._on_snapshot_request,  # type: ignore[dict-item]
            _StartLiveness: self._on_start_liveness,  # type: ignore[dict-item]
            _LivenessClient: self._on_liveness_client,  # type: ignore[dict-item]
        }

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> SimResult:
        config = self.config
        for node in self.nodes.values():
            self._push(self.rng.randint(0, 50), _Restart(node.node_id))
        self._push(self._exp(config.proposal_interval_ms), _Propose())
        self._push(self._exp(config.fault_interval_ms), _Fault())
        self._push(self._exp(config.wrong_report_interval_ms), _WrongReport())
        self._push(self._exp(config.snapshot_request_interval_ms), _SnapshotRequest())
        self._push(config.safety_ms, _StartLiveness())
        same_time, last_time = 0, -1
        while self.queue and not self.done:
            time, _, event = heapq.heappop(self.queue)
            if time > self.deadline_ms:
                break
            self.now = time
            same_time = same_time + 1 if time == last_time else 0
            last_time = time
            if same_time > 20_000:
                self._fail("livelock: over 20000 events at one virtual instant")
            self.result.events += 1
            self._handlers[type(event)](event)
        if not self.done:
            self.now = max(self.now, self.deadline_ms)
            self._fail(self._liveness_report())
        self.result.virtual_ms = self.now
        self.result.records_committed = sum(1 for e in self.committed.values() if not e[1])
        return self.result

    def _push(self, at: int, event: _Event) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (at, self.seq, event))

    def _exp(self, mean_ms: int) -> int:
        return self.now + 1 + int(self.rng.expovariate(1.0 / mean_ms))

    def _note(self, label: str, detail: object = "") -> None:
        self.trace.append((self.now, label, detail))
        if self.full_trace is not None:
            self.full_trace.append(f"{self.now:>7} {label} {brief(detail)}")

    def _fail(self, problem: str) -> NoReturn:
        lines = "\n".join(f"    {t:>7} {label} {brief(d)}" for t, label, d in self.trace)
        states = "\n".join(f"    {self._describe(n)}" for n in self.nodes.values())
        raise SimulationFailure(
            self.seed,
            self.now,
            problem,
            self.config.replay_command(self.seed),
            f"{lines}\n  nodes:\n{states}",
        )

    def _describe(self, node: SimNode) -> str:
        core = node.core
        where = f"log [{node.log.start_offset}, {node.log.end_offset}) snap {node.snapshot_end()}"
        if core is None:
            return f"node {node.node_id}: down, {node.quorum}, {where}"
        return (
            f"node {node.node_id}: {core.role} epoch {core.epoch} leader {core.leader_id} "
            f"hw {core.high_watermark} applied {node.sm.applied_end}, {where}"
        )

    # -- events ----------------------------------------------------------------------------
    def _on_deliver(self, event: _Deliver) -> None:
        envelope = event.envelope
        node = self.nodes[envelope.destination]
        if node.core is None:
            return
        self._note(f"{envelope.source}->{envelope.destination}", envelope.payload)
        self._carry_out(node, node.core.step(envelope, self.now))

    def _on_tick(self, event: _Tick) -> None:
        node = self.nodes[event.node_id]
        if node.core is None or event.gen != node.tick_gen:
            return
        node.tick_at = None
        self._carry_out(node, node.core.tick(self.now))

    def _on_propose(self, event: _Propose) -> None:
        del event
        if not self.healed:
            self._push(self._exp(self.config.proposal_interval_ms), _Propose())
        count = self.rng.randint(1, self.config.records_per_proposal_max)
        records = [self._record_data() for _ in range(count)]
        self._propose(records)

    def _record_data(self) -> bytes:
        self.proposal_count += 1
        return b"r%d" % self.proposal_count

    def _propose(self, records: list[bytes]) -> int | None:
        """Send records to the node the client thinks leads; the epoch that accepted them."""
        node = self.nodes.get(self.client_leader)
        if node is None or node.core is None:
            up = [n for n in self.nodes.values() if n.core is not None and n.is_voter]
            if not up:
                return None
            node = self.rng.choice(up)
        core = node.core
        assert core is not None
        try:
            last, ready = core.propose(records, self.now)
        except NotLeader as e:
            # A resigned leader still names itself: ask someone else next time.
            self.client_leader = NO_LEADER if e.leader_id == node.node_id else e.leader_id
            return None
        self.client_leader = node.node_id
        self.result.proposals_acked += 1
        self._note(f"propose@{node.node_id}", f"{len(records)} records -> last offset {last}")
        epoch = core.epoch
        self._carry_out(node, ready)
        return epoch

    def _on_fault(self, event: _Fault) -> None:
        del event
        if self.healed:
            return
        self._push(self._exp(self.config.fault_interval_ms), _Fault())
        kind = self.rng.choices(
            ["crash", "crash-in-ready", "split", "one-way", "isolate-leader", "resign", "wipe"],
            weights=[3, 3, 2, 2, 2, 1, 1],
        )[0]
        if kind in ("crash", "crash-in-ready", "resign"):
            self._fault_on_node(kind)
        elif kind == "wipe":
            self._wipe_observer()
        else:
            self._partition(kind)

    def _fault_on_node(self, kind: str) -> None:
        up = [n for n in self.nodes.values() if n.core is not None]
        if kind == "resign":
            up = [n for n in up if n.core is not None and n.core.role == "leader"]
        if not up:
            return
        node = self.rng.choice(up)
        core = node.core
        assert core is not None
        if kind == "crash":
            self._crash(node)
        elif kind == "crash-in-ready":
            node.crash_in_ready = True
        elif core.role == "leader":
            self._note(f"resign@{node.node_id}")
            self._carry_out(node, core.resign(self.now))

    def _on_unreachable(self, event: _Unreachable) -> None:
        node = self.nodes[event.node_id]
        if node.core is not None:
            self._note(f"unreachable@{node.node_id}", f"node {event.peer}")
            self._carry_out(node, node.core.peer_unreachable(event.peer, self.now))

    def _on_wrong_report(self, event: _WrongReport) -> None:
        """A transport says a live node is down (a reset connection, say)."""
        del event
        if self.healed:
            return
        self._push(self._exp(self.config.wrong_report_interval_ms), _WrongReport())
        node, peer = self.rng.sample(sorted(self.nodes), 2)
        self._push(self.now, _Unreachable(node, peer))

    def _report_crash(self, crashed: SimNode) -> None:
        """Each live node's transport notices the crash (a reset connection) with some
        probability, a network delay later."""
        for node in self.nodes.values():
            up = node is not crashed and node.core is not None
            if up and self.rng.random() < self.config.crash_report_probability:
                delay = self.rng.randint(self.config.delay_min_ms, self.config.delay_max_ms)
                self._push(self.now + delay, _Unreachable(node.node_id, crashed.node_id))

    def _wipe_observer(self) -> None:
        observers = [n for n in self.nodes.values() if not n.is_voter]
        if not observers:
            return
        node = self.rng.choice(observers)
        if node.core is not None:
            self._crash(node)
        self._note(f"wipe@{node.node_id}", "observer loses its whole data dir")
        node.log = SimLog()
        node.quorum = QuorumState()
        node.snapshots.clear()
        node.snap_end = 0
        node.epoch_seen = 0

    def _partition(self, kind: str) -> None:
        ids = sorted(self.nodes)
        rng = self.rng
        blocked: set[tuple[int, int]] = set()
        if kind == "split":
            side = set(rng.sample(ids, rng.randint(1, len(ids) - 1)))
            blocked = {(a, b) for a in ids for b in ids if (a in side) != (b in side)}
        elif kind == "one-way":
            pairs = [(a, b) for a in ids for b in ids if a != b]
            blocked = set(rng.sample(pairs, rng.randint(1, len(ids))))
        else:
            leaders = [n.node_id for n in self.nodes.values() if n.core and n.core.role == "leader"]
            for leader in leaders:
                blocked |= {(leader, b) for b in ids if b != leader}
                blocked |= {(b, leader) for b in ids if b != leader}
        self.partition_gen += 1
        self.net.blocked = blocked
        self.result.partitions += 1
        self._note(f"partition:{kind}", sorted(blocked))
        duration = rng.randint(self.config.partition_min_ms, self.config.partition_max_ms)
        self._push(self.now + duration, _Heal(self.partition_gen))

    def _on_heal(self, event: _Heal) -> None:
        if event.gen == self.partition_gen and self.net.blocked:
            self.net.blocked = set()
            self._note("partition healed")

    def _on_restart(self, event: _Restart) -> None:
        node = self.nodes[event.node_id]
        if node.core is None:
            self._restart(node)

    def _on_snapshot_request(self, event: _SnapshotRequest) -> None:
        del event
        self._push(self._exp(self.config.snapshot_request_interval_ms), _SnapshotRequest())
        up = [n for n in self.nodes.values() if n.core is not None]
        if up:
            self._take_snapshot(self.rng.choice(up))

    def _on_start_liveness(self, event: _StartLiveness) -> None:
        del event
        self.healed = True
        self.net.heal()
        self._note("liveness phase: faults healed")
        for node in self.nodes.values():
            node.crash_in_ready = False
            if node.core is None:
                self._restart(node)
        self.liveness = [_ClientRecord(b"live%d" % i) for i in range(self.config.liveness_records)]
        self._push(self.now, _LivenessClient())

    def _on_liveness_client(self, event: _LivenessClient) -> None:
        """Propose the liveness records; re-propose those a newer leader may have dropped."""
        del event
        leader_epoch = max(
            (n.core.epoch for n in self.nodes.values() if n.core and n.core.role == "leader"),
            default=-1,
        )
        retry = []
        for record in self.liveness:
            if record.data in self.committed_data:
                continue
            if record.epoch is None:
                retry.append(record)
            elif leader_epoch > record.epoch:
                self.result.liveness_lost_acks += 1
                self._note("liveness: re-propose, acknowledged by an older leader", record)
                retry.append(record)
        if retry:
            self._propose_liveness(retry)
        elif self._liveness_done():
            self.result.liveness_ms = self.now - self.config.safety_ms
            self._final_checks()
            self.done = True
            return
        self._push(self.now + self.config.liveness_client_interval_ms, _LivenessClient())

    def _propose_liveness(self, records: list[_ClientRecord]) -> None:
        # The client finds the newest leader at once (redirects are not what is under test).
        leaders = [n for n in self.nodes.values() if n.core is not None and n.core.role == "leader"]
        if leaders:
            self.client_leader = max(leaders, key=lambda n: n.core.epoch if n.core else -1).node_id
        acked = self._propose([r.data for r in records])
        if acked is not None:
            for record in records:
                record.epoch = acked

    def _liveness_done(self) -> bool:
        offsets = [self.committed_data.get(r.data) for r in self.liveness]
        if any(o is None for o in offsets):
            return False
        top = max(o for o in offsets if o is not None)
        return all(n.core is not None and n.sm.applied_end > top for n in self.nodes.values())

    def _liveness_report(self) -> str:
        unacked = sum(1 for r in self.liveness if r.epoch is None)
        uncommitted = sum(1 for r in self.liveness if r.data not in self.committed_data)
        behind = [
            n.node_id
            for n in self.nodes.values()
            if n.core is None or n.sm.applied_end < self.commit_end
        ]
        return (
            f"liveness: not done {self.config.liveness_ms} ms after healing: of "
            f"{len(self.liveness)} client records {unacked} never acknowledged, "
            f"{uncommitted} not committed; commit end {self.commit_end}, nodes behind it {behind}"
        )

    def _final_checks(self) -> None:
        for offset in sorted(self.committed):
            self._check_majority(offset, self.committed[offset])
        for node in self.nodes.values():
            for offset, data in node.sm.records:
                self._check_applied(node, offset, data)

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
            self._push(self.now + down, _Restart(node.node_id))

    def _restart(self, node: SimNode) -> None:
        snapshot = node.latest_snapshot()
        log = node.log
        if snapshot is not None and snapshot.end_offset > log.end_offset:
            log.restart(snapshot.end_offset)  # as Kafka's log does at start-up
        meta = LogMeta(log.start_offset, log.end_offset, log.epochs(), snapshot)
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
        if not batch.is_control and len(decode_records(batch.data)) != (
            batch.last_offset - batch.base_offset + 1
        ):
            self._fail(f"node {node.node_id} appends a batch whose record count is wrong: {batch}")
        log.append(batch)

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
            self._push(self.now + delay, _Deliver(envelope))

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
        self._push(max(deadline, self.now), _Tick(node.node_id, node.tick_gen))

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

    def _check_applied(self, node: SimNode, offset: int, data: bytes) -> None:
        entry = self.committed.get(offset)
        if entry is None or entry[1] or entry[2] != data:
            self._fail(
                f"node {node.node_id} applied {data!r} at {offset}; the committed log has {entry}"
            )

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

    # -- invariants ------------------------------------------------------------------------
    def _check_node(self, node: SimNode) -> None:
        core = node.core
        assert core is not None
        nid, epoch, role = node.node_id, core.epoch, core.role
        if epoch < node.epoch_seen or epoch < node.quorum.epoch:
            before = max(node.epoch_seen, node.quorum.epoch)
            self._fail(f"node {nid} went back to epoch {epoch} from {before}")
        node.epoch_seen = epoch
        if role == "leader":
            first = self.leaders.setdefault(epoch, nid)
            if first != nid:
                self._fail(f"two leaders in epoch {epoch}: {first} and {nid}")
            if len(self.leaders) > self.result.elections:
                self.result.elections = len(self.leaders)
        if not node.is_voter and role in ("leader", "candidate", "prospective", "follower"):
            self._fail(f"observer {nid} became {role}")
        if role in ("leader", "follower", "observer") and core.leader_id != NO_LEADER:
            believed = self.believed.setdefault(epoch, core.leader_id)
            if believed != core.leader_id:
                self._fail(
                    f"node {nid} follows {core.leader_id} in epoch {epoch}, another followed "
                    f"{believed}"
                )
        self._observe(node)

    def _observe(self, node: SimNode) -> None:
        """Learn committed entries below the node's HW and check its log agrees."""
        core = node.core
        assert core is not None
        hw = core.high_watermark
        if hw < node.hw_seen:
            self._fail(f"node {node.node_id}: HW went back from {node.hw_seen} to {hw}")
        node.hw_seen = hw
        log = node.log
        if hw > log.end_offset:
            self._fail(f"node {node.node_id}: HW {hw} beyond its durable log end {log.end_offset}")
        if hw <= node.verified_upto:
            return
        for offset, entry in log.entries(node.verified_upto, hw):
            self._commit(offset, entry, node)
        node.verified_upto = hw

    def _commit(self, offset: int, entry: Entry, node: SimNode) -> None:
        known = self.committed.get(offset)
        if known is None:
            self.committed[offset] = entry
            if not entry[1]:
                self.committed_data[entry[2]] = offset
            self.commit_end = max(self.commit_end, offset + 1)
            self._check_majority(offset, entry)
        elif known != entry:
            self._fail(
                f"node {node.node_id} has {entry} at committed offset {offset}; committed: {known}"
            )

    def _holds(self, node: SimNode, offset: int, entry: Entry) -> bool:
        return node.snapshot_end() > offset or node.log.entry(offset) == entry

    def _check_majority(self, offset: int, entry: Entry) -> None:
        holders = [v for v in sorted(self.voters) if self._holds(self.nodes[v], offset, entry)]
        if len(holders) < self.majority:
            self._fail(
                f"committed offset {offset} {entry} is durable only on voters {holders}, "
                f"not a majority"
            )

    def _recheck(self, node: SimNode, lo: int, hi: int) -> None:
        """A node's durable log lost [lo, hi): committed offsets there need a majority still."""
        if not node.is_voter:
            return
        for offset in range(max(lo, 0), min(hi, self.commit_end)):
            entry = self.committed.get(offset)
            if entry is not None:
                self._check_majority(offset, entry)


def brief(value: object) -> str:
    """A message or value for the trace: batches shown by offsets and epoch, not bytes."""
    if isinstance(value, Batch):
        kind = "control" if value.is_control else "batch"
        return f"{kind}[{value.base_offset}..{value.last_offset}]e{value.epoch}"
    if isinstance(value, (FetchResponse, FetchSnapshotResponse)):
        parts = []
        for f in fields(value):
            item = getattr(value, f.name)
            if f.name == "batches":
                item = "(" + ", ".join(brief(b) for b in item) + ")"
            elif f.name == "chunk":
                item = f"<{len(item)} bytes>"
            parts.append(f"{f.name}={item}")
        return f"{type(value).__name__}({', '.join(parts)})"
    if isinstance(value, tuple):
        return "(" + ", ".join(brief(v) for v in value) + ")"
    return str(value)


def run_seed(seed: int, config: SimConfig | None = None) -> SimResult:
    """Run one seed; raises ``SimulationFailure`` on any violation."""
    return Simulation(seed, config).run()
