"""A deterministic simulation of partition replication: real ``Partition`` objects on real
logs, a model controller, a faulty network, and replication's safety properties checked after
every event.

How this works. One seeded ``random.Random`` decides everything (delays, drops, faults, which
broker a client asks), time is a virtual clock in milliseconds, and one heap of ``(time,
seq, event)`` orders what happens, so running a seed twice gives the same run.

- Brokers: each holds, for every partition it is a replica of, a real ``Partition`` on a real
  ``Log`` in its own directory, and drives it as the broker does (broker/replica_manager.py,
  replica_fetcher.py, handlers/fetch.py, alter_partition.py): it applies metadata images
  (``make_leader`` / ``make_follower``); a follower keeps one fetch in flight to its leader,
  which answers from ``read_for_follower`` (long-polled until an append, a role change or
  ``fetch_wait_max_ms``), and applies the answer with ``apply_fetch_answer`` only while it
  still follows the same leader at the same epoch; a fetch says the follower's broker epoch
  (Fetch v15's replica_state) and a leader proposes ISR changes (AlterPartition, members'
  broker epochs from its own image; a joining follower only as the incarnation its latest
  fetch said, KIP-903), checks for lagging followers
  every half ``replica_lag_time_max_ms`` and checkpoints its HW; every broker heartbeats.
  With ``fetch_sessions`` followers fetch in fetch sessions as the brokers do: that is
  ``broker.testing.SessionSimulation``, a layer above (it drives the broker's own session
  logic), built on the hooks here (``_followed``, ``_unfollowed``, ``_on_broker_message``,
  ``_on_timer``, ``_wake_parked``, ``_open``, ``_crash``).
- Controller: ``ModelController`` holds the partition states and broker registrations and
  applies the rules of controller/elections.py and brokers.py: AlterPartition refused on a
  stale broker epoch, leader epoch or partition epoch, or a fenced / restarted member; a
  broker whose session expires is fenced, leaves every ISR where it is not the last member
  and, if it led, the first alive ISR member in replica order leads (unclean election off:
  none if there is no such member); an unfenced broker leads the leaderless partitions whose
  ISR holds it; a restarted broker registers with a new broker epoch once the old session
  expired. Every leader change bumps the leader epoch, every change the partition epoch.
  Where configured, the topic's unclean.leader.election.enable changes (a fault flips it; an
  operator sets it on for an offline partition, ``operator_reaction_ms``) and the controller's
  leaderless duty (``elect_leaderless``) runs after such a change, after a failover and every
  ``leaderless_recheck_ms``, as ``ControllerService._elect_leaderless`` does. Where
  configured, the topic's min.insync.replicas changes too (``min_isr_config_weight``); it
  travels in the images, and each broker applies it with its image (``update_config``).
- Metadata: each new image is pushed to each broker after its own random delay (a few very
  late); heartbeat answers carry the latest image too, so brokers learn changes late and out
  of step with each other, and one cut off from the controller catches up when it heals. A
  broker applies an image only if it is newer, and (like the real broker) serves nothing
  after a restart until an image shows it registered and unfenced.
- Network: a message is lost if a partition cuts its link (when sent or when it arrives) or
  at random, else delivered after a random delay (a few very slow: reordering). Requests and
  answers to a crashed or restarted broker are lost with its connections.
- Faults (safety phase): crash (logs abandoned; reopened from disk with the last checkpointed
  HW and recovery point; a checkpoint pass fsyncs rolled segments as the log manager does),
  power loss (a crash that also loses the page cache: every unflushed byte and segment file
  name may go, see power_loss.py; only in a quiet cluster, where Kafka's durability promise
  holds, see ``_power_loss_allowed``), pause (SIGSTOP: the broker's events wait until it
  resumes; long pauses outlive its session), network partitions (a split, a broker cut
  from the controller, a leader cut from its followers, one-way links) that heal after a
  while, and controller failovers where configured (no active controller for a while, then
  a fresh session for every unfenced broker, ``_controller_back``).
- Clients: a producer sends acks=-1 appends of unique values (never retried, so each value
  may be in the log once at most) to the broker it believes leads; a value is acknowledged
  when its commit callback runs with None. With ``produce_timeout_ms`` a wait still open
  that long is forgotten and answered REQUEST_TIMED_OUT, as the produce handler does; its
  callback must never run after that. A consumer reads below the HW of a broker that
  believes it leads.
- Invariants, after every event: a leader's HW never goes back within its leader epoch;
  the batches (base, last offset, epoch, CRC) below any leader's HW (a deposed leader that
  does not know it yet included) form one committed log that never changes; every replica
  agrees with it below its own HW; every member of the controller's ISR holds all of it (any
  of them may be elected next); no replica truncates below its own HW; a value a consumer
  read at an offset is never read differently there; the records a follower is given start
  at its log end (it asked from there). Each replica's batch list is kept in step with its
  log (``Mirror``) and checked against a fresh read every
  ``verify_every_events`` events.
- Phases: faults for ``safety_ms``; then everything heals (crashed brokers restart, links
  reopen, the network stops dropping) and within ``liveness_ms`` the producer must get
  ``liveness_acks`` more values acknowledged and, once it stops, every partition must have
  a leader with every replica in the ISR and every log identical up to the HW. Then every
  acknowledged value must be in the leader's log exactly once, at the offset it was
  acknowledged at, and every value a consumer read must be where it was read.

A violation (or an exception from the code under test) raises ``SimulationFailure`` naming
the seed, the virtual time, how to replay it and the tail of the event trace.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import heapq
import random
import shutil
import tempfile
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, NoReturn

from replication.errors import (
    NotLeaderOrFollower,
    OffsetOutOfRange,
    ReplicationError,
    RequestTimedOut,
)
from replication.follower import FetchAnswer, Outcome, apply_fetch_answer, whole_batches
from replication.partition import CommitCallback, Partition, Role
from replication.testing.power_loss import lose_page_cache
from storage.batch import BatchHeader
from storage.config import LogConfig
from storage.loader import load_log
from storage.log import AppendInfo, Log
from storage.records import RecordInput, build_batch, iter_decoded

__all__ = [
    "ModelController",
    "PState",
    "SimConfig",
    "SimResult",
    "Simulation",
    "SimulationFailure",
    "run_seed",
]

CONTROLLER = 0  # node ids on the simulated network; brokers are 1..n
CLIENT = 1000
NO_LEADER = -1
NO_ERROR = 0
TOPIC = "sim"
TOPIC_ID = bytes(range(16))
BASE_MS = 1_700_000_000_000  # virtual time 0 as a wall-clock timestamp, for the logs
MAX_EVENTS_AT_ONE_INSTANT = 20_000


# -- configuration and outcome ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimConfig:
    """A simulated cluster, its clients and faults; times in virtual milliseconds."""

    brokers: int = 3
    partitions: int = 1
    replication_factor: int = 0  # 0: every broker is a replica of every partition
    min_insync_replicas: int = 2
    safety_ms: int = 12_000
    liveness_ms: int = 30_000
    # network
    delay_min_ms: int = 1
    delay_max_ms: int = 20
    slow_probability: float = 0.03
    slow_max_ms: int = 800
    drop_probability: float = 0.02
    # metadata propagation: most pushes within metadata_delay_max_ms, a few much later
    metadata_delay_max_ms: int = 60
    metadata_slow_probability: float = 0.1
    metadata_slow_max_ms: int = 2_500
    # controller and brokers
    session_timeout_ms: int = 1_200
    heartbeat_interval_ms: int = 200
    controller_tick_ms: int = 100
    replica_lag_time_max_ms: int = 800
    fetch_wait_max_ms: int = 150
    fetch_max_bytes: int = 2_048
    fetch_backoff_ms: int = 100
    request_timeout_ms: int = 600
    alter_retry_backoff_ms: int = 200
    hw_checkpoint_interval_ms: int = 500
    segment_bytes: int = 4_096
    # faults: mean time between them, and how long each lasts
    fault_interval_ms: int = 1_000
    down_min_ms: int = 100
    down_max_ms: int = 3_000
    pause_min_ms: int = 100
    pause_max_ms: int = 2_500
    partition_min_ms: int = 200
    partition_max_ms: int = 3_000
    slow_broker_min_ms: int = 50
    slow_broker_max_ms: int = 600
    # of crashes, the share that also lose the page cache, where that is allowed (see
    # Simulation._power_loss_allowed): every unflushed byte and file name may be lost
    power_loss_probability: float = 0.5
    # the weight of controller failovers among the faults (the others weigh 1-3 each); 0, the
    # default, leaves every seed's history as it was before failovers existed
    controller_failover_weight: int = 0
    # followers fetch as the real ones do: one fetcher per leader, in a fetch session
    # (KIP-227) whose leader side watches quiet partitions; run by
    # broker.testing.SessionSimulation (broker.testing.run_seed). False, the default,
    # fetches each partition on its own, as before sessions were simulated
    fetch_sessions: bool = False
    # the produce handler asks for an acks=-1 append's commit a loop turn after the append
    # (broker/handlers/produce.py): here up to this many ms later, so that ISR changes land
    # in between. 0, the default, asks at once and leaves every seed's history as it was
    produce_commit_delay_max_ms: int = 0
    # the controller may elect an out-of-sync replica when no ISR member is alive (Kafka's
    # unclean.leader.election.enable): records only the old ISR had may be lost, and the
    # checks of the log are taken afresh from the new leader's log (``_new_era``). False, the
    # default, leaves every seed's history as it was
    unclean_leader_election: bool = False
    # an acks=-1 produce still waiting this long after its append is answered
    # REQUEST_TIMED_OUT and its wait forgotten, as the produce handler does with the
    # request's timeout_ms (broker/handlers/produce.py): its values may still be committed,
    # but a forgotten wait is never acknowledged. 0, the default, waits for the outcome and
    # leaves every seed's history as it was
    produce_timeout_ms: int = 0
    # the topic's unclean.leader.election.enable changes now and then: the weight of such a
    # change among the faults (the controller must be active; it flips the setting). A
    # committed change makes the controller's leaderless duty run at its next tick, as
    # ControllerService does, and the duty runs every ``leaderless_recheck_ms`` anyway (its
    # periodic pass, LEADERLESS_RECHECK_INTERVAL_S) and once after a failover. 0, the
    # default for both, leaves every seed's history as it was
    unclean_config_weight: int = 0
    leaderless_recheck_ms: int = 0
    # an operator watches for offline partitions (no leader, no ISR member alive, another
    # replica alive): one seen while unclean election is off gets it set on within this many
    # ms (Kafka's way out), unless it recovered meanwhile. 0, the default: nobody watches
    operator_reaction_ms: int = 0
    # the topic's min.insync.replicas is set to a value in [1, replication factor] now and
    # then (the weight of such a change among the faults; the controller must be active):
    # each broker applies it with the image that carries it, as the replica manager does,
    # and every acks=-1 acknowledgement is checked against the value of the image its
    # leader had applied. 0, the default, leaves every seed's history as it was
    min_isr_config_weight: int = 0
    # clients
    produce_interval_ms: int = 25
    values_per_request_max: int = 3
    consume_interval_ms: int = 50
    consume_max_bytes: int = 1_024
    liveness_acks: int = 10
    liveness_check_ms: int = 100
    # checking and tracing
    verify_every_events: int = 2_000
    trace_len: int = 60

    def __post_init__(self) -> None:
        rf = self.replicas_per_partition
        if not 1 <= self.brokers <= 9 or not 1 <= self.partitions <= 16:
            raise ValueError("brokers must be in [1, 9] and partitions in [1, 16]")
        if not 1 <= rf <= self.brokers or not 1 <= self.min_insync_replicas <= rf:
            raise ValueError("need 1 <= min_insync_replicas <= replication_factor <= brokers")
        if self.session_timeout_ms <= 2 * self.heartbeat_interval_ms:
            raise ValueError("session_timeout_ms must exceed two heartbeat intervals")
        if self.request_timeout_ms <= 2 * self.delay_max_ms:
            raise ValueError("request_timeout_ms must exceed a round trip")
        weights = (
            self.controller_failover_weight,
            self.unclean_config_weight,
            self.min_isr_config_weight,
        )
        times = (self.produce_timeout_ms, self.leaderless_recheck_ms, self.operator_reaction_ms)
        if min(*weights, *times) < 0:
            raise ValueError(
                "controller_failover_weight, unclean_config_weight, min_isr_config_weight,"
                " produce_timeout_ms, leaderless_recheck_ms and operator_reaction_ms must be"
                " >= 0"
            )

    @property
    def replicas_per_partition(self) -> int:
        return self.replication_factor or self.brokers

    def replay_command(self, seed: int) -> str:
        changed = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default
        ]
        module = "broker.testing" if self.fetch_sessions else "replication.testing"
        return (
            f'python -c "from {module} import SimConfig, run_seed; '
            f'run_seed({seed}, SimConfig({", ".join(changed)}), trace=True)"'
        )


@dataclass(slots=True)
class SimResult:
    seed: int
    virtual_ms: int = 0
    events: int = 0
    messages: int = 0
    crashes: int = 0
    power_losses: int = 0
    pauses: int = 0
    network_partitions: int = 0
    controller_failovers: int = 0
    leader_changes: int = 0
    isr_changes: int = 0
    quiet_skips: int = 0  # partitions session fetches skipped as watched (fetch_sessions)
    truncations: int = 0
    unclean_elections: int = 0  # taken over by their new leaders (unclean_leader_election)
    produce_timeouts: int = 0  # acks=-1 waits ended by produce_timeout_ms
    unclean_config_changes: int = 0  # unclean.leader.election.enable flipped
    leaderless_elections: int = 0  # leaders the leaderless duty elected (unclean ones too)
    min_isr_changes: int = 0  # min.insync.replicas set (min_isr_config_weight)
    values_sent: int = 0
    values_acked: int = 0
    values_read: int = 0
    committed_batches: int = 0
    liveness_ms: int = 0  # from healing to convergence


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


# -- the model controller -----------------------------------------------------------------------


class PState(NamedTuple):
    """A partition's state as the controller has it (a ``PartitionStateView``)."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int


