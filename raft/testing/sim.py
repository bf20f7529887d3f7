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

The pieces: ``sim_storage.py`` (the log, snapshot files and state machine of a node),
``sim_network.py`` (the network and the events), ``sim_state.py`` (settings, outcome, the state
a run shares), ``sim_invariants.py`` (the safety checks), ``sim_ready.py`` (carrying out a
``Ready``: storage steps, sends, applying, crashes and restarts); this module runs the loop,
the faults, the clients and the liveness phase.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from raft.core import RECORD_OVERHEAD_BYTES, NotLeader, RecordTooLarge
from raft.messages import NO_LEADER, QuorumState
from raft.testing.sim_network import (
    Deliver,
    Event,
    Fault,
    Heal,
    LivenessClient,
    Propose,
    Restart,
    SnapshotRequest,
    StartLiveness,
    Tick,
    Unreachable,
    WrongReport,
)
from raft.testing.sim_ready import ReadySteps
from raft.testing.sim_state import SimConfig, SimResult, SimulationFailure
from raft.testing.sim_storage import SimLog

__all__ = ["SimConfig", "SimResult", "Simulation", "SimulationFailure", "run_seed"]


@dataclass(slots=True)
class _ClientRecord:
    """A liveness-phase record: proposed (again) until it is committed."""

    data: bytes
    epoch: int | None = None  # the epoch of the leader that acknowledged it


