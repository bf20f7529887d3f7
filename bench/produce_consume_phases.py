"""The measurements of bench.produce_consume, one function per kind of run.

How this works. Every run is a server (the raw receiver, the trivial sink, or the runnel
broker) and one or two load processes (``produce_consume_procs.Proc``). A load process
measures its own rate and CPU; the server's CPU seconds are read from /proc around the run.
A run's time bound is its ``max_s`` plus ``GRACE_S`` for start-up and the requests in flight;
a role that overruns it fails the benchmark.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from bench.produce_consume_figures import LatencyRound, Params, Run
from bench.produce_consume_procs import (
    CLIENT_CPUS,
    SERVER_CPUS,
    Proc,
    cpu_times,
    machine_busy_s,
)

__all__ = ["Target", "confluent_run", "e2e_run", "load_run", "raw_round", "sink"]

READY_TIMEOUT_S = 60.0
GRACE_S = 30.0
RAW_TIMEOUT_S = 300.0
LOAD = "bench.kafka_load"
CONFLUENT = "bench.produce_consume_client"
RAW_CLIENT = "raw protocol"
CONFLUENT_CLIENT = "confluent-kafka"


def _cpus(params: Params, cpus: frozenset[int]) -> frozenset[int] | None:
    return cpus if params.pin else None


class Target(NamedTuple):
    """The server a run loads: its name in the table, Kafka address and process id."""

    name: str
    bootstrap: str
    pid: int


@contextmanager
def sink(params: Params, mode: str, topic: str) -> Iterator[Target]:
    """A trivial sink process while the block runs."""
    args = ["--mode", mode, "--topic", topic, "--partitions", str(params.partitions)]
    args += ["--batch-bytes", str(params.batch_bytes)]
    proc = Proc(f"sink ({mode})", "bench.produce_consume_sink", args, _cpus(params, SERVER_CPUS))
    try:
        port = proc.ready(READY_TIMEOUT_S)
        yield Target("sink", f"127.0.0.1:{port}", proc.pid)
    finally:
        proc.stop()


def raw_round(root: Path, params: Params) -> tuple[Run, Run]:
    """The raw baseline: the write into a file, then the sendfile back."""
    receiver = Proc(
        "raw receiver",
        "bench.produce_consume_raw",
        ["receive", "--dir", str(root)],
        _cpus(params, SERVER_CPUS),
    )
    sender = None
    try:
        port = receiver.ready(READY_TIMEOUT_S)
        args = ["send", "--address", f"127.0.0.1:{port}", "--bytes", str(params.raw_bytes)]
        args += ["--partitions", str(params.partitions), "--batch-bytes", str(params.batch_bytes)]
        sender = Proc("raw sender", "bench.produce_consume_raw", args, _cpus(params, CLIENT_CPUS))
        sent = sender.result(RAW_TIMEOUT_S)
        received = receiver.result(RAW_TIMEOUT_S)
    finally:
        receiver.stop()
        if sender is not None:
            sender.stop()
    records_per_byte = sent["records"] / sent["bytes"]

    def other_cores(phase: str, seconds: float) -> float:
        ours = float(sent[f"cpu_{phase}_s"]) + float(received[f"cpu_{phase}_s"])
        return max(0.0, float(sent[f"busy_{phase}_s"]) - ours) / seconds

    write = Run(
        "raw: produce stream over a socket into a file",
        "write",
        params.partitions,
        "plain socket",
        "file",
        sent["records"],
        sent["bytes"],
        sent["write_s"],
        sent["cpu_write_s"],
        received["cpu_write_s"],
        other_cores("write", sent["write_s"]),
        params.batch_bytes,
        received["cpu_write_kernel_s"],
    )
    read = Run(
        "raw: sendfile of that file to a reader",
        "read",
        params.partitions,
        "sendfile",
        "socket",
        round(sent["read_bytes"] * records_per_byte),
        sent["read_bytes"],
        sent["read_s"],
        sent["cpu_read_s"],
        received["cpu_read_s"],
        other_cores("read", sent["read_s"]),
        params.batch_bytes,
    )
    return write, read


def _common(bootstrap: str, topic: str) -> list[str]:
    return ["--bootstrap", bootstrap, "--topic", topic]


class Window(NamedTuple):
    """What a role reported, and what the machine did from its ``ready`` to its end."""

    result: dict[str, Any]
    server_cpu_s: float
    server_kernel_cpu_s: float  # the part of server_cpu_s spent in the kernel
    busy_s: float  # CPU seconds the whole machine was busy
    wall_s: float

    def other_cores(self, more_cpu_s: float = 0.0) -> float:
        """Busy CPUs not explained by the role, the server and ``more_cpu_s``: other
        processes (other tenants of the machine, the controller, this process)."""
        ours = self.server_cpu_s + float(self.result["cpu_s"]) + more_cpu_s
        return max(0.0, self.busy_s - ours) / self.wall_s


def _measure(proc: Proc, server_pid: int, timeout_s: float) -> Window:
    try:
        proc.ready(READY_TIMEOUT_S)
        (user0, kernel0), busy0, start = cpu_times(server_pid), machine_busy_s(), time.monotonic()
        result = proc.result(timeout_s)
        user, kernel = cpu_times(server_pid)
        busy, wall = machine_busy_s() - busy0, time.monotonic() - start
    finally:
        proc.stop()
    return Window(result, user - user0 + kernel - kernel0, kernel - kernel0, busy, wall)


def load_run(
    label: str,
    role: str,
    target: Target,
    topic: str,
    params: Params,
    max_s: float,
    batch_bytes: int | None = None,
    *,
    records: int | None = None,
) -> Run:
    """The raw generator's ``produce`` or ``consume`` role: until ``records`` (default
    ``params.records``) or ``max_s``."""
    name, bootstrap, server_pid = target
    records = params.records if records is None else records
    args = [role, *_common(bootstrap, topic), "--records", str(records), "--max-s", str(max_s)]
    args += ["--in-flight", str(params.in_flight)]
    args += ["--partition-max-bytes", str(params.partition_max_bytes)]
    if batch_bytes is not None:
        args += ["--batch-bytes", str(batch_bytes)]
    proc = Proc(f"{role} ({name})", LOAD, args, _cpus(params, CLIENT_CPUS))
    window = _measure(proc, server_pid, max_s + GRACE_S)
    result = window.result
    return Run(
        label,
        role,
        result["partitions"],
        RAW_CLIENT,
        name,
        result["records"],
        result["wire_bytes"],
        result["seconds"],
        result["cpu_s"],
        window.server_cpu_s,
        window.other_cores(),
        result.get("batch_bytes"),
        window.server_kernel_cpu_s,
    )


def confluent_run(
    label: str,
    role: str,
    target: Target,
    topic: str,
    params: Params,
    max_s: float,
    *,
    records: int | None = None,
) -> Run:
    """confluent-kafka's ``produce`` or ``consume``: until ``records`` or ``max_s``."""
    records = params.records if records is None else records
    name, bootstrap, server_pid = target
    args = [role, *_common(bootstrap, topic), "--records", str(records), "--max-s", str(max_s)]
    proc = Proc(f"confluent-kafka {role} ({name})", CONFLUENT, args, _cpus(params, CLIENT_CPUS))
    window = _measure(proc, server_pid, max_s + GRACE_S)
    result = window.result
    return Run(
        label,
        role,
        result["partitions"],
        CONFLUENT_CLIENT,
        name,
        result["records"],
        None,
        result["seconds"],
        result["cpu_s"],
        window.server_cpu_s,
        window.other_cores(),
        None,
    )


