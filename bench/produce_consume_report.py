"""The table and the JSON line of bench.produce_consume.

The headline figures are medians over the rounds (each runnel run next to its baselines);
ratios and headroom are taken per round, then the median. Every round is in the JSON.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from bench.common import git_state, ratio_text, verdict
from bench.produce_consume_figures import (
    TARGET_CONSUME_RECORDS_PER_S,
    TARGET_E2E_P99_MS,
    TARGET_PRODUCE_RATIO,
    TARGET_PRODUCE_RECORDS_PER_S,
    Latency,
    Params,
    Results,
    Round,
    Run,
)
from bench.produce_consume_replication_report import (
    headline_json,
    print_replication,
    replication_json,
)

__all__ = ["Summary", "measured_commit", "print_table", "report"]

MEASURED_PATHS = ("bench", "broker", "replication", "storage", "runnel", "controller")
LABEL_WIDTH = 48


def _median(rounds: Sequence[Round], figure: Callable[[Round], float]) -> float:
    return statistics.median(figure(r) for r in rounds)


def _split_median(
    rounds: Sequence[Round], run_of: Callable[[Round], Run]
) -> tuple[float, float] | None:
    """The medians of a server's (user, kernel) CPU us per 16 KiB; None if not measured."""
    splits = [run_of(r).server_us_per_16k() for r in rounds]
    known = [split for split in splits if split is not None]
    if not known:
        return None
    return statistics.median(u for u, _ in known), statistics.median(k for _, k in known)


class Summary:
    """The headline figures: medians over the rounds."""

    def __init__(self, results: Results) -> None:
        rounds = results.rounds
        self.produce = _median(rounds, lambda r: r.produce.records_per_s)
        self.produce_payload_mb = _median(rounds, lambda r: r.produce.payload_mb_per_s)
        self.produce_wire_mb = _median(rounds, lambda r: r.produce.wire_mb_per_s or 0.0)
        self.consume = _median(rounds, lambda r: r.consume.records_per_s)
        self.consume_payload_mb = _median(rounds, lambda r: r.consume.payload_mb_per_s)
        self.consume_wire_mb = _median(rounds, lambda r: r.consume.wire_mb_per_s or 0.0)
        self.produce_ratio = _median(rounds, lambda r: r.produce_ratio)
        self.consume_ratio = _median(rounds, lambda r: r.consume_ratio)
        self.produce_headroom = _median(rounds, lambda r: r.produce_headroom)
        self.consume_headroom = _median(rounds, lambda r: r.consume_headroom)
        self.raw_write_mb = _median(rounds, lambda r: r.raw_write.wire_mb_per_s or 0.0)
        self.raw_read_mb = _median(rounds, lambda r: r.raw_read.wire_mb_per_s or 0.0)
        self.alone_produce = _median(rounds, lambda r: r.alone_produce.records_per_s)
        self.alone_consume = _median(rounds, lambda r: r.alone_consume.records_per_s)
        self.generator_per_core = _median(rounds, lambda r: r.produce.records_per_client_cpu_s)
        self.broker_per_core = _median(rounds, lambda r: r.produce.records_per_server_cpu_s or 0.0)
        # What a CPU-second of the raw receiver takes in: on this VM it moves with the cost of
        # writing into new page-cache memory (docs/performance.md, "Page-cache memory").
        self.raw_receiver_per_core = _median(
            rounds, lambda r: r.raw_write.records_per_server_cpu_s or 0.0
        )
        # Where each side's CPU went: the kernel's part is mostly the copy into the page cache.
        self.broker_us_per_16k = _split_median(rounds, lambda r: r.produce)
        self.raw_receiver_us_per_16k = _split_median(rounds, lambda r: r.raw_write)
        self.produce_ratio_per_core = _median(
            rounds,
            lambda r: (
                (r.produce.records_per_server_cpu_s or 0.0)
                / (r.raw_write.records_per_server_cpu_s or 1.0)
            ),
        )
        self.e2e_p99_ms = results.e2e.p99_ms
        self.met = {
            "produce": self.produce >= TARGET_PRODUCE_RECORDS_PER_S,
            "consume": self.consume >= TARGET_CONSUME_RECORDS_PER_S,
            "ratio": self.produce_ratio >= TARGET_PRODUCE_RATIO,
            "e2e": self.e2e_p99_ms <= TARGET_E2E_P99_MS,
        }


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _run_row(run: Run) -> str:
    cores = f"{run.client_cores:.2f} {_num(run.server_cores, 2)} {_num(run.other_cores, 2)}"
    return (
        f"{run.label:<{LABEL_WIDTH}} {run.client:<16} {run.target:<7} {_num(run.records_per_s):>11}"
        f" {_num(run.payload_mb_per_s, 1):>8} {_num(run.wire_mb_per_s, 1):>9} {cores:>15}"
    )