class Simulation(ReadySteps):
    """One seeded run. ``run()`` returns a ``SimResult`` or raises ``SimulationFailure``."""

    def __init__(self, seed: int, config: SimConfig | None = None) -> None:
        super().__init__(seed, config)
        self.partition_gen = 0
        self.client_leader = NO_LEADER
        self.proposal_count = 0
        self.liveness: list[_ClientRecord] = []
        self.done = False
        self._handlers: dict[type, Callable[[Event], None]] = {
            Deliver: self._on_deliver,  # type: ignore[dict-item]
            Tick: self._on_tick,  # type: ignore[dict-item]
            Propose: self._on_propose,  # type: ignore[dict-item]
            Fault: self._on_fault,  # type: ignore[dict-item]
            Unreachable: self._on_unreachable,  # type: ignore[dict-item]
            WrongReport: self._on_wrong_report,  # type: ignore[dict-item]
            Restart: self._on_restart,  # type: ignore[dict-item]
            Heal: self._on_heal,  # type: ignore[dict-item]
            SnapshotRequest: self._on_snapshot_request,  # type: ignore[dict-item]
            StartLiveness: self._on_start_liveness,  # type: ignore[dict-item]
            LivenessClient: self._on_liveness_client,  # type: ignore[dict-item]
        }

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> SimResult:
        config = self.config
        for node in self.nodes.values():
            self._push(self.rng.randint(0, 50), Restart(node.node_id))
        self._push(self._exp(config.proposal_interval_ms), Propose())
        self._push(self._exp(config.fault_interval_ms), Fault())
        self._push(self._exp(config.wrong_report_interval_ms), WrongReport())
        self._push(self._exp(config.snapshot_request_interval_ms), SnapshotRequest())
        self._push(config.safety_ms, StartLiveness())
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

    # -- events ----------------------------------------------------------------------------
    def _on_deliver(self, event: Deliver) -> None:
        envelope = event.envelope
        node = self.nodes[envelope.destination]
        if node.core is None:
            return
        self._note(f"{envelope.source}->{envelope.destination}", envelope.payload)
        self._carry_out(node, node.core.step(envelope, self.now))

    def _on_tick(self, event: Tick) -> None:
        node = self.nodes[event.node_id]
        if node.core is None or event.gen != node.tick_gen:
            return
        node.tick_at = None
        self._carry_out(node, node.core.tick(self.now))

    def _on_propose(self, event: Propose) -> None:
        del event
        if not self.healed:
            self._push(self._exp(self.config.proposal_interval_ms), Propose())
        if self.rng.random() < self.config.burst_probability:
            self._propose(self._burst())
            return
        count = self.rng.randint(1, self.config.records_per_proposal_max)
        records = [self._record_data() for _ in range(count)]
        self._propose(records)

    def _burst(self) -> list[bytes]:
        """Records spanning several batches; perhaps one larger than a batch (alone in its
        own) or than the log stores (the proposal is refused)."""
        rng, config = self.rng, self.config
        count = rng.randint(config.records_per_proposal_max + 1, config.burst_records_max)
        records = [self._record_data() for _ in range(count)]
        largest = config.log_max_batch_bytes - RECORD_OVERHEAD_BYTES  # what the log stores
        kind = rng.choice(["plain", "large", "too large"])
        if kind != "plain":
            low = config.raft.max_batch_bytes - RECORD_OVERHEAD_BYTES + 1
            size = rng.randint(low, largest) if kind == "large" else largest + rng.randint(1, 99)
            index = rng.randrange(count)
            records[index] = records[index].ljust(size, b".")
        return records

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
        except RecordTooLarge as e:
            if max(len(r) for r in records) <= core.max_record_bytes:
                self._fail(f"node {node.node_id} refuses records that fit its log: {e}")
            self.refused.update(records)
            self.result.proposals_refused += 1
            self._note(f"refused@{node.node_id}", e)
            return None
        self.client_leader = node.node_id
        self.result.proposals_acked += 1
        self._note(f"propose@{node.node_id}", f"{len(records)} records -> last offset {last}")
        epoch = core.epoch
        self._carry_out(node, ready)
        return epoch

    def _on_fault(self, event: Fault) -> None:
        del event
        if self.healed:
            return
        self._push(self._exp(self.config.fault_interval_ms), Fault())
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

    def _on_unreachable(self, event: Unreachable) -> None:
        node = self.nodes[event.node_id]
        if node.core is not None:
            self._note(f"unreachable@{node.node_id}", f"node {event.peer}")
            self._carry_out(node, node.core.peer_unreachable(event.peer, self.now))

    def _on_wrong_report(self, event: WrongReport) -> None:
        """A transport says a live node is down (a reset connection, say)."""
        del event
        if self.healed:
            return
        self._push(self._exp(self.config.wrong_report_interval_ms), WrongReport())
        node, peer = self.rng.sample(sorted(self.nodes), 2)
        self._push(self.now, Unreachable(node, peer))

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
        self._push(self.now + duration, Heal(self.partition_gen))

    def _on_heal(self, event: Heal) -> None:
        if event.gen == self.partition_gen and self.net.blocked:
            self.net.blocked = set()
            self._note("partition healed")

    def _on_restart(self, event: Restart) -> None:
        node = self.nodes[event.node_id]
        if node.core is None:
            self._restart(node)

    def _on_snapshot_request(self, event: SnapshotRequest) -> None:
        del event
        self._push(self._exp(self.config.snapshot_request_interval_ms), SnapshotRequest())
        up = [n for n in self.nodes.values() if n.core is not None]
        if up:
            self._take_snapshot(self.rng.choice(up))

    def _on_start_liveness(self, event: StartLiveness) -> None:
        del event
        self.healed = True
        self.net.heal()
        self._note("liveness phase: faults healed")
        for node in self.nodes.values():
            node.crash_in_ready = False
            if node.core is None:
                self._restart(node)
        self.liveness = [_ClientRecord(b"live%d" % i) for i in range(self.config.liveness_records)]
        self._push(self.now, LivenessClient())

    def _on_liveness_client(self, event: LivenessClient) -> None:
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
        self._push(self.now + self.config.liveness_client_interval_ms, LivenessClient())

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


def run_seed(seed: int, config: SimConfig | None = None) -> SimResult:
    """Run one seed; raises ``SimulationFailure`` on any violation."""
    return Simulation(seed, config).run()