def e2e_run(
    target: Target, topic: str, params: Params, seconds: float, start_offset: int
) -> tuple[LatencyRound, int]:
    """The paced producer and the long-polling consumer (raw-protocol processes) for
    ``seconds``, the consumer from ``start_offset``; the round and the records produced."""
    name, bootstrap, server_pid = target
    args = [*_common(bootstrap, topic), "--rate", str(params.e2e_rate)]
    args += ["--seconds", str(seconds), "--warmup-s", str(params.e2e_warmup_s)]
    args += ["--linger-ms", str(params.linger_ms), "--max-wait-ms", str(params.fetch_wait_ms)]
    cpus = _cpus(params, CLIENT_CPUS)
    consume_args = ["e2e-consume", *args, "--start-offset", str(start_offset)]
    consumer = Proc(f"e2e consumer ({name})", LOAD, consume_args, cpus)
    producer = None
    timeout_s = seconds + GRACE_S
    try:
        consumer.ready(READY_TIMEOUT_S)
        producer = Proc(f"e2e producer ({name})", LOAD, ["e2e-produce", *args], cpus)
        window = _measure(producer, server_pid, timeout_s)
        consumed = consumer.result(timeout_s)
    finally:
        consumer.stop()
        if producer is not None:
            producer.stop()
    produced = window.result
    if consumed["p50_ms"] is None or consumed["records"] != produced["records"]:
        raise RuntimeError(f"e2e on {name}: produced {produced}, consumed {consumed}")
    histogram = {int(bucket): int(n) for bucket, n in consumed["histogram"].items()}
    latency = LatencyRound(
        histogram,
        consumed["histogram_bucket_ns"],
        consumed["sum_ns"],
        consumed["max_ns"],
        consumed["p99_ms"],
        produced["cpu_s"],
        consumed["cpu_s"],
        window.server_cpu_s,
        window.other_cores(consumed["cpu_s"]),
    )
    return latency, int(produced["records"])
