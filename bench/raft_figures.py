"""bench.raft's settings and parameters, and the figures it measures.

How this works. The constants are the benchmark's fixed settings (the cluster's Raft timeouts,
the paced rate, every client timeout); ``Params`` holds what ``--quick`` and the flags choose.
Every measurement comes back as a frozen dataclass: a ``Distribution`` of seconds (reported in
milliseconds, nearest-rank percentiles), a paced run, a pipelined load, a throughput run, a
failover trial, and ``Results`` gathering them with the derived commit floor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from raft.core import RaftConfig

REPO = Path(__file__).resolve().parent.parent
NODE_IDS = (1, 2, 3)
RAFT_DEFAULTS = RaftConfig()
ELECTION_TIMEOUT_MS = RAFT_DEFAULTS.election_timeout_ms  # passed to the nodes explicitly
FETCH_TIMEOUT_MS = RAFT_DEFAULTS.fetch_timeout_ms
FETCH_MAX_WAIT_MS = min(500, FETCH_TIMEOUT_MS // 4)  # as counter_node sets it
SNAPSHOT_EVERY_RECORDS = 10_000  # counter_node's default
RATE_PER_S = 100
START_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 10.0
STATUS_TIMEOUT_S = 1.0
POLL_INTERVAL_S = 0.02
FAILOVER_TIMEOUT_S = 30.0
CATCH_UP_TIMEOUT_S = 60.0
FSYNC_WRITE_BYTES = 64
MAX_LATENCY_CONNECTIONS = 64
READ_BYTES = 64 * 1024
ROUNDS = 4  # latency: commit and baseline rounds alternate


@dataclass(frozen=True, slots=True)
class Params:
    quick: bool
    latency_proposals: int
    baseline_requests: int
    fsync_samples: int
    throughput_window_s: float
    throughput_warmup_s: float
    connections: int
    pipeline_depth: int
    failover_trials: int


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(fraction * len(ordered) + 0.5)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class Distribution:
    """Seconds, summarised in milliseconds."""

    samples: tuple[float, ...]

    def ms(self, fraction: float) -> float:
        return percentile(self.samples, fraction) * 1000

    @property
    def p50_ms(self) -> float:
        return self.ms(0.50)

    @property
    def p99_ms(self) -> float:
        return self.ms(0.99)

    @property
    def max_ms(self) -> float:
        return max(self.samples) * 1000

    def summary(self) -> dict[str, float]:
        return {
            "p50_ms": round(self.p50_ms, 3),
            "p90_ms": round(self.ms(0.90), 3),
            "p99_ms": round(self.p99_ms, 3),
            "max_ms": round(self.max_ms, 3),
            "count": len(self.samples),
        }


@dataclass(frozen=True, slots=True)
class PacedRun:
    latency: Distribution
    errors: int
    connections_used: int  # line protocol: connections the pool opened
    max_send_lag_ms: float  # how late the client sent against the schedule, at worst


@dataclass(frozen=True, slots=True)
class Load:
    """A pipelined run: each connection keeps ``pipeline_depth`` requests outstanding."""

    line: bytes
    connections: int
    pipeline_depth: int
    window_s: float
    requests: int  # answered OK inside the window
    errors: int
    latency: Distribution
    client_cpu_s: float
    server_cpu_s: dict[str, float]  # per server process, inside the window

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.window_s


@dataclass(frozen=True, slots=True)
class Throughput:
    records_per_proposal: int
    load: Load
    leader_id: int

    @property
    def proposals_per_s(self) -> float:
        return self.load.requests_per_s

    @property
    def records_per_s(self) -> float:
        return self.proposals_per_s * self.records_per_proposal


@dataclass(frozen=True, slots=True)
class Trial:
    killed: int
    new_leader: int
    elected_s: float  # kill -> a survivor reports itself leader
    commit_s: float  # kill -> first OK
    epochs: int  # how far the epoch moved: 1 = one election; more = split or failed votes


@dataclass(frozen=True, slots=True)
class Baseline:
    echo: PacedRun  # line protocol round trip, paced like the commit latency run
    grpc: PacedRun  # one unary RaftService.Send round trip, paced the same way
    fsync: Distribution  # small write + fdatasync
    echo_load: Load  # the line protocol at full speed, as many connections as throughput


@dataclass(frozen=True, slots=True)
class LatencyPhase:
    commit: PacedRun
    echo: PacedRun
    grpc: PacedRun
    fsync: Distribution
    rounds: dict[str, list[Distribution]]  # each side, round by round


@dataclass(frozen=True, slots=True)
class Results:
    baseline: Baseline
    latency: PacedRun
    rounds: dict[str, list[Distribution]]
    throughput: tuple[Throughput, ...]
    failover: tuple[Trial, ...]

    @property
    def floor_p50_ms(self) -> float:
        """The least a durable replicated commit costs: two round trips, two fsyncs."""
        b = self.baseline
        return 2 * b.echo.latency.p50_ms + 2 * b.fsync.p50_ms

    @property
    def floor_p99_ms(self) -> float:
        b = self.baseline
        return 2 * b.echo.latency.p99_ms + 2 * b.fsync.p99_ms

    @property
    def failover_s(self) -> list[float]:
        return [t.commit_s for t in self.failover]

    @property
    def elected_s(self) -> list[float]:
        return [t.elected_s for t in self.failover]