class BrokerReg(NamedTuple):
    """A broker's registration: unfenced once it has applied ``registered_version``."""

    epoch: int
    fenced: bool
    incarnation: int
    registered_version: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One metadata image: what a broker learns, whole, from a push or a heartbeat answer."""

    version: int
    partitions: tuple[PState, ...]
    brokers: dict[int, BrokerReg]
    min_insync_replicas: int  # the topic's min.insync.replicas


@dataclass(frozen=True, slots=True)
class AlterReq:
    pid: int
    broker: int
    broker_epoch: int
    leader_epoch: int
    partition_epoch: int
    members: tuple[tuple[int, int], ...]  # (broker id, broker epoch) as the leader sees them
    req_id: int


def choose_leader(replicas: Sequence[int], isr: Sequence[int], alive: frozenset[int]) -> int:
    """controller/placement.py with unclean election off: the first replica in replica
    order that is alive and in the ISR, else none."""
    return next((r for r in replicas if r in isr and r in alive), NO_LEADER)


class ModelController:
    """The controller's partition and broker rules (controller/elections.py, brokers.py) over
    plain values; time is an argument. Every public call that changes something bumps
    ``version`` once (one committed metadata batch)."""

    def __init__(
        self,
        states: Sequence[PState],
        broker_ids: Sequence[int],
        session_timeout_ms: int,
        unclean: bool = False,
        min_insync_replicas: int = 1,
    ) -> None:
        self.partitions = list(states)
        self.unclean = unclean
        self.min_insync_replicas = min_insync_replicas
        self.unclean_epochs: dict[int, list[int]] = {}  # pid -> leader epochs elected unclean
        self.brokers = {b: BrokerReg(b, False, 1, 0) for b in broker_ids}
        self.last_heartbeat_ms = dict.fromkeys(broker_ids, 0)
        self.next_broker_epoch = max(broker_ids) + 1
        self.session_timeout_ms = session_timeout_ms
        self.version = 1
        self.leader_changes = 0
        self.isr_changes = 0
        self._dirty = False

    def snapshot(self) -> Snapshot:
        return Snapshot(
            self.version, tuple(self.partitions), dict(self.brokers), self.min_insync_replicas
        )

    def alive(self) -> frozenset[int]:
        return frozenset(b for b, reg in self.brokers.items() if not reg.fenced)

    # -- requests --------------------------------------------------------------------------
    def heartbeat(self, broker: int, broker_epoch: int, metadata_version: int, now_ms: int) -> None:
        """A heartbeat keeps the session; a fenced broker that has caught up is unfenced. One
        from a previous incarnation (an older epoch) is STALE_BROKER_EPOCH: ignored."""
        reg = self.brokers[broker]
        if reg.epoch != broker_epoch:
            return
        self.last_heartbeat_ms[broker] = now_ms
        if reg.fenced and metadata_version >= reg.registered_version:
            self._unfence(broker)
        self._commit()

    def register(self, broker: int, incarnation: int, now_ms: int) -> int:
        """The broker epoch of ``incarnation``'s registration (the same one again on a retry),
        or -1 while the previous incarnation's session lives (DUPLICATE_BROKER_REGISTRATION).
        The previous incarnation first leaves every ISR and leadership, as a fenced one."""
        reg = self.brokers[broker]
        if reg.incarnation == incarnation:
            return reg.epoch
        if now_ms - self.last_heartbeat_ms[broker] <= self.session_timeout_ms:
            return -1
        self._remove_from_partitions(broker, unclean=False)  # never for a new incarnation
        epoch, self.next_broker_epoch = self.next_broker_epoch, self.next_broker_epoch + 1
        self.brokers[broker] = BrokerReg(epoch, True, incarnation, self.version + 1)
        self.last_heartbeat_ms[broker] = now_ms
        self._dirty = True
        self._commit()
        return epoch

    def reset_sessions(self, now_ms: int) -> None:
        """A newly active controller gives every unfenced broker a full session timeout
        (sessions are the active controller's memory, not metadata: ``ControllerService
        ._reset_sessions``)."""
        for broker, reg in self.brokers.items():
            if not reg.fenced:
                self.last_heartbeat_ms[broker] = now_ms

    def expire_sessions(self, now_ms: int) -> list[int]:
        """Fence every unfenced broker whose last heartbeat is older than the session timeout,
        in broker id order, each on the state the previous fences left."""
        expired = [
            b
            for b in sorted(self.brokers)
            if not self.brokers[b].fenced
            and now_ms - self.last_heartbeat_ms[b] > self.session_timeout_ms
        ]
        for broker in expired:
            self._remove_from_partitions(broker, self.unclean)
            self.brokers[broker] = self.brokers[broker]._replace(fenced=True)
            self._dirty = True
        self._commit()
        return expired

    def set_unclean(self, enabled: bool) -> None:
        """A committed change of the topic's unclean.leader.election.enable (one ConfigRecord;
        ``ControllerService.IncrementalAlterConfigs``): fences and unfences follow it from
        now on; the leaderless duty (``elect_leaderless``) is the caller's to run."""
        self.unclean = enabled
        self._dirty = True
        self._commit()

    def set_min_insync(self, value: int) -> None:
        """A committed change of the topic's min.insync.replicas (one ConfigRecord)."""
        self.min_insync_replicas = value
        self._dirty = True
        self._commit()

    def elect_leaderless(self) -> None:
        """The active controller's leaderless duty (elections.elect_leaderless): a leader for
        each leaderless partition with an alive ISR member (the first in replica order) or,
        with unclean election, an alive replica while no ISR member is."""
        alive = self.alive()
        for pid, p in enumerate(self.partitions):
            if p.leader != NO_LEADER:
                continue
            if alive.intersection(p.isr):
                self._change(pid, choose_leader(p.replicas, p.isr, alive), p.isr)
            elif self.unclean:
                self._elect_unclean(pid, alive, p.isr)
        self._commit()

    def alter_partition(self, req: AlterReq) -> tuple[str, PState]:
        """AlterPartition (KIP-497, KIP-903): the error name ("" if none) and the partition
        state as committed."""
        p = self.partitions[req.pid]
        error = self.alter_error(p, req)
        if error:
            return error, p
        isr = tuple(m for m, _ in req.members)
        if set(isr) != set(p.isr):
            p = p._replace(isr=isr, partition_epoch=p.partition_epoch + 1)
            self.partitions[req.pid] = p
            self.isr_changes += 1
            self._dirty = True
        self._commit()
        return "", p

    def alter_error(self, p: PState, req: AlterReq) -> str:
        """controller/elections.py ``_check_leader`` and ``_checked_isr``, in their order."""
        reg = self.brokers.get(req.broker)
        if reg is None or reg.epoch != req.broker_epoch:
            return "STALE_BROKER_EPOCH"
        if p.leader != req.broker or p.leader_epoch != req.leader_epoch:
            return "FENCED_LEADER_EPOCH"
        if p.partition_epoch != req.partition_epoch:
            return "INVALID_UPDATE_VERSION"
        isr = [m for m, _ in req.members]
        if not isr or len(set(isr)) != len(isr) or p.leader not in isr:
            return "INVALID_REQUEST"
        for member, epoch in req.members:
            m = self.brokers.get(member)
            if member not in p.replicas or m is None or m.fenced or m.epoch != epoch:
                return "INELIGIBLE_REPLICA"
        return ""

    # -- decisions -------------------------------------------------------------------------
    def _remove_from_partitions(self, broker: int, unclean: bool) -> None:
        """``broker`` leaves every ISR where it is not the last member; where it led, the
        first alive ISR member leads, or, with ``unclean``, the first alive replica (the
        whole ISR then), or nobody (elections.remove_from_partitions)."""
        alive = self.alive() - {broker}
        for pid, p in enumerate(self.partitions):
            if broker not in p.isr:
                continue
            isr = p.isr if len(p.isr) == 1 else tuple(b for b in p.isr if b != broker)
            leader = p.leader
            if leader == broker:
                leader = choose_leader(p.replicas, isr, alive)
                if leader == NO_LEADER and unclean:
                    self._elect_unclean(pid, alive, isr)
                    continue
            self._change(pid, leader, isr)

    def _unfence(self, broker: int) -> None:
        """Unfenced, it leads the leaderless partitions whose ISR holds it and, with unclean
        election, those of which it is a replica and no ISR member is alive
        (elections.unfence_broker)."""
        self.brokers[broker] = self.brokers[broker]._replace(fenced=False)
        self._dirty = True
        alive = self.alive()
        for pid, p in enumerate(self.partitions):
            if p.leader != NO_LEADER:
                continue
            if broker in p.isr:
                self._change(pid, choose_leader(p.replicas, p.isr, alive), p.isr)
            elif self.unclean and broker in p.replicas and not alive.intersection(p.isr):
                self._elect_unclean(pid, alive, p.isr)

    def _elect_unclean(self, pid: int, alive: frozenset[int], isr: tuple[int, ...]) -> None:
        """The first alive replica leads, alone in the ISR (placement.choose_leader with
        unclean election); if none is alive, nobody leads and the ISR is ``isr``."""
        p = self.partitions[pid]
        leader = next((r for r in p.replicas if r in alive), NO_LEADER)
        if leader == NO_LEADER:
            self._change(pid, NO_LEADER, isr)
            return
        self._change(pid, leader, (leader,))
        self.unclean_epochs.setdefault(pid, []).append(self.partitions[pid].leader_epoch)

    def _change(self, pid: int, leader: int, isr: tuple[int, ...]) -> None:
        p = self.partitions[pid]
        if leader == p.leader and isr == p.isr:
            return
        leader_epoch = p.leader_epoch + 1 if leader != p.leader else p.leader_epoch
        self.partitions[pid] = PState(p.replicas, isr, leader, leader_epoch, p.partition_epoch + 1)
        self.leader_changes += leader != p.leader
        self._dirty = True

    def _commit(self) -> None:
        if self._dirty:
            self.version += 1
            self._dirty = False