def _latency_row(e2e: Latency) -> str:
    rounds = ", ".join(f"{r.p99_ms:.2f}" for r in e2e.rounds)
    return (
        f"  {e2e.target:<7} p50 {e2e.p50_ms:6.2f}  p99 {e2e.p99_ms:6.2f}  p99.9 {e2e.p999_ms:6.2f}"
        f"  max {e2e.max_ms:6.2f}  mean {e2e.mean_ms:5.2f} ms  over {e2e.records:,} records "
        f"(p99 by round: {rounds}); others' CPU {e2e.other_cores:.2f}"
    )


def _latency_json(e2e: Latency) -> dict[str, Any]:
    return {
        "records": e2e.records,
        "p50_ms": e2e.p50_ms,
        "p99_ms": e2e.p99_ms,
        "p999_ms": e2e.p999_ms,
        "max_ms": e2e.max_ms,
        "mean_ms": e2e.mean_ms,
        "resolution_ms": e2e.rounds[0].bucket_ns / 1e6,
        "rounds": [{k: v for k, v in asdict(r).items() if k != "histogram"} for r in e2e.rounds],
    }


def _print_runs(params: Params, results: Results) -> None:
    print(
        f"{'run':<{LABEL_WIDTH}} {'client':<16} {'target':<7} {'records/s':>11} {'MB/s':>8} "
        f"{'wire MB/s':>9} {'CPU cl srv oth':>15}"
    )
    for i, r in enumerate(results.rounds):
        print(f"-- round {i + 1} of {len(results.rounds)}")
        for run in (r.raw_write, r.raw_read, r.alone_produce, r.produce, r.alone_consume):
            print(_run_row(run))
        print(_run_row(r.consume))
    if results.clients:
        print("-- a real client: confluent-kafka (librdkafka defaults)")
        for run in results.clients:
            print(_run_row(run))
    print("-- other batch sizes and partitions (raw-protocol generator into runnel)")
    for run in results.sweep:
        print(_run_row(run))
    print(f"-- end-to-end latency, ms, at {params.e2e_rate:,.0f} records/s (raw protocol)")
    print(_latency_row(results.sink_e2e) + "  (generator alone: in-memory sink)")
    print(_latency_row(results.e2e))


def print_table(params: Params, results: Results, summary: Summary) -> None:
    s = summary
    print()
    print(
        f"Produce and consume over the Kafka protocol: 100-byte records, acks=1, replication "
        f"factor 1, {params.partitions} partition(s), one broker, one producer, one consumer"
    )
    _print_runs(params, results)
    print(
        "CPU cl srv oth: cores busy in the load process, in the server process, and in other "
        "processes (other tenants of the machine) during the run."
    )
    print()
    _print_targets(params, summary, len(results.rounds))
    print(
        f"produce {s.produce_payload_mb:,.1f} MB/s payload ({s.produce_wire_mb:,.1f} wire); "
        f"consume {s.consume_payload_mb:,.1f} MB/s payload ({s.consume_wire_mb:,.1f} wire), "
        f"{s.consume_ratio:.2f} x the raw sendfile"
    )
    print(
        f"the raw-protocol generator alone (trivial sink) is {s.produce_headroom:.1f} x its produce"
        f" rate and {s.consume_headroom:.1f} x its consume rate against runnel"
    )
    print(
        f"produce per busy core: the generator {s.generator_per_core:,.0f} records per CPU-second,"
        f" the runnel broker {s.broker_per_core:,.0f}, the raw receiver"
        f" {s.raw_receiver_per_core:,.0f} ({s.produce_ratio_per_core:.2f} x per core)"
    )
    if s.broker_us_per_16k is not None and s.raw_receiver_us_per_16k is not None:
        (broker_user, broker_kernel), (raw_user, raw_kernel) = (
            s.broker_us_per_16k,
            s.raw_receiver_us_per_16k,
        )
        print(
            f"CPU per 16 KiB taken in, user + kernel: the runnel broker {broker_user:.1f} +"
            f" {broker_kernel:.1f} us, the raw receiver {raw_user:.1f} + {raw_kernel:.1f} us"
        )
    if results.replication is not None:
        print_replication(results.replication)


