"""bench.metadata's output: the table for people and the JSON line for tools.

How this works. ``print_table`` shows each figure beside its raw baseline and the ratio, then
the targets of issue 4 met or missed; ``report`` returns one flat JSON object (headline figures
first, then the details, the parameters, the machine and the commit measured). The creation
target is for 100,000 partitions: a smaller run is compared at its rate per 1,000 partitions
(0.6 s), and says so.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from bench.common import git_state, verdict
from bench.metadata_figures import (
    TARGET_CATCH_UP_S,
    TARGET_CREATE_S,
    TARGET_PARTITIONS,
    Params,
    Results,
)

MB = 1_000_000


def per_thousand(seconds: float, params: Params) -> float:
    return seconds * 1000 / params.total_partitions


def create_target_met(params: Params, r: Results) -> bool:
    limit = TARGET_CREATE_S * params.total_partitions / TARGET_PARTITIONS
    return r.create.wall_s <= limit


def _row(name: str, runnel: str, baseline: str = "", ratio: str = "") -> str:
    return f"  {name:<42} {runnel:<22} {baseline:<30} {ratio}".rstrip()


def _create_rows(params: Params, r: Results) -> list[str]:
    c, b = r.create, r.baselines
    active_cpu = c.cpu_s.get(c.active_controller, 0.0)
    return [
        _row(
            f"create {params.total_partitions:,} partitions",
            f"{c.wall_s:.2f} s",
            f"gRPC alone: {b.grpc_create_s:.2f} s",
            f"{c.wall_s / b.grpc_create_s:.1f}",
        ),
        _row("  wall per 1,000 partitions", f"{per_thousand(c.wall_s, params):.3f} s"),
        _row(
            f"  active controller ({c.active_controller}) CPU per 1,000",
            f"{per_thousand(active_cpu, params):.3f} s",
        ),
        _row("  all nodes' CPU per 1,000", f"{per_thousand(sum(c.cpu_s.values()), params):.3f} s"),
        _row(
            "  request p50 / p99",
            f"{c.latency.p50_ms:.0f} / {c.latency.p99_ms:.0f} ms",
            f"gRPC rtt {b.grpc_rtt.p50_ms:.2f} / {b.grpc_rtt.p99_ms:.2f} ms",
        ),
        _row(
            f"  {b.records:,} records ({b.record_bytes / MB:.1f} MB)",
            f"image replay {b.replay_s:.2f} s",
            f"encode + decode: {b.encode_decode_s:.2f} s",
        ),
        _row("  every broker reported the last offset", f"{c.all_brokers_s:.2f} s"),
    ]


def _snapshot_rows(r: Results) -> list[str]:
    s = r.snapshot
    return [
        _row(
            f"snapshot {s.file_name[:20]}…: {s.size_bytes / MB:.2f} MB",
            f"{s.partitions:,} partitions",
        ),
        _row(
            "  load cold / median of 3",
            f"{s.cold_load_s:.2f} / {s.load_s.p50_ms / 1000:.2f} s",
            f"parse only: {s.parse_s:.2f} s",
            f"{s.cold_load_s / s.parse_s:.1f}",
        ),
        _row("  encode (each snapshot a node takes)", f"{s.encode_s:.2f} s"),
        _row(
            "  image memory: tracemalloc / RSS",
            f"{s.traced_bytes / MB:.0f} / {s.rss_delta_bytes / MB:.0f} MB",
            f"snapshot file: {s.size_bytes / MB:.1f} MB",
            f"{s.traced_bytes / s.size_bytes:.0f}",
        ),
    ]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _catch_up_rows(r: Results) -> list[str]:
    u, s = r.catch_up, r.snapshot
    return [
        _row(
            f"broker {u.broker_id} cold catch-up to offset {u.target_offset:,}",
            f"(controller log starts {u.controller_log_start:,})",
        ),
        _row("  process ready", f"{u.started_s:.2f} s"),
        _row("  observing the Raft leader", _seconds(u.observer_s)),
        _row(f"  snapshot fetched (ends {u.snapshot_end_offset})", _seconds(u.snapshot_fetched_s)),
        _row("  snapshot loaded", _seconds(u.snapshot_loaded_s)),
        _row(
            "  caught up (reported offset)",
            f"{u.catch_up_s:.2f} s",
            f"snapshot load alone: {s.cold_load_s:.2f} s",
            f"{u.catch_up_s / s.cold_load_s:.1f}",
        ),
        _row("  unfenced", f"{u.unfenced_s:.2f} s"),
    ]


def _loaded_stop_rows(r: Results) -> list[str]:
    s = r.loaded_stop
    after = "no answer" if s.epoch_after is None else str(s.epoch_after)
    return [
        _row(f"broker {s.broker_id} stopped (holding topics)", f"{s.stop_s:.2f} s ({s.stop_exit})"),
        _row("  controller epoch before / 30 s after", f"{s.epoch_before} / {after}"),
    ]


def print_table(params: Params, r: Results) -> None:
    print(
        f"\n{params.topics:,} topics x {params.partitions} partitions (replication factor "
        f"{params.replication_factor}) on {params.controllers} controllers + {params.brokers} "
        f"brokers (+ 1 spare); {params.concurrency} CreateTopics of "
        f"{params.topics_per_request} topics in flight; metadata_snapshot_bytes "
        f"{params.snapshot_bytes:,}"
    )
    print(_row("figure", "runnel", "baseline", "ratio"))
    rows = [*_create_rows(params, r), *_snapshot_rows(r), *_catch_up_rows(r)]
    for line in [*rows, *_loaded_stop_rows(r)]:
        print(line)
    if r.create.errors:
        print(f"  refused topics: {r.create.errors}")
    before, after = r.create.controller_epochs
    if before != after:
        print(f"  the controller epoch moved from {before} to {after} during the creation")
    scaled = "" if params.total_partitions == TARGET_PARTITIONS else " (at this run's rate)"
    print("targets:")
    print(f"  100,000 partitions in <= 60 s{scaled}: {verdict(create_target_met(params, r))}")
    print(f"  catch-up <= 10 s: {verdict(r.catch_up.catch_up_s <= TARGET_CATCH_UP_S)}")


def git_commit() -> str:
    commit, dirty = git_state()
    return (commit or "unknown") + ("-dirty" if dirty else "")


def report(params: Params, r: Results, load_at_start: float, elapsed_s: float) -> dict[str, Any]:
    out = _headline(params, r)
    out["create"] = _create_json(r)
    out["snapshot"] = _snapshot_json(r)
    out["catch_up"] = _catch_up_json(r)
    out["loaded_stop"] = {
        "broker": r.loaded_stop.broker_id,
        "stop_s": round(r.loaded_stop.stop_s, 3),
        "stop_exit": r.loaded_stop.stop_exit,
        "controller_epoch_before": r.loaded_stop.epoch_before,
        "controller_epoch_after": r.loaded_stop.epoch_after,
    }
    out["params"] = {
        "quick": params.quick,
        "topics": params.topics,
        "partitions_per_topic": params.partitions,
        "replication_factor": params.replication_factor,
        "controllers": params.controllers,
        "brokers": params.brokers,
        "spare_brokers": 1,
        "concurrency": params.concurrency,
        "topics_per_request": params.topics_per_request,
        "metadata_snapshot_bytes": params.snapshot_bytes,
        "rtt_samples": params.rtt_samples,
    }
    return out | {
        "cpus": os.cpu_count(),
        "load_average_at_start": round(load_at_start, 2),
        "load_average_at_end": round(os.getloadavg()[0], 2),
        "elapsed_s": round(elapsed_s, 1),
        "commit": git_commit(),
    }


def _headline(params: Params, r: Results) -> dict[str, Any]:
    c, b, s, u = r.create, r.baselines, r.snapshot, r.catch_up
    active_cpu = c.cpu_s.get(c.active_controller, 0.0)
    all_cpu = sum(c.cpu_s.values())
    return {
        "create_s": round(c.wall_s, 3),
        "catch_up_s": round(u.catch_up_s, 3),
        "snapshot_load_s": round(s.cold_load_s, 3),
        "create_s_per_1000_partitions": round(per_thousand(c.wall_s, params), 4),
        "controller_cpu_s_per_1000_partitions": round(per_thousand(active_cpu, params), 4),
        "all_nodes_cpu_s_per_1000_partitions": round(per_thousand(all_cpu, params), 4),
        "image_traced_bytes": s.traced_bytes,
        "image_rss_delta_bytes": s.rss_delta_bytes,
        "snapshot_bytes": s.size_bytes,
        "baseline_grpc_create_s": round(b.grpc_create_s, 3),
        "baseline_grpc_rtt_p50_ms": round(b.grpc_rtt.p50_ms, 3),
        "baseline_grpc_rtt_p99_ms": round(b.grpc_rtt.p99_ms, 3),
        "baseline_records_encode_decode_s": round(b.encode_decode_s, 3),
        "baseline_snapshot_parse_s": round(s.parse_s, 3),
        "create_ratio_grpc": round(c.wall_s / b.grpc_create_s, 2),
        "snapshot_load_ratio_parse": round(s.cold_load_s / s.parse_s, 2),
        "catch_up_ratio_snapshot_load": round(u.catch_up_s / s.cold_load_s, 2),
        "target_create_met": create_target_met(params, r),
        "target_catch_up_met": u.catch_up_s <= TARGET_CATCH_UP_S,
    }


def _create_json(r: Results) -> dict[str, Any]:
    c, b = r.create, r.baselines
    return {
        "request_p50_ms": round(c.latency.p50_ms, 2),
        "request_p99_ms": round(c.latency.p99_ms, 2),
        "request_max_ms": round(c.latency.max_ms, 2),
        "errors": c.errors,
        "active_controller": c.active_controller,
        "cpu_s": {str(i): round(v, 2) for i, v in sorted(c.cpu_s.items())},
        "all_brokers_reported_s": round(c.all_brokers_s, 3),
        "controller_epochs": list(c.controller_epochs),
        "metadata_offset": c.metadata_offset,
        "topics": c.topics,
        "partitions": c.partitions,
        "records": b.records,
        "record_bytes": b.record_bytes,
        "image_replay_in_process_s": round(b.replay_s, 3),
    }


def _snapshot_json(r: Results) -> dict[str, Any]:
    s = r.snapshot
    return {
        "file": s.file_name,
        "end_offset": s.end_offset,
        "image_offset": s.image_offset,
        "topics": s.topics,
        "partitions": s.partitions,
        "load_samples_s": [round(x, 3) for x in s.load_s.samples],
        "load_median_s": round(statistics.median(s.load_s.samples), 3),
        "encode_s": round(s.encode_s, 3),
        "memory": "tracemalloc and RSS growth of one load in a fresh process",
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _catch_up_json(r: Results) -> dict[str, Any]:
    u = r.catch_up
    return {
        "broker": u.broker_id,
        "target_offset": u.target_offset,
        "controller_log_start": u.controller_log_start,
        "process_ready_s": round(u.started_s, 3),
        "observer_s": _rounded(u.observer_s),
        "snapshot_fetched_s": _rounded(u.snapshot_fetched_s),
        "snapshot_loaded_s": _rounded(u.snapshot_loaded_s),
        "fetched_snapshot_end_offset": u.snapshot_end_offset,
        "unfenced_s": round(u.unfenced_s, 3),
    }
