"""What a simulated run is configured by, what it reports, and the state its parts share.

How this works. ``SimState`` holds what every layer of a run reads and writes: the seeded RNG,
the virtual clock and the event queue, the nodes and the network, the committed log learnt so
far (the invariants' reference) and the trace. ``_fail`` turns a broken invariant into a
``SimulationFailure`` carrying the trace, every node's state and the replay command. The layers
build on it in turn: ``Invariants`` (sim_invariants.py), ``ReadySteps`` (sim_ready.py) and
``Simulation`` (sim.py).
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass, fields
from typing import NoReturn

from raft.core import RaftConfig
from raft.messages import Batch, FetchResponse, FetchSnapshotResponse
from raft.testing.sim_network import Event, Network
from raft.testing.sim_storage import Entry, SimNode

__all__ = ["SimConfig", "SimResult", "SimState", "SimulationFailure", "brief"]

_SIM_RAFT = RaftConfig(
    # Small limits so batches split (bursts of proposals span several), fetches page and
    # snapshots chunk.
    max_batch_bytes=512,
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
    # storage: the largest batch a log stores (the real log's max_message_bytes); a larger
    # one fails the run, as the real log's refusal would stop the node
    log_max_batch_bytes: int = 1_024
    # clients and the state machine
    proposal_interval_ms: int = 120
    records_per_proposal_max: int = 4
    # Now and then a proposal is a burst of up to this many records, spanning several
    # batches, sometimes with a record larger than max_batch_bytes (alone in its batch) or
    # one larger than the log stores (refused; the node must go on).
    burst_probability: float = 0.05
    burst_records_max: int = 60
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
    proposals_refused: int = 0  # holding a record too large for the log: RecordTooLarge
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


class SimState:
    """The state of one seeded run and the means to schedule, trace and fail."""

    def __init__(self, seed: int, config: SimConfig | None = None) -> None:
        self.seed = seed
        self.config = config = config or SimConfig()
        self.rng = random.Random(seed)
        self.now = 0
        self.queue: list[tuple[int, int, Event]] = []
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
        self.refused: set[bytes] = set()  # records of proposals refused as too large
        self.commit_end = 0
        self.leaders: dict[int, int] = {}  # epoch -> the node that was leader in it
        self.believed: dict[int, int] = {}  # epoch -> the leader some node followed in it
        self.healed = False
        self.deadline_ms = config.safety_ms + config.liveness_ms
        self.full_trace: list[str] | None = None

    def _push(self, at: int, event: Event) -> None:
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