def _print_targets(params: Params, s: Summary, rounds: int) -> None:
    rows = [
        ("produce records/s", TARGET_PRODUCE_RECORDS_PER_S, s.produce, "produce"),
        ("consume records/s", TARGET_CONSUME_RECORDS_PER_S, s.consume, "consume"),
    ]
    print(f"{f'figure (median of {rounds} round(s))':<38} {'target':>14} {'runnel':>12}")
    for name, target, value, key in rows:
        print(f"{name:<38} {f'>= {target:,}':>14} {value:>12,.0f}  {verdict(s.met[key])}")
    name, target_text = "produce / raw write, wire bytes/s", f">= {TARGET_PRODUCE_RATIO}"
    ratio = ratio_text(s.produce_ratio)
    print(f"{name:<38} {target_text:>14} {ratio:>12}  {verdict(s.met['ratio'])}")
    name, target_text = f"e2e p99 at {params.e2e_rate:,.0f} records/s", f"<= {TARGET_E2E_P99_MS} ms"
    value_text = f"{s.e2e_p99_ms:.2f} ms"
    print(f"{name:<38} {target_text:>14} {value_text:>12}  {verdict(s.met['e2e'])}")


def _run_json(run: Run) -> dict[str, Any]:
    out = asdict(run)
    out["records_per_s"] = run.records_per_s
    out["payload_mb_per_s"] = run.payload_mb_per_s
    out["wire_mb_per_s"] = run.wire_mb_per_s
    out["records_per_client_cpu_s"] = run.records_per_client_cpu_s
    out["records_per_server_cpu_s"] = run.records_per_server_cpu_s
    return out


def _round_json(r: Round) -> dict[str, Any]:
    runs = (r.raw_write, r.raw_read, r.alone_produce, r.produce, r.alone_consume, r.consume)
    names = ("raw_write", "raw_read", "alone_produce", "produce", "alone_consume", "consume")
    out: dict[str, Any] = {name: _run_json(run) for name, run in zip(names, runs, strict=True)}
    out["produce_ratio_to_raw"] = r.produce_ratio
    out["consume_ratio_to_raw"] = r.consume_ratio
    return out


def measured_commit() -> tuple[str | None, bool]:
    """The commit measured and whether the measured paths had uncommitted changes; taken at
    the start, when the processes load the code."""
    return git_state(*MEASURED_PATHS)


def report(
    params: Params,
    results: Results,
    summary: Summary,
    commit: tuple[str | None, bool],
    load_at_start: float,
    elapsed_s: float,
) -> dict[str, Any]:
    r, s = results, summary
    return {
        "benchmark": "produce_consume",
        "produce_records_per_s": s.produce,
        "consume_records_per_s": s.consume,
        "produce_ratio_to_raw": s.produce_ratio,
        "e2e_p99_ms": r.e2e.p99_ms,
        "e2e_p50_ms": r.e2e.p50_ms,
        "e2e_p999_ms": r.e2e.p999_ms,
        "produce_payload_mb_per_s": s.produce_payload_mb,
        "produce_wire_mb_per_s": s.produce_wire_mb,
        "consume_payload_mb_per_s": s.consume_payload_mb,
        "consume_wire_mb_per_s": s.consume_wire_mb,
        "consume_ratio_to_raw": s.consume_ratio,
        "raw_write_mb_per_s": s.raw_write_mb,
        "raw_read_mb_per_s": s.raw_read_mb,
        "generator_alone_produce_records_per_s": s.alone_produce,
        "generator_alone_consume_records_per_s": s.alone_consume,
        "generator_produce_headroom": s.produce_headroom,
        "generator_consume_headroom": s.consume_headroom,
        "generator_produce_records_per_cpu_s": s.generator_per_core,
        "broker_produce_records_per_cpu_s": s.broker_per_core,
        "raw_receiver_records_per_cpu_s": s.raw_receiver_per_core,
        "produce_ratio_to_raw_per_cpu_s": s.produce_ratio_per_core,
        "broker_user_kernel_us_per_16k": s.broker_us_per_16k,
        "raw_receiver_user_kernel_us_per_16k": s.raw_receiver_us_per_16k,
        **headline_json(r.replication),
        "targets": {
            "produce_records_per_s": TARGET_PRODUCE_RECORDS_PER_S,
            "consume_records_per_s": TARGET_CONSUME_RECORDS_PER_S,
            "produce_ratio_to_raw": TARGET_PRODUCE_RATIO,
            "e2e_p99_ms": TARGET_E2E_P99_MS,
        },
        "met": s.met,
        "rounds": [_round_json(x) for x in r.rounds],
        "confluent_kafka": [_run_json(x) for x in r.clients],
        "sweep": [_run_json(x) for x in r.sweep],
        "e2e": {"sink": _latency_json(r.sink_e2e), "runnel": _latency_json(r.e2e)},
        "replication": None if r.replication is None else replication_json(r.replication),
        "params": asdict(params),
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "elapsed_s": elapsed_s,
        "commit": commit[0],
        "uncommitted_changes": commit[1],
    }
