"""Settings, targets and the measured figures of bench.produce_consume's replication runs.

MB = 10**6 bytes. A catch-up's bytes are log bytes: what the follower's ``.log`` files of the
partition lacked (record batches as stored, which are the bytes Fetch moves, less the
response framing).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from bench.produce_consume_figures import MB, Run

__all__ = [
    "TARGET_CATCH_UP_MB_PER_S",
    "TARGET_FAILOVER_SLACK_S",
    "TARGET_RF3_ACKS_ALL_RECORDS_PER_S",
    "TARGET_RF3_RATIO_TO_RF1",
    "CatchUp",
    "Failover",
    "RawCopy",
    "ReplicatedRun",
    "Replication",
    "ReplicationParams",
    "ReplicationRound",
]

# Kafka's published figure for one producer, replication factor 3, synchronous (acks=all)
# (Kreps, 2014, "Single producer thread, 3x synchronous replication").
TARGET_RF3_ACKS_ALL_RECORDS_PER_S = 421_823
TARGET_RF3_RATIO_TO_RF1 = 0.5  # of the replication-factor-1 produce of the same round
TARGET_FAILOVER_SLACK_S = 2.0  # unavailability <= broker_session_timeout_ms + this
TARGET_CATCH_UP_MB_PER_S = 200.0


@dataclass(frozen=True, slots=True)
class ReplicationParams:
    rounds: int
    max_s: float  # each produce run of a round
    records: int  # ...or until this many
    batch_bytes: int
    in_flight: int
    catch_up_bytes: int  # produced (payload, 100 B per record) while a follower is down
    kills: int  # failovers: kill -9 of the leader, this many times
    probe_interval_ms: float  # the failover probe's pace: one acks=all request per interval
    probe_backoff_ms: float  # after an error, before the probe asks for metadata again
    min_insync_replicas: int  # the failover topic's min.insync.replicas
    partitions: int = 6  # the rounds' topics: the 2014 test's six partitions


@dataclass(frozen=True, slots=True)
class ReplicatedRun:
    """A produce run into a topic of ``ReplicationParams.partitions`` partitions, each
    partition's batches sent to its leader (a connection per leader, as a Kafka producer)."""

    run: Run  # server CPU: the three brokers together
    topic: str
    replication_factor: int
    acks: int
    leader: int
    broker_cpu_s: dict[int, float]  # each broker during the run


@dataclass(frozen=True, slots=True)
class ReplicationRound:
    """The three produce runs, one after the other, on the same cluster."""

    rf1: ReplicatedRun
    rf3_acks1: ReplicatedRun
    rf3_acks_all: ReplicatedRun

    @property
    def acks_all_ratio(self) -> float:
        """acks=all at replication factor 3 over replication factor 1, records/s."""
        return self.rf3_acks_all.run.records_per_s / self.rf1.run.records_per_s

    @property
    def acks1_ratio(self) -> float:
        return self.rf3_acks1.run.records_per_s / self.rf1.run.records_per_s


@dataclass(frozen=True, slots=True)
class RawCopy:
    """The catch-up's raw baseline: the leader's very log bytes sent with ``os.sendfile``
    over a loopback socket to a process that writes them into a file."""

    bytes: int
    seconds: float  # the receiver's first byte to its last write
    sender_cpu_s: float
    receiver_cpu_s: float

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / MB


@dataclass(frozen=True, slots=True)
class CatchUp:
    """A follower stopped (SIGTERM, controlled shutdown), ``produce`` run with acks=1, the
    follower started again: how fast it copied what it lacked."""

    follower: int
    leader: int
    produce: ReplicatedRun  # the load while the follower was down
    bytes: int  # log bytes the follower lacked when it started again
    restart_to_first_byte_s: float  # process start to its first append (start-up, fetcher)
    transfer_s: float  # its first append to its log being as long as the leader's
    restart_to_isr_s: float  # process start to Metadata showing it in the ISR again
    leader_cpu_s: float  # during the transfer
    follower_cpu_s: float
    other_cores: float  # the rest of the machine during the transfer (other tenants too)
    poll_interval_s: float  # how often the log sizes were read: the timing's resolution
    raw: RawCopy

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.transfer_s / MB

    @property
    def ratio_to_raw(self) -> float:
        return self.mb_per_s / self.raw.mb_per_s


@dataclass(frozen=True, slots=True)
class Failover:
    """kill -9 of the partition leader under a paced acks=all producer."""

    killed: int
    new_leader: int
    unavailable_s: float  # the kill to the first acks=all write acknowledged by the new leader
    fenced_after_s: float | None  # the kill to the controller's log line fencing it (None: none)
    new_leader_named_s: float  # the kill to the first Metadata answer naming the new leader
    last_ack_before_kill_s: float  # how long before the kill the last acknowledgement came
    acked_before: int  # acknowledged writes on the old leader (this probe)
    acked_after: int  # ...and on the new one
    errors: dict[str, int]  # what the probe met in between, by kind
    offsets_increase: bool  # every offset acknowledged after the kill is above every one before
    restart_to_isr_s: float  # the killed broker started again, to Metadata showing it in the ISR


@dataclass(frozen=True, slots=True)
class Replication:
    params: ReplicationParams
    session_timeout_ms: int  # controller.broker_session_timeout_ms of the cluster measured
    rounds: tuple[ReplicationRound, ...]
    catch_up: CatchUp
    failovers: tuple[Failover, ...]  # at least one

    @property
    def rf1(self) -> float:
        return statistics.median(r.rf1.run.records_per_s for r in self.rounds)

    @property
    def rf3_acks1(self) -> float:
        return statistics.median(r.rf3_acks1.run.records_per_s for r in self.rounds)

    @property
    def rf3_acks_all(self) -> float:
        return statistics.median(r.rf3_acks_all.run.records_per_s for r in self.rounds)

    @property
    def ratio(self) -> float:
        """Median over the rounds of each round's acks=all / replication factor 1."""
        return statistics.median(r.acks_all_ratio for r in self.rounds)

    @property
    def acks1_ratio(self) -> float:
        return statistics.median(r.acks1_ratio for r in self.rounds)

    @property
    def failover_s(self) -> float:
        """The longest unavailability of the kills."""
        return max(f.unavailable_s for f in self.failovers)

    @property
    def failover_target_s(self) -> float:
        return self.session_timeout_ms / 1000 + TARGET_FAILOVER_SLACK_S

    @property
    def met(self) -> dict[str, bool]:
        return {
            "rf3_acks_all_records_per_s": self.rf3_acks_all >= TARGET_RF3_ACKS_ALL_RECORDS_PER_S,
            "rf3_ratio_to_rf1": self.ratio >= TARGET_RF3_RATIO_TO_RF1,
            "failover_unavailable_s": self.failover_s <= self.failover_target_s,
            "catch_up_mb_per_s": self.catch_up.mb_per_s >= TARGET_CATCH_UP_MB_PER_S,
        }
