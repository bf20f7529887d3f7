"""bench.metadata's settings and parameters, the requests it sends, and the figures it measures.

How this works. The constants are the benchmark's fixed settings (timeouts, poll intervals, the
targets of issue 4); ``Params`` holds what ``--quick`` and the flags choose. Every measurement
comes back as a frozen dataclass, gathered in ``Results``; ``Distribution`` (seconds, reported
in milliseconds) is bench.raft's.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.raft_figures import REPO, Distribution
from proto import controller_pb2 as cpb

__all__ = [
    "REPO",
    "Baselines",
    "CatchUp",
    "CreatePhase",
    "LoadedStop",
    "Distribution",
    "Params",
    "Results",
    "SnapshotFigures",
    "creation_requests",
]

START_TIMEOUT_S = 120.0  # the cluster up and every broker unfenced
CREATE_TIMEOUT_S = 1800.0  # the whole creation, however slow
CATCH_UP_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0  # a broker's controlled shutdown, then SIGKILL
SNAPSHOT_WAIT_S = 30.0  # for the controller's first snapshot, before the catch-up
SETTLE_S = 30.0  # after a loaded broker's stop began: then the controller epoch is read
DESCRIBE_INTERVAL_S = 0.5  # DescribeCluster polls (each is a pass over every partition)
FILE_POLL_S = 0.02  # the restarted broker's log and snapshot directory
RPC_TIMEOUT_MS = 120_000  # one CreateTopics waits for its commit: never retried by timeout
MEASURE_TIMEOUT_S = 900.0  # the snapshot-measuring subprocess
TARGET_PARTITIONS = 100_000
TARGET_CREATE_S = 60.0  # issue 4: 100,000 partitions created in <= 60 s
TARGET_CATCH_UP_S = 10.0  # issue 4: a broker's catch-up from a snapshot in <= 10 s
KIB = 1024
# metadata_snapshot_bytes, unless given: this share of the creation's record bytes, so that
# every node takes one snapshot near the end of the creation, and a broker catching up fetches
# it and then replays the rest of the log (the default 20 MiB is never reached by this run).
SNAPSHOT_SHARE = 0.95


@dataclass(frozen=True, slots=True)
class Params:
    quick: bool
    topics: int
    partitions: int  # per topic
    replication_factor: int
    controllers: int
    brokers: int
    concurrency: int  # CreateTopics requests in flight
    topics_per_request: int
    snapshot_bytes: int | None  # every node's metadata_snapshot_bytes (None: see above)
    rtt_samples: int  # sequential gRPC round trips of the baseline

    @property
    def total_partitions(self) -> int:
        return self.topics * self.partitions

    @property
    def requests(self) -> int:
        return -(-self.topics // self.topics_per_request)


def topic_name(i: int) -> str:
    return f"bench-{i:06d}"


def creation_requests(params: Params) -> list[cpb.CreateTopicsRequest]:
    """The CreateTopics requests of a run: ``topics_per_request`` topics each."""
    step = params.topics_per_request
    return [
        cpb.CreateTopicsRequest(
            topics=[
                cpb.CreatableTopic(
                    name=topic_name(i),
                    num_partitions=params.partitions,
                    replication_factor=params.replication_factor,
                )
                for i in range(first, min(first + step, params.topics))
            ]
        )
        for first in range(0, params.topics, step)
    ]


@dataclass(frozen=True, slots=True)
class CreatePhase:
    wall_s: float  # the first request sent to the last answer (each answered once committed)
    latency: Distribution  # per CreateTopics request
    errors: dict[str, int]  # error name -> topics refused (none expected)
    active_controller: int
    cpu_s: dict[int, float]  # node id -> CPU seconds used during the creation
    all_brokers_s: float  # from the first request until every broker reported the last offset
    controller_epochs: tuple[int, int]  # before and after: a change means a failover happened
    metadata_offset: int  # the controller's, once created
    topics: int  # as DescribeCluster counts them afterwards
    partitions: int


@dataclass(frozen=True, slots=True)
class CatchUp:
    broker_id: int  # the spare
    target_offset: int  # the controller's metadata offset when the broker was started again
    controller_log_start: int  # the end offset of the controller's latest snapshot by then
    started_s: float  # until the process printed "ready node"
    observer_s: float | None  # until its Raft node logged that it observes a leader
    snapshot_fetched_s: float | None  # until a snapshot file appeared in its data dir
    snapshot_loaded_s: float | None  # until its Raft node logged the snapshot loaded
    catch_up_s: float  # until DescribeCluster showed its reported offset >= target
    unfenced_s: float  # until DescribeCluster showed it unfenced
    snapshot_end_offset: int | None  # of the snapshot it fetched


@dataclass(frozen=True, slots=True)
class LoadedStop:
    broker_id: int
    stop_s: float  # SIGTERM (controlled shutdown) until the process was gone
    stop_exit: str
    epoch_before: int
    epoch_after: int | None  # SETTLE_S after the stop began; None: no controller answered


@dataclass(frozen=True, slots=True)
class SnapshotFigures:
    """The active controller's latest snapshot file, measured in a fresh process."""

    file_name: str
    size_bytes: int
    end_offset: int  # the Raft offset it covers up to (its name)
    image_offset: int  # the last metadata record in it (Raft control records may follow)
    topics: int
    partitions: int
    cold_load_s: float  # the first decode_snapshot in the process
    load_s: Distribution  # three more
    parse_s: float  # baseline: unpack and CRC-check the records, no image (median of 3)
    encode_s: float  # encode_snapshot of the loaded image (what a node pays per snapshot)
    rss_delta_bytes: int  # resident memory grown by the cold load
    traced_bytes: int  # tracemalloc: bytes a load leaves allocated (the image)


@dataclass(frozen=True, slots=True)
class Baselines:
    records: int  # metadata records of the creation
    record_bytes: int  # their encoded size
    encode_decode_s: float  # encode + decode of those records in-process, no Raft
    replay_s: float  # reference: replaying them into an image in-process, one apply a request
    grpc_rtt: Distribution  # a unary CreateTopics to a server that answers at once
    grpc_create_s: float  # the run's requests, pipelined the same way, to that server

    def snapshot_bytes(self) -> int:
        """The automatic metadata_snapshot_bytes (see SNAPSHOT_SHARE), whole KiB."""
        return int(self.record_bytes * SNAPSHOT_SHARE) // KIB * KIB


@dataclass(frozen=True, slots=True)
class Results:
    params: Params  # with snapshot_bytes resolved
    baselines: Baselines
    create: CreatePhase
    catch_up: CatchUp
    loaded_stop: LoadedStop
    snapshot: SnapshotFigures