# -- messages and events ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FetchReq:
    pid: int
    replica: int
    req_id: int
    fetch_offset: int
    last_epoch: int
    leader_epoch: int
    broker_epoch: int = -1  # the follower's when it sent the fetch (-1: not registered yet)


@dataclass(frozen=True, slots=True, repr=False)
class FetchResp:
    pid: int
    req_id: int
    error: int
    high_watermark: int
    log_start: int
    records: bytes
    diverging: tuple[int, int] | None

    def __repr__(self) -> str:
        return (
            f"FetchResp(p{self.pid} #{self.req_id} err={self.error} hw={self.high_watermark} "
            f"{len(self.records)}B diverging={self.diverging})"
        )


class ExtensionPayload:
    """A message of a simulation built on this one (``broker.testing``)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class AlterResp:
    pid: int
    req_id: int
    error: str
    state: PState


@dataclass(frozen=True, slots=True)
class HeartbeatReq:
    broker: int
    broker_epoch: int
    version: int


@dataclass(frozen=True, slots=True)
class RegisterReq:
    broker: int
    incarnation: int


@dataclass(frozen=True, slots=True, repr=False)
class ControllerResp:
    snapshot: Snapshot
    registered_epoch: int | None  # a RegisterReq's answer: the epoch, or -1 refused

    def __repr__(self) -> str:
        return f"ControllerResp(v{self.snapshot.version} registered={self.registered_epoch})"


@dataclass(frozen=True, slots=True)
class ProduceReq:
    pid: int
    values: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class ProduceResp:
    pid: int
    error: int


Payload = (
    FetchReq
    | FetchResp
    | ExtensionPayload
    | AlterReq
    | AlterResp
    | HeartbeatReq
    | RegisterReq
    | ControllerResp
    | ProduceReq
    | ProduceResp
)


class Msg(NamedTuple):
    src: int
    dst: int
    src_incarnation: int  # a broker's process; 0 for the controller and the client
    dst_incarnation: int
    payload: Payload


@dataclass(frozen=True, slots=True)
class Deliver:
    msg: Msg


# Broker timers (``Timer.kind``); ``token`` tells a current timer from a stale one.
HEARTBEAT, SHRINK, CHECKPOINT = "heartbeat", "shrink", "checkpoint"
FETCH, FETCH_TIMEOUT, POLL_EXPIRE, ALTER_TIMEOUT = "fetch", "fetch-timeout", "poll", "alter-to"
ALTER_RETRY = "alter-retry"
COMMIT = "commit"  # an acks=-1 append's commit asked for, produce_commit_delay_max_ms later
PRODUCE_TIMEOUT = "produce-to"  # an acks=-1 produce's wait ends, produce_timeout_ms later
# AlterPartition refusals that end a proposal (broker/alter_partition.py): checked at the
# epochs the leader holds, nothing written. Any other outcome leaves it pending, sent again.
REFUSED_FOR_GOOD = frozenset({"INELIGIBLE_REPLICA", "INVALID_REQUEST"})


@dataclass(slots=True)
class ProduceWait:
    """An acks=-1 produce's wait for its commit, as the produce handler holds it."""

    msg: Msg
    req: ProduceReq
    forget: Callable[[], None] | None = None  # what await_commit returned, once asked
    deferred: int = 0  # the COMMIT timer's token while the ask is deferred
    done: bool = False  # the commit callback ran
    timed_out: bool = False  # answered REQUEST_TIMED_OUT, the wait forgotten


@dataclass(frozen=True, slots=True)
class Timer:
    broker: int
    incarnation: int
    kind: str
    pid: int = -1
    token: int = 0


@dataclass(frozen=True, slots=True)
class MetadataPush:
    broker: int
    incarnation: int
    snapshot: Snapshot


@dataclass(frozen=True, slots=True)
class Restart:
    broker: int


@dataclass(frozen=True, slots=True)
class Heal:
    gen: int


@dataclass(frozen=True, slots=True)
class Tick:
    """A periodic duty of the controller or the clients: ``what`` names it."""

    what: str


Event = Deliver | Timer | MetadataPush | Restart | Heal | Tick


# -- a broker -----------------------------------------------------------------------------------

BatchId = tuple[int, int, int, int]  # base offset, last offset, leader epoch, CRC


@dataclass(slots=True)
class Mirror:
    """One replica's batches, kept in step with its log after every change to it;
    ``verified`` leading ones are known to match the committed log."""

    ends: list[int] = field(default_factory=list)  # each batch's next offset, ascending
    ids: list[BatchId] = field(default_factory=list)
    verified: int = 0


@dataclass(slots=True)
class Fetching:
    """The fetch of one followed partition: the leader and epoch followed, the request in
    flight (0: none) and a generation that ends stale timers."""

    leader: int
    leader_epoch: int
    gen: int
    in_flight: int = 0


@dataclass(slots=True)
class SimBroker:
    broker_id: int
    directory: Path
    incarnation: int = 0
    up: bool = False
    paused_until: int = 0
    broker_epoch: int = -1  # -1: not registered yet (after a restart)
    serving: bool = False  # applies images to its partitions: registered and unfenced once
    view: Snapshot | None = None
    partitions: dict[int, Partition] = field(default_factory=dict)
    mirrors: dict[int, Mirror] = field(default_factory=dict)
    fetching: dict[int, Fetching] = field(default_factory=dict)
    parked: dict[int, Msg] = field(default_factory=dict)  # long-polled fetches, by token
    # request id -> the proposal it carries: (pid, proposed ISR, partition epoch)
    alter_in_flight: dict[int, tuple[int, tuple[int, ...], int]] = field(default_factory=dict)
    alter_rest_until: dict[int, int] = field(default_factory=dict)
    alter_retries: dict[int, tuple[int, tuple[int, ...], int]] = field(default_factory=dict)
    hw_checkpoint: dict[int, int] = field(default_factory=dict)  # "on disk": kept on crash
    recovery_checkpoint: dict[int, int] = field(default_factory=dict)  # likewise
    leader_hw: dict[tuple[int, int], int] = field(default_factory=dict)  # (pid, epoch) -> HW

    def reset(self) -> None:
        """Forget everything the process held in memory (a crash)."""
        self.up, self.paused_until, self.broker_epoch, self.serving = False, 0, -1, False
        self.view = None
        for table in (self.partitions, self.mirrors, self.fetching, self.parked):
            table.clear()
        self.alter_in_flight.clear()
        self.alter_rest_until.clear()
        self.alter_retries.clear()
        self.leader_hw.clear()


@dataclass(slots=True)
class Ack:
    offset: int
    broker: int
    leader_epoch: int
    time_ms: int


# -- the simulation -----------------------------------------------------------------------------


