"""Settings, targets and the measured figures of bench.produce_consume.

MB = 10**6 bytes. Payload MB counts 100 bytes per record (what the 2014 test reported);
wire MB counts every byte of the requests or responses, size prefixes included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench.kafka_load import VALUE_BYTES

if TYPE_CHECKING:
    from bench.produce_consume_replication_figures import Replication

__all__ = [
    "JAVA_BATCH_BYTES",
    "KAFKA_2014_BATCH_BYTES",
    "LIBRDKAFKA_BATCH_BYTES",
    "MB",
    "TARGET_CONSUME_RECORDS_PER_S",
    "TARGET_E2E_P99_MS",
    "TARGET_PRODUCE_RATIO",
    "TARGET_PRODUCE_RECORDS_PER_S",
    "Latency",
    "LatencyRound",
    "Params",
    "Results",
    "Round",
    "Run",
]

MB = 1_000_000
# Kafka's published figures for the same test (Kreps, 2014; three 6-core brokers' machines,
# the single-producer, no-replication run and the single-consumer run).
TARGET_PRODUCE_RECORDS_PER_S = 821_557
TARGET_CONSUME_RECORDS_PER_S = 940_521
TARGET_PRODUCE_RATIO = 0.5  # of the raw baseline's bytes/s
TARGET_E2E_P99_MS = 5.0
KAFKA_2014_BATCH_BYTES = 8_196  # the 2014 test's producer batch.size
JAVA_BATCH_BYTES = 16_384  # the Java producer's default batch.size
LIBRDKAFKA_BATCH_BYTES = 1_000_000  # librdkafka's default batch.size
JAVA_MAX_IN_FLIGHT = 5  # the Java producer's default max.in.flight.requests.per.connection
WIRE_UNIT_BYTES = 16_384  # CPU time per this many wire bytes: about one headline request


@dataclass(frozen=True, slots=True)
class Params:
    quick: bool
    records: int  # produce: stop after this many (the 2014 test sent 50 million)...
    max_s: float  # ...or after this long; consume reads back what was produced
    batch_bytes: int  # the headline producer's batch.size
    sweep_batch_bytes: tuple[int, ...]  # more producer runs at these batch sizes
    sweep_partitions: int  # and a produce + consume at this many partitions (0: none)
    sweep_max_s: float
    partitions: int
    in_flight: int  # produce requests outstanding on the connection
    partition_max_bytes: int  # per partition per fetch
    sink_max_s: float  # each generator-alone run against the trivial sink
    client_max_s: float  # each confluent-kafka run against runnel
    raw_bytes: int  # per raw baseline round
    rounds: int  # of raw baseline, generator alone and runnel, interleaved
    e2e_rate: float  # records/s
    e2e_seconds: float
    e2e_warmup_s: float  # left out of the percentiles
    linger_ms: float
    fetch_wait_ms: int
    pin: bool  # servers on CPU 0, load generators on CPU 1
    confluent: bool  # confluent-kafka importable: its runs happen
    replication: bool = True  # the replication runs happen (produce_consume_replication.py)


@dataclass(frozen=True, slots=True)
class Run:
    """One throughput measurement."""

    label: str
    role: str  # produce or consume (raw: write or read)
    partitions: int
    client: str  # which program made the load
    target: str  # what took it: the trivial sink, runnel, a file, a socket
    records: int
    wire_bytes: int | None  # None: not seen (librdkafka's own framing)
    seconds: float
    client_cpu_s: float
    server_cpu_s: float | None
    other_cores: float | None  # CPUs busy with other processes meanwhile (other tenants)
    batch_bytes: int | None
    server_kernel_cpu_s: float | None = None  # the part of server_cpu_s spent in the kernel

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def payload_mb_per_s(self) -> float:
        return self.records * VALUE_BYTES / self.seconds / MB

    @property
    def wire_mb_per_s(self) -> float | None:
        return None if self.wire_bytes is None else self.wire_bytes / self.seconds / MB

    @property
    def client_cores(self) -> float:
        return self.client_cpu_s / self.seconds

    @property
    def server_cores(self) -> float | None:
        return None if self.server_cpu_s is None else self.server_cpu_s / self.seconds

    @property
    def records_per_client_cpu_s(self) -> float:
        """What the load process could do with a whole core (its rate per busy core)."""
        return self.records / max(self.client_cpu_s, 1e-9)

    @property
    def records_per_server_cpu_s(self) -> float | None:
        """What the server could do with a whole core, if CPU bound (its rate per core)."""
        if self.server_cpu_s is None:
            return None
        return self.records / max(self.server_cpu_s, 1e-9)

    def server_us_per_16k(self) -> tuple[float, float] | None:
        """The server's (user, kernel) CPU microseconds per 16 KiB of wire bytes taken in or
        sent, when both were measured."""
        if self.server_cpu_s is None or self.server_kernel_cpu_s is None or not self.wire_bytes:
            return None
        per = WIRE_UNIT_BYTES / self.wire_bytes * 1e6
        kernel = self.server_kernel_cpu_s * per
        return self.server_cpu_s * per - kernel, kernel


@dataclass(frozen=True, slots=True)
class LatencyRound:
    """One paced run: its latencies (after the warm-up) as a histogram, and the CPU used."""

    histogram: dict[int, int]  # bucket (latency // bucket_ns) -> records
    bucket_ns: int
    sum_ns: int
    max_ns: int
    p99_ms: float  # this run's own, exact
    producer_cpu_s: float
    consumer_cpu_s: float
    server_cpu_s: float
    other_cores: float  # CPUs busy with other processes meanwhile (other tenants)


@dataclass(frozen=True, slots=True)
class Latency:
    """End-to-end latency at a fixed rate (due time in the producer to read in the
    consumer), over every round's records; percentiles at the buckets' resolution."""

    target: str
    rounds: tuple[LatencyRound, ...]

    @property
    def records(self) -> int:
        return sum(sum(r.histogram.values()) for r in self.rounds)

    def percentile_ms(self, q: float) -> float:
        """Nearest rank, the lower edge of the bucket it falls in."""
        merged: dict[int, int] = {}
        for r in self.rounds:
            for bucket, n in r.histogram.items():
                merged[bucket] = merged.get(bucket, 0) + n
        rank, seen = min(self.records - 1, int(q * self.records)), 0
        for bucket in sorted(merged):
            seen += merged[bucket]
            if seen > rank:
                return bucket * self.rounds[0].bucket_ns / 1e6
        return 0.0

    @property
    def p50_ms(self) -> float:
        return self.percentile_ms(0.50)

    @property
    def p99_ms(self) -> float:
        return self.percentile_ms(0.99)

    @property
    def p999_ms(self) -> float:
        return self.percentile_ms(0.999)

    @property
    def max_ms(self) -> float:
        return max(r.max_ns for r in self.rounds) / 1e6

    @property
    def mean_ms(self) -> float:
        return sum(r.sum_ns for r in self.rounds) / max(1, self.records) / 1e6

    @property
    def other_cores(self) -> float:
        return sum(r.other_cores for r in self.rounds) / len(self.rounds)


@dataclass(frozen=True, slots=True)
class Round:
    """The headline runs, measured one after the other so a noisy spell hits them all."""

    raw_write: Run
    raw_read: Run
    alone_produce: Run  # the raw generator into the trivial sink
    produce: Run  # the raw generator into runnel at ``batch_bytes``
    alone_consume: Run
    consume: Run  # the raw consumer of the round's topic, from offset 0

    @property
    def produce_ratio(self) -> float:
        """runnel's produce wire bytes/s over the raw write's."""
        return (self.produce.wire_mb_per_s or 0.0) / (self.raw_write.wire_mb_per_s or 1.0)

    @property
    def consume_ratio(self) -> float:
        return (self.consume.wire_mb_per_s or 0.0) / (self.raw_read.wire_mb_per_s or 1.0)

    @property
    def produce_headroom(self) -> float:
        """The generator's rate alone over its rate against runnel."""
        return self.alone_produce.records_per_s / self.produce.records_per_s

    @property
    def consume_headroom(self) -> float:
        return self.alone_consume.records_per_s / self.consume.records_per_s


@dataclass(frozen=True, slots=True)
class Results:
    sink_e2e: Latency  # the generator's own floor
    e2e: Latency
    rounds: tuple[Round, ...]
    clients: tuple[Run, ...]  # confluent-kafka: sink produce, runnel produce, sink/runnel consume
    sweep: tuple[Run, ...]  # raw generator on runnel: other batch sizes, six partitions
    replication: Replication | None = None  # 3 brokers; None: left out (--no-replication)