class Simulation:
    """One seeded run. ``run()`` returns a ``SimResult`` or raises ``SimulationFailure``.
    ``directory`` holds the brokers' logs (a temporary one, removed afterwards, if None)."""

    SESSIONS = False  # whether this class runs configs with fetch_sessions

    def __init__(
        self, seed: int, config: SimConfig | None = None, directory: Path | None = None
    ) -> None:
        self.seed = seed
        self.config = config = config or SimConfig()
        if config.fetch_sessions and not self.SESSIONS:
            raise ValueError("fetch_sessions: run broker.testing.run_seed (SessionSimulation)")
        self.rng = random.Random(seed)
        self.now = 0
        self.queue: list[tuple[int, int, Event]] = []
        self.seq = 0
        self.ids = 0
        self.deferred_commits: dict[int, Callable[[], None]] = {}  # by timer token
        self.produce_waits: dict[int, ProduceWait] = {}  # by PRODUCE_TIMEOUT timer token
        self.result = SimResult(seed)
        self.trace: deque[tuple[int, str, object]] = deque(maxlen=config.trace_len)
        self.full_trace: list[str] | None = None
        self._own_directory = directory is None
        self.directory = directory or Path(tempfile.mkdtemp(prefix="replication-sim-"))
        broker_ids = list(range(1, config.brokers + 1))
        self.brokers = {b: SimBroker(b, self.directory / f"broker-{b}") for b in broker_ids}
        self.controller = ModelController(
            self._initial_states(),
            broker_ids,
            config.session_timeout_ms,
            unclean=config.unclean_leader_election,
            min_insync_replicas=config.min_insync_replicas,
        )
        self.log_config = LogConfig(
            segment_bytes=config.segment_bytes,
            segment_index_bytes=1_200,
            index_interval_bytes=256,
            retention_ms=None,
        )
        self.blocked: set[tuple[int, int]] = set()
        self.slow: dict[int, tuple[int, int]] = {}  # broker -> (until, extra delay ms)
        self.lossy: set[int] = set()  # lost power, not yet back in every ISR
        self.partition_gen = 0
        self.controller_down_until = 0  # a failover: no active controller until then
        self.leaderless_due = False  # the controller's leaderless duty runs at its next tick
        self.leaderless_checked_at = 0
        self.operator_pending = False  # an operator will look at the offline partitions
        self.healed = False
        self.producing = True
        self.done = False
        self.healed_at = 0
        self.acked_at_heal = 0
        self.values = 0
        self.client_leader = [p.leader for p in self.controller.partitions]
        self.consumer_position = [0] * config.partitions
        self.committed: list[list[BatchId]] = [[] for _ in range(config.partitions)]
        self.acked: list[dict[bytes, Ack]] = [{} for _ in range(config.partitions)]
        self.observed: list[dict[int, bytes | None]] = [{} for _ in range(config.partitions)]
        # the leader epoch of each partition's last unclean election its leader has applied:
        # the checks of the log start afresh from there (``_new_era``)
        self.era_epoch = [0] * config.partitions

    def _initial_states(self) -> list[PState]:
        n, rf = self.config.brokers, self.config.replicas_per_partition
        states = []
        for pid in range(self.config.partitions):
            replicas = tuple((pid + i) % n + 1 for i in range(rf))
            states.append(PState(replicas, replicas, replicas[0], 0, 0))
        return states

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> SimResult:
        try:
            self._start()
            self._loop()
        finally:
            self._close()
        return self.result

    def _start(self) -> None:
        config = self.config
        snapshot = self.controller.snapshot()
        for broker in self.brokers.values():
            self._open(broker)
            broker.broker_epoch = self.controller.brokers[broker.broker_id].epoch
            self._push(self._metadata_delay(), MetadataPush(broker.broker_id, 1, snapshot))
        self._push(config.controller_tick_ms, Tick("controller"))
        self._push(self._exp(config.produce_interval_ms), Tick("produce"))
        self._push(self._exp(config.consume_interval_ms), Tick("consume"))
        self._push(self._exp(config.fault_interval_ms), Tick("fault"))
        self._push(config.safety_ms, Tick("heal"))

    def _loop(self) -> None:
        deadline = self.config.safety_ms + self.config.liveness_ms
        same_time, last_time = 0, -1
        while self.queue and not self.done:
            time_ms, _, event = heapq.heappop(self.queue)
            if time_ms > deadline:
                break
            self.now = time_ms
            same_time = same_time + 1 if time_ms == last_time else 0
            last_time = time_ms
            if same_time > MAX_EVENTS_AT_ONE_INSTANT:
                self._fail(f"livelock: over {MAX_EVENTS_AT_ONE_INSTANT} events at one instant")
            self.result.events += 1
            self._step(event)
        if not self.done:
            self.now = max(self.now, deadline)
            self._fail(self._liveness_report())
        self.result.virtual_ms = self.now
        self.result.committed_batches = sum(len(c) for c in self.committed)
        self.result.leader_changes = self.controller.leader_changes
        self.result.isr_changes = self.controller.isr_changes

    def _step(self, event: Event) -> None:
        try:
            self._dispatch(event)
            self._check_invariants()
            if self.result.events % self.config.verify_every_events == 0:
                self._verify_mirrors()
        except SimulationFailure:
            raise
        except Exception as e:  # a bug in the code under test (or here): report the seed
            self._fail(f"{type(e).__name__} raised: {e}", e)

    def _dispatch(self, event: Event) -> None:
        broker = self._target(event)
        if broker is not None:
            if not broker.up or self._incarnation_of(event) != broker.incarnation:
                return  # for a crashed process, or an earlier incarnation of this one
            if broker.paused_until > self.now:
                self._push(broker.paused_until, event)  # stopped: it runs when resumed
                return
        match event:
            case Deliver(msg):
                self._on_deliver(msg)
            case Timer():
                self._on_timer(event)
            case MetadataPush(broker_id, _, snapshot):
                self._apply_snapshot(self.brokers[broker_id], snapshot)
            case Restart(broker_id):
                self._restart(self.brokers[broker_id])
            case Heal(gen):
                self._on_heal(gen)
            case Tick(what):
                self._on_tick(what)

    def _target(self, event: Event) -> SimBroker | None:
        match event:
            case Deliver(msg):
                return self.brokers.get(msg.dst)
            case Timer(broker_id) | MetadataPush(broker_id):
                return self.brokers[broker_id]
        return None

    @staticmethod
    def _incarnation_of(event: Event) -> int:
        match event:
            case Deliver(msg):
                return msg.dst_incarnation
            case Timer(_, incarnation) | MetadataPush(_, incarnation):
                return incarnation
        return 0

    def _on_tick(self, what: str) -> None:
        handlers: dict[str, Callable[[], None]] = {
            "controller": self._controller_tick,
            "produce": self._produce,
            "consume": self._consume,
            "fault": self._fault,
            "heal": self._start_liveness,
            "liveness": self._liveness_check,
            "operator": self._operator,
        }
        handlers[what]()

    # -- scheduling, tracing, failing ------------------------------------------------------
    def _push(self, at: int, event: Event) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (at, self.seq, event))

    def _timer(self, broker: SimBroker, at: int, kind: str, pid: int = -1, token: int = 0) -> None:
        self._push(at, Timer(broker.broker_id, broker.incarnation, kind, pid, token))

    def _exp(self, mean_ms: int) -> int:
        return self.now + 1 + int(self.rng.expovariate(1.0 / mean_ms))

    def _next_id(self) -> int:
        self.ids += 1
        return self.ids

    def _note(self, label: str, detail: object = "") -> None:
        self.trace.append((self.now, label, detail))
        if self.full_trace is not None:
            self.full_trace.append(f"{self.now:>7} {label} {detail}")

    def _fail(self, problem: str, cause: BaseException | None = None) -> NoReturn:
        lines = "\n".join(f"    {t:>7} {label} {d}" for t, label, d in self.trace)
        states = "\n".join(f"    {line}" for line in self._describe())
        replay = self.config.replay_command(self.seed)
        trace = f"{lines}\n  state:\n{states}"
        raise SimulationFailure(self.seed, self.now, problem, replay, trace) from cause

    def _describe(self) -> Iterator[str]:
        ctl = self.controller
        regs = " ".join(
            f"b{b}:e{r.epoch}{'F' if r.fenced else ''}" for b, r in sorted(ctl.brokers.items())
        )
        yield f"controller v{ctl.version} brokers {regs}"
        for pid, p in enumerate(ctl.partitions):
            yield f"  p{pid}: {p}"
        for broker in self.brokers.values():
            yield self._describe_broker(broker)

    def _describe_broker(self, broker: SimBroker) -> str:
        if not broker.up:
            return f"b{broker.broker_id}: down"
        paused = f" paused until {broker.paused_until}" if broker.paused_until > self.now else ""
        version = broker.view.version if broker.view else -1
        parts = [
            f"p{pid} {p.role.value} leader {p.leader_id} e{p.leader_epoch} isr {p.isr} "
            f"pending {p.pending_isr} leo {p.log_end_offset} hw {p.high_watermark}"
            for pid, p in broker.partitions.items()
        ]
        return (
            f"b{broker.broker_id} inc {broker.incarnation} epoch {broker.broker_epoch} "
            f"v{version}{paused}: " + "; ".join(parts)
        )

    # -- the network -----------------------------------------------------------------------
    def _send(self, src: int, dst: int, payload: Payload, src_incarnation: int = 0) -> None:
        broker = self.brokers.get(dst)
        if broker is not None and not broker.up:
            return  # connection refused
        if (src, dst) in self.blocked:
            return
        if not self.healed and self.rng.random() < self.config.drop_probability:
            return
        dst_incarnation = broker.incarnation if broker is not None else 0
        msg = Msg(src, dst, src_incarnation, dst_incarnation, payload)
        self.result.messages += 1
        until, extra = self.slow.get(src, (0, 0))
        delay = self._delay() + (extra if until > self.now and not self.healed else 0)
        self._push(self.now + delay, Deliver(msg))

    def _send_from(self, broker: SimBroker, dst: int, payload: Payload) -> None:
        self._send(broker.broker_id, dst, payload, broker.incarnation)

    def _reply(self, msg: Msg, payload: Payload) -> None:
        """An answer goes back on the requester's connection: lost if that process is gone."""
        requester = self.brokers.get(msg.src)
        if requester is not None and requester.incarnation != msg.src_incarnation:
            return
        self._send(msg.dst, msg.src, payload, msg.dst_incarnation)

    def _delay(self) -> int:
        config, rng = self.config, self.rng
        if not self.healed and rng.random() < config.slow_probability:
            return rng.randint(config.delay_max_ms, config.slow_max_ms)
        return rng.randint(config.delay_min_ms, config.delay_max_ms)

    def _metadata_delay(self) -> int:
        config, rng = self.config, self.rng
        if not self.healed and rng.random() < config.metadata_slow_probability:
            return self.now + rng.randint(config.metadata_delay_max_ms, config.metadata_slow_max_ms)
        return self.now + rng.randint(1, config.metadata_delay_max_ms)

    def _on_deliver(self, msg: Msg) -> None:
        if (msg.src, msg.dst) in self.blocked:
            return  # cut while in flight
        self._note(f"{msg.src}->{msg.dst}", msg.payload)
        if msg.dst == CONTROLLER:
            self._on_controller_request(msg)
        elif msg.dst == CLIENT:
            self._on_produce_answer(msg.payload)
        else:
            self._on_broker_message(self.brokers[msg.dst], msg)

    # -- the controller --------------------------------------------------------------------
    def _on_controller_request(self, msg: Msg) -> None:
        if self.now < self.controller_down_until:
            return  # failing over: nobody answers
        ctl, before = self.controller, self.controller.version
        payload = msg.payload
        if isinstance(payload, HeartbeatReq):
            ctl.heartbeat(payload.broker, payload.broker_epoch, payload.version, self.now)
            answer: Payload = ControllerResp(ctl.snapshot(), None)
        elif isinstance(payload, RegisterReq):
            epoch = ctl.register(payload.broker, payload.incarnation, self.now)
            answer = ControllerResp(ctl.snapshot(), epoch)
        elif isinstance(payload, AlterReq):
            error, state = ctl.alter_partition(payload)
            answer = AlterResp(payload.pid, payload.req_id, error, state)
        else:
            raise AssertionError(f"the controller got {payload!r}")
        self._publish(before)
        self._reply(msg, answer)

    def _controller_tick(self) -> None:
        if self.now < self.controller_down_until:  # failing over: no controller is active
            self._push(self.now + self.config.controller_tick_ms, Tick("controller"))
            return
        self._controller_back()
        before = self.controller.version
        fenced = self.controller.expire_sessions(self.now)
        if fenced:
            self._note("controller", f"sessions expired: fenced {fenced}")
        self._publish(before)
        self._watch_offline()
        self._leaderless_duty()
        self._push(self.now + self.config.controller_tick_ms, Tick("controller"))

    def _leaderless_duty(self) -> None:
        """``ControllerService._elect_leaderless``: when due (a committed unclean config
        change, a takeover) or every ``leaderless_recheck_ms``; one decision of its own."""
        recheck = self.config.leaderless_recheck_ms
        if not recheck or (
            not self.leaderless_due and self.now - self.leaderless_checked_at < recheck
        ):
            return
        self.leaderless_due = False
        self.leaderless_checked_at = self.now
        before, changes = self.controller.version, self.controller.leader_changes
        self.controller.elect_leaderless()
        if self.controller.version != before:
            elected = self.controller.leader_changes - changes
            self.result.leaderless_elections += elected
            self._note("controller", f"leaderless duty: {elected} leader(s) elected")
        self._publish(before)

    def _publish(self, before: int) -> None:
        """Push a new image to every broker the controller can reach, each after its own
        delay (heartbeat answers carry it to the others)."""
        if self.controller.version == before:
            return
        snapshot = self.controller.snapshot()
        self._note("metadata", f"v{snapshot.version} {list(snapshot.partitions)}")
        for broker in self.brokers.values():
            if broker.up and (CONTROLLER, broker.broker_id) not in self.blocked:
                push = MetadataPush(broker.broker_id, broker.incarnation, snapshot)
                self._push(self._metadata_delay(), push)

    # -- a broker: metadata ----------------------------------------------------------------
    def _on_broker_message(self, broker: SimBroker, msg: Msg) -> None:
        payload = msg.payload
        if isinstance(payload, FetchReq):
            self._serve_fetch(broker, msg, payload, may_park=True)
        elif isinstance(payload, FetchResp):
            self._on_fetch_answer(broker, payload)
        elif isinstance(payload, ProduceReq):
            self._serve_produce(broker, msg, payload)
        elif isinstance(payload, AlterResp):
            self._on_alter_answer(broker, payload)
        elif isinstance(payload, ControllerResp):
            self._on_controller_answer(broker, payload)
        else:
            raise AssertionError(f"broker {broker.broker_id} got {payload!r}")

    def _on_controller_answer(self, broker: SimBroker, answer: ControllerResp) -> None:
        epoch = answer.registered_epoch
        if epoch is not None and broker.broker_epoch < 0 and epoch >= 0:
            broker.broker_epoch = epoch
            self._note(f"b{broker.broker_id}", f"registered at broker epoch {epoch}")
        self._apply_snapshot(broker, answer.snapshot)

    def _apply_snapshot(self, broker: SimBroker, snapshot: Snapshot) -> None:
        if broker.view is not None and snapshot.version <= broker.view.version:
            return
        broker.view = snapshot
        if not broker.serving:
            reg = snapshot.brokers[broker.broker_id]
            if broker.broker_epoch < 0 or reg.epoch != broker.broker_epoch or reg.fenced:
                return  # the real broker starts serving once registered and unfenced
            broker.serving = True
        for pid, partition in broker.partitions.items():
            if partition.min_insync_replicas != snapshot.min_insync_replicas:
                # as the replica manager applies a topic config change
                partition.update_config(self.log_config, snapshot.min_insync_replicas)
            self._apply_partition(broker, pid, partition, snapshot.partitions[pid])

    def _apply_partition(
        self, broker: SimBroker, pid: int, partition: Partition, state: PState
    ) -> None:
        before = (partition.role, partition.leader_id, partition.leader_epoch)
        if state.leader == broker.broker_id:
            partition.make_leader(state, now_ms=self.now)
            # A leader taking over after an unclean election not yet taken over: that
            # election's (or a later clean one of the same replica, if it was fenced first)
            epoch, era = partition.leader_epoch, self.era_epoch[pid]
            unclean = self.controller.unclean_epochs.get(pid, ())
            if epoch > era and any(era < u <= epoch for u in unclean):
                self._new_era(broker, pid, epoch)
        else:
            partition.make_follower(state)
        if before != (partition.role, partition.leader_id, partition.leader_epoch):
            self._note(f"b{broker.broker_id}", f"p{pid} {partition!r} isr {partition.isr}")
            self._roles_changed(broker, pid, partition)

    def _new_era(self, broker: SimBroker, pid: int, epoch: int) -> None:
        """An out-of-sync replica leads after an unclean election: its log is the partition's
        now, all of it (alone in the ISR, its HW reaches its log end), and what the old ISR had
        beyond it is lost. The committed log, what consumers read and the acknowledgements
        to hold are taken afresh from here; replicas and deposed leaders still on an older
        epoch are not held to the new log until they fetch from this era (``_old_era``)."""
        self.era_epoch[pid] = epoch
        self.committed[pid] = list(broker.mirrors[pid].ids)
        for other in self.brokers.values():
            if pid in other.mirrors:
                other.mirrors[pid].verified = 0
        self.observed[pid] = {}
        self.result.unclean_elections += 1
        self._note(
            f"b{broker.broker_id}",
            f"p{pid} leads at epoch {epoch} after an unclean election: a new era of its log",
        )

    def _old_era(self, pid: int, partition: Partition) -> bool:
        """The replica has not fetched from the current era's leader yet (its latest epoch
        is older, or it leads at an older epoch unaware it was deposed), or an unclean
        election is decided and its leader has not taken over yet: its log may hold records
        the new era lost."""
        era = self.era_epoch[pid]
        if self.controller.unclean_epochs.get(pid, [0])[-1] > era:
            return True  # decided, not applied: the old era's checks still run elsewhere
        if era == 0:
            return False  # no unclean election so far: every check applies
        if partition.is_leader:
            return partition.leader_epoch < era
        latest = partition.log.epoch_cache.latest_epoch  # None: an empty log holds nothing old
        return latest is not None and latest < era

    def _roles_changed(self, broker: SimBroker, pid: int, partition: Partition) -> None:
        """Parked fetches answer now; a follower (again, or of a new leader or epoch) fetches
        from its leader, a leader from nobody."""
        self._wake_parked(broker, pid)
        before = broker.fetching.pop(pid, None)
        if before is not None:
            self._unfollowed(broker, pid, before)
        if partition.role is Role.FOLLOWER and partition.leader_id >= 0:
            self._followed(broker, pid, partition)

    def _followed(self, broker: SimBroker, pid: int, partition: Partition) -> None:
        """``partition`` follows its leader, anew: one fetch of its own in flight."""
        gen = self._next_id()
        broker.fetching[pid] = Fetching(partition.leader_id, partition.leader_epoch, gen)
        self._timer(broker, self.now, FETCH, pid, gen)

    def _unfollowed(self, broker: SimBroker, pid: int, before: Fetching) -> None:
        """``pid`` no longer follows ``before``'s leader at its epoch (its fetch's answer is
        dropped: ``_on_fetch_answer``)."""

    # -- a broker: timers ------------------------------------------------------------------
    def _on_timer(self, timer: Timer) -> None:
        broker = self.brokers[timer.broker]
        if timer.kind == HEARTBEAT:
            self._heartbeat(broker)
        elif timer.kind == SHRINK:
            self._shrink_isrs(broker)
        elif timer.kind == CHECKPOINT:
            self._checkpoint(broker)
        elif timer.kind == FETCH:
            self._fetch(broker, timer.pid, timer.token)
        elif timer.kind == FETCH_TIMEOUT:
            self._fetch_timed_out(broker, timer.pid, timer.token)
        elif timer.kind == POLL_EXPIRE:
            parked = broker.parked.pop(timer.token, None)
            if parked is not None and isinstance(parked.payload, FetchReq):
                self._serve_fetch(broker, parked, parked.payload, may_park=False)
        elif timer.kind == ALTER_TIMEOUT:
            self._alter_unanswered(broker, timer.token, "no answer")
        elif timer.kind == ALTER_RETRY:
            self._alter_again(broker, timer.pid, timer.token)
        elif timer.kind == COMMIT:
            ask = self.deferred_commits.pop(timer.token, None)
            if ask is not None:  # None: the produce timed out first
                ask()
        elif timer.kind == PRODUCE_TIMEOUT:
            self._produce_timed_out(broker, self.produce_waits.pop(timer.token))

    def _heartbeat(self, broker: SimBroker) -> None:
        if broker.broker_epoch < 0:
            self._send_from(broker, CONTROLLER, RegisterReq(broker.broker_id, broker.incarnation))
        else:
            version = broker.view.version if broker.view else 0
            heartbeat = HeartbeatReq(broker.broker_id, broker.broker_epoch, version)
            self._send_from(broker, CONTROLLER, heartbeat)
        self._timer(broker, self.now + self.config.heartbeat_interval_ms, HEARTBEAT)

    def _shrink_isrs(self, broker: SimBroker) -> None:
        for pid, partition in broker.partitions.items():
            if partition.is_leader:
                late = partition.maybe_shrink_isr(self.now)
                if late:
                    self._note(f"b{broker.broker_id}", f"p{pid} shrink: {late} lag")
        self._timer(broker, self.now + self.config.replica_lag_time_max_ms // 2, SHRINK)

    def _checkpoint(self, broker: SimBroker) -> None:
        """The log manager's periodic pass: fsync rolled segments, checkpoint the recovery
        points and the HWs."""
        for pid, partition in broker.partitions.items():
            log = partition.log
            log.flush(log.active_segment.base_offset)
            broker.recovery_checkpoint[pid] = log.recovery_point
            broker.hw_checkpoint[pid] = partition.high_watermark
        self._timer(broker, self.now + self.config.hw_checkpoint_interval_ms, CHECKPOINT)

    @staticmethod
    def _checkpoint_log(broker: SimBroker, pid: int, log: Log) -> None:
        """A truncation lowered ``log``'s recovery point or HW: checkpointed at once."""
        broker.recovery_checkpoint[pid] = log.recovery_point
        broker.hw_checkpoint[pid] = log.high_watermark

    # -- a broker: the follower's fetcher --------------------------------------------------
    def _fetch(self, broker: SimBroker, pid: int, gen: int) -> None:
        fetching = broker.fetching.get(pid)
        if fetching is None or fetching.gen != gen or fetching.in_flight:
            return
        offset, last_epoch = broker.partitions[pid].fetch_position()
        req_id = self._next_id()
        fetching.in_flight = req_id
        request = FetchReq(
            pid,
            broker.broker_id,
            req_id,
            offset,
            last_epoch,
            fetching.leader_epoch,
            broker.broker_epoch,
        )
        self._send_from(broker, fetching.leader, request)
        timeout = self.config.fetch_wait_max_ms + self.config.request_timeout_ms
        self._timer(broker, self.now + timeout, FETCH_TIMEOUT, pid, req_id)

    def _fetch_timed_out(self, broker: SimBroker, pid: int, req_id: int) -> None:
        fetching = broker.fetching.get(pid)
        if fetching is not None and fetching.in_flight == req_id:
            fetching.in_flight = 0
            self._timer(broker, self.now, FETCH, pid, fetching.gen)

    def _on_fetch_answer(self, broker: SimBroker, answer: FetchResp) -> None:
        pid = answer.pid
        fetching = broker.fetching.get(pid)
        if fetching is None or fetching.in_flight != answer.req_id:
            return  # timed out, or the partition follows another leader or epoch now
        fetching.in_flight = 0
        partition = broker.partitions[pid]
        if not (
            partition.role is Role.FOLLOWER
            and partition.leader_id == fetching.leader
            and partition.leader_epoch == fetching.leader_epoch
        ):
            return
        rest = self._apply_answer(broker, pid, partition, answer)
        wait = self.config.fetch_backoff_ms if rest else 0
        self._timer(broker, self.now + wait, FETCH, pid, fetching.gen)

    def _apply_answer(
        self, broker: SimBroker, pid: int, partition: Partition, answer: FetchResp
    ) -> bool:
        """Apply a leader's answer as broker/replica_fetcher.py does; True: rest a while.
        Records must start at the follower's log end: it asked from there, and an answer
        to an older question is dropped before it gets here (a fetcher asking from a stale
        position costs only wasted answers and rests, so it is checked here, not left to
        liveness)."""
        hw_before = partition.high_watermark
        before_new_era = self._old_era(pid, partition)
        if answer.error == NO_ERROR and answer.diverging is None and answer.records:
            first = int.from_bytes(answer.records[:8], "big", signed=True)
            if first != partition.log_end_offset:
                self._fail(
                    f"broker {broker.broker_id} got p{pid} records from offset {first} at its "
                    f"log end {partition.log_end_offset}: it fetched from a stale position"
                )
        fetch_answer = FetchAnswer(
            answer.error,
            answer.high_watermark,
            answer.log_start,
            memoryview(answer.records),
            answer.diverging,
        )
        try:
            done = apply_fetch_answer(partition, fetch_answer)
        except ReplicationError as e:
            self._note(f"b{broker.broker_id}", f"p{pid} follower append failed: {e!r}")
            self._sync_mirror(broker, pid, truncated=True)
            return True
        truncated = done.outcome in (Outcome.TRUNCATED, Outcome.RESTARTED)
        self._sync_mirror(broker, pid, truncated)
        if truncated:
            self.result.truncations += 1
            self._note(f"b{broker.broker_id}", f"p{pid} {done}")
            if done.log_end_after < hw_before and not before_new_era:
                self._fail(
                    f"broker {broker.broker_id} truncated partition {pid} to "
                    f"{done.log_end_after}, below its high watermark {hw_before} ({answer!r})"
                )
        return done.outcome is Outcome.REST

    def _read_partition(
        self,
        broker: SimBroker,
        replica: int,
        req_id: int,
        pid: int,
        fetch_offset: int,
        last_epoch: int,
        leader_epoch: int,
        max_bytes: int,
        broker_epoch: int = -1,
        log_start_offset: int = -1,
    ) -> FetchResp:
        """broker/handlers/fetch.py's read of one partition for a follower (the error
        answer of a ReplicationError); ``log_start_offset``: the follower's (-1: its request
        did not say)."""
        partition = broker.partitions.get(pid)
        try:
            if partition is None:
                raise NotLeaderOrFollower(f"broker {broker.broker_id} holds no p{pid}")
            found = partition.read_for_follower(
                replica,
                fetch_offset,
                max_bytes,
                last_fetched_epoch=last_epoch,
                current_leader_epoch=leader_epoch,
                now_ms=self.now,
                broker_epoch=broker_epoch,
                log_start_offset=log_start_offset,
            )
        except ReplicationError as e:
            hw = start = -1
            if partition is not None and e.code == OffsetOutOfRange.code:
                hw, start = partition.high_watermark, partition.log_start_offset
            return FetchResp(pid, req_id, e.code, hw, start, b"", None)
        data = found.data
        records = data.slice.read() if data is not None and data.slice is not None else b""
        hw, start = partition.high_watermark, partition.log_start_offset
        return FetchResp(pid, req_id, NO_ERROR, hw, start, records, found.diverging)

    # -- a broker: the leader's side -------------------------------------------------------
    def _serve_fetch(self, broker: SimBroker, msg: Msg, req: FetchReq, *, may_park: bool) -> None:
        """broker/handlers/fetch.py: read_for_follower; nothing to send is long-polled."""
        answer = self._read_partition(
            broker,
            req.replica,
            req.req_id,
            req.pid,
            req.fetch_offset,
            req.last_epoch,
            req.leader_epoch,
            self.config.fetch_max_bytes,
            req.broker_epoch,
        )
        nothing = answer.error == NO_ERROR and not answer.records and answer.diverging is None
        if nothing and may_park:
            token = self._next_id()
            broker.parked[token] = msg
            self._timer(broker, self.now + self.config.fetch_wait_max_ms, POLL_EXPIRE, token=token)
            return
        self._reply(msg, answer)

    def _wake_parked(self, broker: SimBroker, pid: int) -> None:
        waiting = [t for t, m in broker.parked.items() if getattr(m.payload, "pid", -1) == pid]
        for token in waiting:
            msg = broker.parked.pop(token)
            if isinstance(msg.payload, FetchReq):
                self._serve_fetch(broker, msg, msg.payload, may_park=False)

    def _serve_produce(self, broker: SimBroker, msg: Msg, req: ProduceReq) -> None:
        partition = broker.partitions.get(req.pid)
        records = [RecordInput(None, v, BASE_MS + self.now) for v in req.values]
        try:
            if partition is None:
                raise NotLeaderOrFollower(f"broker {broker.broker_id} holds no p{req.pid}")
            info = partition.append_as_leader(build_batch(records), -1)
        except ReplicationError as e:
            self._reply(msg, ProduceResp(req.pid, e.code))
            return
        self._sync_mirror(broker, req.pid, truncated=False)
        self._wake_parked(broker, req.pid)
        epoch = partition.leader_epoch
        self._note(
            f"b{broker.broker_id}", f"p{req.pid} appended {req.values} at {info.first_offset}"
        )

        wait = ProduceWait(msg, req)

        def committed(error: ReplicationError | None) -> None:
            if wait.timed_out:
                self._fail(
                    f"b{broker.broker_id} p{req.pid}: the commit callback of {req.values} ran "
                    "after the produce timed out and forgot its wait"
                )
            wait.done = True
            if error is None:
                self._check_enough_replicas(broker, req.pid)
                self._acknowledge(broker, req, info.first_offset, epoch)
            self._reply(msg, ProduceResp(req.pid, NO_ERROR if error is None else error.code))

        delay_max_ms = self.config.produce_commit_delay_max_ms
        if delay_max_ms > 0:
            wait.deferred = self._next_id()
            self.deferred_commits[wait.deferred] = functools.partial(
                self._await_commit, partition, info, committed, wait
            )
            at = self.now + self.rng.randint(0, delay_max_ms)
            self._timer(broker, at, COMMIT, req.pid, wait.deferred)
        else:
            self._await_commit(partition, info, committed, wait)
        timeout_ms = self.config.produce_timeout_ms
        if timeout_ms > 0 and not wait.done:
            token = self._next_id()
            self.produce_waits[token] = wait
            self._timer(broker, self.now + timeout_ms, PRODUCE_TIMEOUT, req.pid, token)

    @staticmethod
    def _await_commit(
        partition: Partition, info: AppendInfo, committed: CommitCallback, wait: ProduceWait
    ) -> None:
        wait.deferred = 0
        wait.forget = partition.await_commit(info, committed)

    def _produce_timed_out(self, broker: SimBroker, wait: ProduceWait) -> None:
        """The produce handler's timeout: forget the wait (or the ask still deferred) and
        answer REQUEST_TIMED_OUT; the values may be committed later, never acknowledged."""
        if wait.done:
            return
        wait.timed_out = True
        if wait.deferred:
            del self.deferred_commits[wait.deferred]  # its COMMIT timer finds nothing
        elif wait.forget is not None:
            wait.forget()
        self.result.produce_timeouts += 1
        self._note(f"b{broker.broker_id}", f"p{wait.req.pid} timed out {wait.req.values}")
        self._reply(wait.msg, ProduceResp(wait.req.pid, RequestTimedOut.code))

    def _check_enough_replicas(self, broker: SimBroker, pid: int) -> None:
        """Kafka's rule for an acks=-1 acknowledgement: the leader's ISR (the larger set
        while a change is pending) holds at least min.insync.replicas members."""
        p = broker.partitions[pid]
        maximal = set(p.isr) | set(p.pending_isr or ())
        required = (
            broker.view.min_insync_replicas if broker.view else self.config.min_insync_replicas
        )
        if len(maximal) < required:
            self._fail(
                f"b{broker.broker_id} acknowledges a write to p{pid} with the ISR {p.isr} "
                f"(pending {p.pending_isr}), below min.insync.replicas {required} (its image's)"
            )

    def _acknowledge(self, broker: SimBroker, req: ProduceReq, first: int, epoch: int) -> None:
        acked = self.acked[req.pid]
        for i, value in enumerate(req.values):
            acked[value] = Ack(first + i, broker.broker_id, epoch, self.now)
        self.result.values_acked += len(req.values)
        self._note(f"b{broker.broker_id}", f"p{req.pid} acked {req.values} at {first}")

    # -- a broker: ISR changes -------------------------------------------------------------
    def _propose_isr(self, broker: SimBroker, partition: Partition, isr: tuple[int, ...]) -> bool:
        """broker/alter_partition.py ``propose``: members' broker epochs from this broker's
        image; not sent while resting after a refusal, or with a joining member fenced."""
        pid, view = partition.partition_id, broker.view
        if view is None or broker.alter_rest_until.get(pid, 0) > self.now:
            return False
        if self._alter_members(broker, partition, isr) is None:
            return False
        self._send_alter(broker, partition, isr, partition.partition_epoch)
        return True

    def _alter_members(
        self, broker: SimBroker, partition: Partition, isr: tuple[int, ...]
    ) -> tuple[tuple[int, int], ...] | None:
        view = broker.view
        if view is None:
            return None
        members = []
        for member in isr:
            reg = view.brokers.get(member)
            if reg is None or (reg.fenced and member not in partition.isr):
                return None
            fetched = partition.follower_broker_epoch(member) if member not in partition.isr else -1
            if fetched >= 0 and fetched != reg.epoch:
                return None  # KIP-903: its latest fetch came from another incarnation
            members.append((member, reg.epoch))
        return tuple(members)

    def _send_alter(
        self, broker: SimBroker, partition: Partition, isr: tuple[int, ...], epoch: int
    ) -> None:
        """Send the proposal of ``isr`` at partition epoch ``epoch`` (again, on a retry: with
        the broker's current broker epoch and members' epochs, as the sender does)."""
        pid = partition.partition_id
        members = self._alter_members(broker, partition, isr)
        if members is None:  # a member left this broker's image: ask with the old epochs
            members = tuple((m, -1) for m in isr)
        req_id = self._next_id()
        broker.alter_in_flight[req_id] = (pid, isr, epoch)
        leader = (broker.broker_id, broker.broker_epoch, partition.leader_epoch)
        request = AlterReq(pid, *leader, epoch, members, req_id)
        self._send_from(broker, CONTROLLER, request)
        self._timer(broker, self.now + self.config.request_timeout_ms, ALTER_TIMEOUT, pid, req_id)
        self._note(f"b{broker.broker_id}", f"p{pid} proposes ISR {isr} (#{req_id})")

    def _on_alter_answer(self, broker: SimBroker, answer: AlterResp) -> None:
        proposal = broker.alter_in_flight.pop(answer.req_id, None)
        if proposal is None:
            return  # timed out already: the retry carries on
        pid, isr, epoch = proposal
        partition = broker.partitions.get(pid)
        if partition is None:
            return
        if not answer.error:
            broker.alter_rest_until.pop(pid, None)
            partition.isr_change_committed(answer.state, self.now, isr)
        elif answer.error in REFUSED_FOR_GOOD:
            self._note(f"b{broker.broker_id}", f"p{pid} ISR change #{answer.req_id} refused: "
                       f"{answer.error}")  # fmt: skip
            broker.alter_rest_until[pid] = self.now + self.config.alter_retry_backoff_ms
            partition.isr_change_failed(isr, epoch)
        else:
            self._retry_alter(broker, pid, answer.req_id, isr, epoch, answer.error)

    def _alter_unanswered(self, broker: SimBroker, req_id: int, why: str) -> None:
        proposal = broker.alter_in_flight.pop(req_id, None)
        if proposal is not None:
            pid, isr, epoch = proposal
            self._retry_alter(broker, pid, req_id, isr, epoch, why)

    def _retry_alter(
        self, broker: SimBroker, pid: int, req_id: int, isr: tuple[int, ...], epoch: int, why: str
    ) -> None:
        """The change may be committed, or this broker's image is behind: the proposal stays
        pending and is sent again after the backoff, unless the image has ended it."""
        self._note(f"b{broker.broker_id}", f"p{pid} ISR change #{req_id} pending ({why})")
        broker.alter_retries[req_id] = (pid, isr, epoch)
        self._timer(broker, self.now + self.config.alter_retry_backoff_ms, ALTER_RETRY, pid, req_id)

    def _alter_again(self, broker: SimBroker, pid: int, req_id: int) -> None:
        proposal = broker.alter_retries.pop(req_id, None)
        partition = broker.partitions.get(pid)
        if proposal is None or partition is None:
            return
        _, isr, epoch = proposal
        if partition.proposal_pending(isr, epoch):
            self._send_alter(broker, partition, isr, epoch)

    # -- a broker: its process -------------------------------------------------------------
    def _open(self, broker: SimBroker) -> None:
        """Start the broker's process: open its logs (recovering them), start its timers."""
        broker.incarnation += 1
        broker.up = True
        for pid, state in enumerate(self.controller.partitions):
            if broker.broker_id in state.replicas:
                self._open_partition(broker, pid)
        for kind in (HEARTBEAT, SHRINK, CHECKPOINT):
            self._timer(broker, self.now + self.rng.randint(0, 50), kind)

    def _open_partition(self, broker: SimBroker, pid: int) -> None:
        log = load_log(
            broker.directory / f"{TOPIC}-{pid}",
            self.log_config,
            recovery_point=broker.recovery_checkpoint.get(pid, 0),
            high_watermark=broker.hw_checkpoint.get(pid),
            clock=lambda: BASE_MS + self.now,
        )
        # As the log manager: a truncation's lower recovery point or high watermark is
        # checkpointed before the log takes another append.
        log.on_offsets_lowered = lambda lowered: self._checkpoint_log(broker, pid, lowered)
        partition = Partition(
            TOPIC,
            TOPIC_ID,
            pid,
            log,
            local_broker_id=broker.broker_id,
            min_insync_replicas=self.config.min_insync_replicas,
            replica_lag_time_max_ms=self.config.replica_lag_time_max_ms,
        )
        partition.propose_isr = lambda p, isr: self._propose_isr(broker, p, isr)
        broker.partitions[pid] = partition
        broker.mirrors[pid] = Mirror()
        self._sync_mirror(broker, pid, truncated=False)

    def _crash(self, broker: SimBroker, *, power_loss: bool = False) -> None:
        flushed = {pid: p.log.recovery_point for pid, p in broker.partitions.items()}
        for partition in broker.partitions.values():
            partition.log.abandon()  # no flush: what was written is in the page cache
        broker.reset()
        self.result.crashes += 1
        self._note(f"b{broker.broker_id}", "crashed")
        if power_loss:  # ... which is gone too
            self.result.power_losses += 1
            self.lossy.add(broker.broker_id)
            for pid, recovery_point in flushed.items():
                directory = broker.directory / f"{TOPIC}-{pid}"
                changes = lose_page_cache(directory, recovery_point, self.rng)
                self._note(
                    f"b{broker.broker_id}", f"p{pid} lost power above {recovery_point}: {changes}"
                )
        down = self.rng.randint(self.config.down_min_ms, self.config.down_max_ms)
        self._push(self.now + down, Restart(broker.broker_id))

    def _restart(self, broker: SimBroker) -> None:
        if broker.up:
            return
        self._open(broker)
        ends = {pid: p.log_end_offset for pid, p in broker.partitions.items()}
        self._note(f"b{broker.broker_id}", f"restarted (incarnation {broker.incarnation}) {ends}")

    def _close(self) -> None:
        for broker in self.brokers.values():
            for partition in broker.partitions.values():
                partition.log.abandon()
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    # -- mirrors of the logs ---------------------------------------------------------------
    def _sync_mirror(self, broker: SimBroker, pid: int, truncated: bool) -> None:
        """Bring the mirror in step with the log after a change: new batches read from the
        log; after a truncation, rebuilt, keeping what is still verified."""
        log, mirror = broker.partitions[pid].log, broker.mirrors[pid]
        if truncated:
            fresh = read_mirror(log)
            same = 0
            limit = min(mirror.verified, len(fresh.ids))
            while same < limit and fresh.ids[same] == mirror.ids[same]:
                same += 1
            fresh.verified = same
            broker.mirrors[pid] = mirror = fresh
        else:
            start = mirror.ends[-1] if mirror.ends else log.log_start_offset
            for _, _, header in log.batches(start):
                mirror.ends.append(header.next_offset)
                mirror.ids.append(batch_id(header))
        end = mirror.ends[-1] if mirror.ends else log.log_start_offset
        if end != log.log_end_offset:
            self._fail(
                f"broker {broker.broker_id} p{pid}: batches end at {end}, the log end offset "
                f"is {log.log_end_offset}"
            )

    def _verify_mirrors(self) -> None:
        for broker in self.brokers.values():
            for pid, partition in broker.partitions.items():
                fresh = read_mirror(partition.log)
                if fresh.ids != broker.mirrors[pid].ids:
                    self._fail(f"broker {broker.broker_id} p{pid}: the log changed unnoticed")

    # -- invariants ------------------------------------------------------------------------
    def _check_invariants(self) -> None:
        for pid in range(self.config.partitions):
            holders = [b for b in self.brokers.values() if b.up and pid in b.partitions]
            leaders = [b for b in holders if b.partitions[pid].is_leader]
            for broker in leaders:
                self._check_leader_hw(broker, pid)
                if not self._old_era(pid, broker.partitions[pid]):
                    self._check_prefix(broker, pid, broker.partitions[pid].high_watermark, True)
            isr = self.controller.partitions[pid].isr
            for broker in holders:
                if self._old_era(pid, broker.partitions[pid]):
                    continue  # unclean election: held to the new era's log once it fetches
                if broker.broker_id in isr and not self._lost_unregistered(broker):
                    self._check_isr_member(broker, pid)
                if broker not in leaders:
                    own = broker.partitions[pid].high_watermark
                    self._check_prefix(broker, pid, own, False)

    def _lost_unregistered(self, broker: SimBroker) -> bool:
        """Lost power and restarted, but the controller still has its old registration: it
        may still be listed in an ISR, short of the committed log, until that session expires
        and removes it. Registering anew waits for that, and it serves nothing meanwhile."""
        reg = self.controller.brokers[broker.broker_id]
        return broker.broker_id in self.lossy and reg.incarnation != broker.incarnation

    def _check_leader_hw(self, broker: SimBroker, pid: int) -> None:
        partition = broker.partitions[pid]
        key, hw = (pid, partition.leader_epoch), partition.high_watermark
        before = broker.leader_hw.get(key, 0)
        if hw < before:
            self._fail(
                f"leader {broker.broker_id} of p{pid} at epoch {key[1]}: HW went back from "
                f"{before} to {hw}"
            )
        broker.leader_hw[key] = hw

    def _check_isr_member(self, broker: SimBroker, pid: int) -> None:
        """A member of the controller's ISR holds the whole committed log: it may be elected
        leader at any moment."""
        committed = self.committed[pid]
        end = committed[-1][1] + 1 if committed else 0
        log_end = broker.partitions[pid].log_end_offset
        if log_end < end:
            state = self.controller.partitions[pid]
            self._fail(
                f"broker {broker.broker_id} is in the ISR {state.isr} of p{pid} (partition "
                f"epoch {state.partition_epoch}) but its log ends at {log_end}, below the "
                f"committed offset {end}: elected, it would lose acknowledged records"
            )
        self._check_prefix(broker, pid, end, False)

    def _check_prefix(self, broker: SimBroker, pid: int, bound: int, leads: bool) -> None:
        """The replica's batches below ``bound`` match the committed log; a leader's extend
        it (everything below a leader's HW is committed)."""
        mirror, committed = broker.mirrors[pid], self.committed[pid]
        count = bisect.bisect_right(mirror.ends, bound)
        for i in range(mirror.verified, count):
            if i >= len(committed) and leads:
                committed.append(mirror.ids[i])
            elif i >= len(committed):
                self._fail(
                    f"broker {broker.broker_id} p{pid}: batch {mirror.ids[i]} is below its "
                    f"bound {bound} but beyond every leader's HW (committed end "
                    f"{committed[-1][1] + 1 if committed else 0})"
                )
            elif mirror.ids[i] != committed[i]:
                role = "leader" if leads else "replica"
                self._fail(
                    f"{role} {broker.broker_id} p{pid}: batch {i} below {bound} is "
                    f"{mirror.ids[i]}, the committed one is {committed[i]}"
                )
        mirror.verified = max(mirror.verified, count)

    # -- clients ---------------------------------------------------------------------------
    def _produce(self) -> None:
        config, rng = self.config, self.rng
        if not self.producing:
            return
        self._push(self._exp(config.produce_interval_ms), Tick("produce"))
        pid = rng.randrange(config.partitions)
        if self.client_leader[pid] not in self.brokers or rng.random() < 0.05:
            self._refresh_client_leader(pid)
        values = []
        for _ in range(rng.randint(1, config.values_per_request_max)):
            self.values += 1
            values.append(b"p%d-v%d" % (pid, self.values))
        self.result.values_sent += len(values)
        self._send(CLIENT, self.client_leader[pid], ProduceReq(pid, tuple(values)))

    def _on_produce_answer(self, payload: Payload) -> None:
        if isinstance(payload, ProduceResp) and payload.error != NO_ERROR:
            self._refresh_client_leader(payload.pid)

    def _refresh_client_leader(self, pid: int) -> None:
        """Ask a random running broker who leads (its image may be stale)."""
        known = [b for b in self.brokers.values() if b.up and b.view is not None]
        if not known:
            self.client_leader[pid] = self.rng.choice(list(self.brokers))
            return
        view = self.rng.choice(known).view
        assert view is not None
        leader = view.partitions[pid].leader
        self.client_leader[pid] = (
            leader if leader in self.brokers else self.rng.choice(list(self.brokers))
        )

    def _consume(self) -> None:
        """Read below the HW of a broker that believes it leads: never the same offset
        differently."""
        config, rng = self.config, self.rng
        self._push(self._exp(config.consume_interval_ms), Tick("consume"))
        pid = rng.randrange(config.partitions)
        leaders = [b for b in self._running() if pid in b.partitions]
        leaders = [b for b in leaders if b.partitions[pid].is_leader]
        leaders = [b for b in leaders if not self._old_era(pid, b.partitions[pid])]
        if not leaders:
            return
        partition = rng.choice(leaders).partitions[pid]
        hw, position = partition.high_watermark, self.consumer_position[pid]
        if hw <= partition.log_start_offset:
            return
        if not partition.log_start_offset <= position < hw:
            position = rng.randrange(partition.log_start_offset, hw)
        data = partition.read(position, config.consume_max_bytes).slice
        if data is not None:
            self.consumer_position[pid] = self._observe(pid, position, hw, data.read())

    def _observe(self, pid: int, position: int, hw: int, data: bytes) -> int:
        observed, end = self.observed[pid], position
        for batch in iter_decoded(bytes(whole_batches(memoryview(data)))):
            for record in batch.records:
                if not position <= record.offset < hw:
                    continue
                seen = observed.setdefault(record.offset, record.value)
                if seen != record.value:
                    self._fail(
                        f"p{pid} offset {record.offset} read as {record.value!r}, earlier as "
                        f"{seen!r}"
                    )
                self.result.values_read += 1
                end = record.offset + 1
        return end

    # -- faults ----------------------------------------------------------------------------
    def _fault(self) -> None:
        if self.healed:
            return
        self._push(self._exp(self.config.fault_interval_ms), Tick("fault"))
        self.lossy = {b for b in self.lossy if not self._recovered(b)}
        if self.lossy:
            return  # quiet until the broker that lost power is back in sync
        kind = self.rng.choices(
            [
                "crash",
                "pause",
                "slow",
                "split",
                "controller",
                "deaf",
                "leader",
                "one-way",
                "failover",
                "unclean-config",
                "min-isr-config",
            ],
            weights=[
                *(3, 2, 2, 2, 2, 2, 2, 1),
                self.config.controller_failover_weight,
                self.config.unclean_config_weight,
                self.config.min_isr_config_weight,
            ],
        )[0]
        if kind in ("crash", "pause", "slow"):
            self._fault_on_broker(kind)
        elif kind == "unclean-config":
            self._set_unclean_config(not self.controller.unclean, "a fault")
        elif kind == "min-isr-config":
            self._set_min_isr_config()
        else:
            self._cut_network(kind)

    def _set_unclean_config(self, enabled: bool, why: str) -> None:
        """The topic's unclean.leader.election.enable set by an operator: committed at once
        if a controller is active (else the change fails and nothing happens); the
        controller's leaderless duty runs at its next tick (``_leaderless_duty``)."""
        if self.now < self.controller_down_until:
            return
        before = self.controller.version
        self.controller.set_unclean(enabled)
        self.leaderless_due = True
        self.result.unclean_config_changes += 1
        self._note("controller", f"unclean.leader.election.enable={str(enabled).lower()} ({why})")
        self._publish(before)

    def _set_min_isr_config(self) -> None:
        """An operator sets the topic's min.insync.replicas: committed at once if a
        controller is active (else the change fails and nothing happens)."""
        if self.now < self.controller_down_until:
            return
        before = self.controller.version
        value = self.rng.randint(1, self.config.replicas_per_partition)
        self.controller.set_min_insync(value)
        self.result.min_isr_changes += 1
        self._note("controller", f"min.insync.replicas={value}")
        self._publish(before)

    def _offline(self) -> list[int]:
        """Partitions without a leader, no ISR member alive, and a replica alive: what an
        operator may bring back with unclean election."""
        alive = self.controller.alive()
        return [
            pid
            for pid, p in enumerate(self.controller.partitions)
            if p.leader == NO_LEADER and not alive.intersection(p.isr) and alive & set(p.replicas)
        ]

    def _watch_offline(self) -> None:
        """With ``operator_reaction_ms``: an offline partition seen while unclean election is
        off gets an operator to set it on within that many ms (``_operator``)."""
        reaction = self.config.operator_reaction_ms
        if not reaction or self.operator_pending or self.controller.unclean:
            return
        if self._offline():
            self.operator_pending = True
            self._push(self.now + self.rng.randint(1, reaction), Tick("operator"))

    def _operator(self) -> None:
        self.operator_pending = False
        offline = self._offline()
        if offline and not self.controller.unclean:
            self._set_unclean_config(True, f"partitions {offline} offline")

    def _fault_on_broker(self, kind: str) -> None:
        running = self._running()
        leading = [b for b in running if b.broker_id in self._leaders()]
        if not running:
            return
        broker = self.rng.choice(leading if leading and self.rng.random() < 0.5 else running)
        if kind == "crash":
            loses = self.rng.random() < self.config.power_loss_probability
            self._crash(broker, power_loss=loses and self._power_loss_allowed(broker))
            return
        if kind == "slow":
            self._slow_down(broker)
            return
        duration = self.rng.randint(self.config.pause_min_ms, self.config.pause_max_ms)
        broker.paused_until = self.now + duration
        self.result.pauses += 1
        self._note(f"b{broker.broker_id}", f"paused for {duration} ms")

    def _power_loss_allowed(self, broker: SimBroker) -> bool:
        """Kafka keeps an acknowledged record while one in-sync replica keeps its page cache;
        without fsync it promises no more (a power loss of the last one, KIP-966's subject,
        loses it in Kafka too). So a power loss strikes only a quiet cluster: no other broker
        down, paused or still recovering from one (restarted but not yet registered anew: the
        controller drops such a broker from every ISR when its old registration goes, even
        where the broker losing power would then be the last member, as seed 6088 of a
        sessions soak with failovers showed), no network cut, no ISR change of this broker's
        in flight, and another ISR member for each of its partitions; and no new fault
        starts until it is back in every ISR (see ``_fault``)."""
        if self.lossy or self.blocked or broker.alter_in_flight or broker.alter_retries:
            return False
        if any(not b.up or b.paused_until > self.now for b in self.brokers.values()):
            return False
        registered = self.controller.brokers
        if any(
            registered[b.broker_id].fenced or registered[b.broker_id].incarnation != b.incarnation
            for b in self.brokers.values()
            if b is not broker
        ):
            return False
        me = broker.broker_id
        return all(
            set(state.isr) - {me} for state in self.controller.partitions if me in state.replicas
        )

    def _recovered(self, broker_id: int) -> bool:
        """A broker that lost power is back: registered anew and in every ISR it belongs to."""
        broker, reg = self.brokers[broker_id], self.controller.brokers[broker_id]
        if not broker.up or reg.fenced or reg.incarnation != broker.incarnation:
            return False
        return all(
            broker_id in state.isr
            for state in self.controller.partitions
            if broker_id in state.replicas
        )

    def _slow_down(self, broker: SimBroker) -> None:
        """Everything the broker sends is late for a while (a slow disk, a long GC): as a
        follower it lags, but maybe not long enough to leave the ISR."""
        config, rng = self.config, self.rng
        extra = rng.randint(config.slow_broker_min_ms, config.slow_broker_max_ms)
        duration = rng.randint(config.partition_min_ms, config.partition_max_ms)
        self.slow[broker.broker_id] = (self.now + duration, extra)
        self._note(f"b{broker.broker_id}", f"slow: +{extra} ms for {duration} ms")

    def _cut_network(self, kind: str) -> None:
        rng, brokers = self.rng, sorted(self.brokers)
        nodes = [CONTROLLER, CLIENT, *brokers]
        if kind == "split":
            side = set(rng.sample(nodes, rng.randint(1, len(nodes) - 1)))
            blocked = {(a, b) for a in nodes for b in nodes if (a in side) != (b in side)}
        elif kind in ("controller", "deaf"):  # deaf: it heartbeats, but hears nothing back
            leaders = sorted(self._leaders())
            broker = rng.choice(leaders if leaders and rng.random() < 0.5 else brokers)
            blocked = {(CONTROLLER, broker)}
            if kind == "controller":
                blocked.add((broker, CONTROLLER))
        elif kind == "failover":  # the active controller is lost; another takes over later
            blocked = {(a, b) for a in nodes for b in nodes if CONTROLLER in (a, b) and a != b}
        elif kind == "leader":
            leader = self.controller.partitions[rng.randrange(self.config.partitions)].leader
            others = [b for b in brokers if b != leader]
            blocked = {(leader, b) for b in others} | {(b, leader) for b in others}
        else:
            pairs = [(a, b) for a in nodes for b in nodes if a != b]
            blocked = set(rng.sample(pairs, rng.randint(1, len(nodes))))
        self.partition_gen += 1
        self.blocked = blocked
        self.result.network_partitions += 1
        self._note(f"network cut: {kind}", sorted(blocked))
        duration = rng.randint(self.config.partition_min_ms, self.config.partition_max_ms)
        self._push(self.now + duration, Heal(self.partition_gen))
        if kind == "failover":
            self.controller_down_until = self.now + duration
            self.result.controller_failovers += 1

    def _running(self) -> list[SimBroker]:
        """Brokers up and not paused."""
        return [b for b in self.brokers.values() if b.up and b.paused_until <= self.now]

    def _leaders(self) -> set[int]:
        return {p.leader for p in self.controller.partitions if p.leader != NO_LEADER}

    def _on_heal(self, gen: int) -> None:
        if gen == self.partition_gen and self.blocked:
            self.blocked = set()
            self._note("network healed")

    def _controller_back(self) -> None:
        """After a failover the new active controller starts every session afresh."""
        if self.controller_down_until and self.now >= self.controller_down_until:
            self.controller_down_until = 0
            self.controller.reset_sessions(self.now)
            self.leaderless_due = True  # ControllerService runs the duty on takeover
            self._note("controller", "a new active controller: every session starts afresh")

    # -- the liveness phase ----------------------------------------------------------------
    def _start_liveness(self) -> None:
        self.healed = True
        self.healed_at = self.now
        self.acked_at_heal = self.result.values_acked
        self.blocked = set()
        self.controller_down_until = min(self.controller_down_until, self.now)
        self._controller_back()
        self._note("liveness phase: faults healed")
        for broker in self.brokers.values():
            if not broker.up:
                self._restart(broker)
        self._push(self.now, Tick("liveness"))

    def _liveness_check(self) -> None:
        acked = self.result.values_acked - self.acked_at_heal
        if self.producing and acked >= self.config.liveness_acks:
            self.producing = False
            self._note("liveness: producer stops", f"{acked} values acknowledged since healing")
        if not self.producing and self._converged():
            self.result.liveness_ms = self.now - self.healed_at
            self._final_checks()
            self.done = True
            return
        self._push(self.now + self.config.liveness_check_ms, Tick("liveness"))

    def _converged(self) -> bool:
        if not all(b.up and b.view is not None for b in self.brokers.values()):
            return False
        if any(b.view and b.view.version != self.controller.version for b in self.brokers.values()):
            return False
        return all(self._partition_converged(pid) is None for pid in range(self.config.partitions))

    def _partition_converged(self, pid: int) -> str | None:
        """None once partition ``pid`` has settled, else what it is waiting for."""
        state = self.controller.partitions[pid]
        if state.leader == NO_LEADER:
            return "no leader"
        if set(state.isr) != set(state.replicas):
            return f"ISR {state.isr} of replicas {state.replicas}"
        leader = self.brokers[state.leader].partitions[pid]
        if not leader.is_leader or leader.leader_epoch != state.leader_epoch:
            return f"broker {state.leader} does not lead at epoch {state.leader_epoch} yet"
        if set(leader.isr) != set(state.replicas) or leader.pending_isr is not None:
            return f"the leader's ISR {leader.isr}, pending {leader.pending_isr}"
        end = leader.log_end_offset
        for broker_id in state.replicas:
            replica = self.brokers[broker_id].partitions[pid]
            if (replica.log_end_offset, replica.high_watermark) != (end, end):
                return (
                    f"broker {broker_id} at LEO {replica.log_end_offset} HW "
                    f"{replica.high_watermark}, the leader's LEO {end}"
                )
        return None

    def _liveness_report(self) -> str:
        acked = self.result.values_acked - self.acked_at_heal
        waits = [
            f"p{pid}: {self._partition_converged(pid)}" for pid in range(self.config.partitions)
        ]
        down = [b for b, broker in self.brokers.items() if not broker.up]
        return (
            f"liveness: not settled {self.config.liveness_ms} ms after healing: "
            f"{acked}/{self.config.liveness_acks} values acknowledged since, brokers down {down}, "
            + ", ".join(waits)
        )

    def _final_checks(self) -> None:
        self._verify_mirrors()
        for pid in range(self.config.partitions):
            state = self.controller.partitions[pid]
            leader = self.brokers[state.leader]
            ids = leader.mirrors[pid].ids
            for broker_id in state.replicas:
                if self.brokers[broker_id].mirrors[pid].ids != ids:
                    self._fail(f"p{pid}: broker {broker_id}'s log differs from the leader's")
            committed = self.committed[pid]
            if ids[: len(committed)] != committed:
                self._fail(f"p{pid}: the final log does not start with the committed log")
            self._check_values(pid, leader.partitions[pid].log)

    def _check_values(self, pid: int, log: Log) -> None:
        at: dict[bytes | None, list[int]] = {}
        for offset, value in read_values(log, log.high_watermark):
            at.setdefault(value, []).append(offset)
            seen = self.observed[pid].get(offset, value)
            if seen != value:
                self._fail(f"p{pid} offset {offset} holds {value!r}, a consumer read {seen!r}")
        for value, offsets in at.items():
            if len(offsets) > 1:
                self._fail(f"p{pid}: {value!r} is in the log {len(offsets)} times: {offsets}")
        for value, ack in self.acked[pid].items():
            if ack.leader_epoch < self.era_epoch[pid]:
                continue  # acknowledged before an unclean election: it may be lost
            if at.get(value) != [ack.offset]:
                self._fail(
                    f"p{pid}: {value!r} acknowledged at offset {ack.offset} by broker "
                    f"{ack.broker} (epoch {ack.leader_epoch}, t={ack.time_ms}) is at "
                    f"{at.get(value)} below the HW {log.high_watermark}"
                )
        missing = set(self.observed[pid]) - {o for offsets in at.values() for o in offsets}
        if missing:
            self._fail(f"p{pid}: offsets a consumer read are gone: {sorted(missing)[:10]}")


# -- reading a log ------------------------------------------------------------------------------


def batch_id(header: BatchHeader) -> BatchId:
    return (header.base_offset, header.last_offset, header.partition_leader_epoch, header.crc)


def read_mirror(log: Log) -> Mirror:
    mirror = Mirror()
    for _, _, header in log.batches(log.log_start_offset):
        mirror.ends.append(header.next_offset)
        mirror.ids.append(batch_id(header))
    return mirror


def read_values(log: Log, end: int) -> Iterator[tuple[int, bytes | None]]:
    """(offset, value) of every record below ``end``."""
    for segment, position, header in log.batches(log.log_start_offset, end):
        del segment, position
        data = log.read(header.base_offset, 1, min_one_batch=True).slice
        if data is None:
            return
        batch = next(iter_decoded(bytes(whole_batches(memoryview(data.read())))))
        for record in batch.records:
            if record.offset < end:
                yield record.offset, record.value


def run_seed(
    seed: int,
    config: SimConfig | None = None,
    *,
    directory: Path | None = None,
    trace: bool = False,
    simulation: type[Simulation] = Simulation,
) -> SimResult:
    """Run one seed (of ``simulation``, a subclass built on the hooks if given); raises
    ``SimulationFailure`` on any violation. ``trace`` prints the whole event trace when it
    fails."""
    run = simulation(seed, config, directory)
    if trace:
        run.full_trace = []
    try:
        return run.run()
    except SimulationFailure:
        if run.full_trace is not None:
            print("\n".join(run.full_trace))
        raise
