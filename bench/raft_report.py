"""bench.raft's output: the table for people and the JSON line for tools.

How this works. ``print_table`` shows each figure next to its raw baseline and the ratio, with
the targets met or missed; ``report`` returns one flat JSON object (the headline figures first,
then every distribution, the parameters, the machine and the commit measured).
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import Any

from bench.common import git_state, verdict
from bench.raft_figures import (
    ELECTION_TIMEOUT_MS,
    FETCH_MAX_WAIT_MS,
    FETCH_TIMEOUT_MS,
    FSYNC_WRITE_BYTES,
    RAFT_DEFAULTS,
    RATE_PER_S,
    ROUNDS,
    SNAPSHOT_EVERY_RECORDS,
    Distribution,
    Load,
    PacedRun,
    Params,
    Results,
)


def load_json(load: Load) -> dict[str, Any]:
    return {
        "requests_per_s": round(load.requests_per_s),
        "latency": load.latency.summary(),
        "errors": load.errors,
        "connections": load.connections,
        "pipeline_depth": load.pipeline_depth,
        "window_s": round(load.window_s, 2),
        "client_cpu_s": load.client_cpu_s,
        "server_cpu_s": load.server_cpu_s,
    }


def paced_json(run: PacedRun) -> dict[str, Any]:
    return run.latency.summary() | {
        "errors": run.errors,
        "connections_used": run.connections_used,
        "max_send_lag_ms": round(run.max_send_lag_ms, 3),
    }


def report(params: Params, r: Results, load_at_start: float, elapsed_s: float) -> dict[str, Any]:
    single, *batched = r.throughput
    b, lat = r.baseline, r.latency.latency
    out: dict[str, Any] = {
        "commit_p50_ms": round(lat.p50_ms, 3),
        "commit_p99_ms": round(lat.p99_ms, 3),
        "records_per_s": round(single.records_per_s),
        "proposals_per_s": round(single.proposals_per_s),
        "failover_median_s": round(statistics.median(r.failover_s), 3),
        "failover_max_s": round(max(r.failover_s), 3),
        "election_median_s": round(statistics.median(r.elected_s), 3),
        "election_max_s": round(max(r.elected_s), 3),
        "failover_repeated_elections": sum(t.epochs > 1 for t in r.failover),
        "baseline_echo_rtt_p50_ms": round(b.echo.latency.p50_ms, 3),
        "baseline_echo_rtt_p99_ms": round(b.echo.latency.p99_ms, 3),
        "baseline_grpc_rtt_p50_ms": round(b.grpc.latency.p50_ms, 3),
        "baseline_grpc_rtt_p99_ms": round(b.grpc.latency.p99_ms, 3),
        "baseline_fdatasync_p50_ms": round(b.fsync.p50_ms, 3),
        "baseline_fdatasync_p99_ms": round(b.fsync.p99_ms, 3),
        "baseline_commit_floor_p50_ms": round(r.floor_p50_ms, 3),
        "baseline_commit_floor_p99_ms": round(r.floor_p99_ms, 3),
        "commit_ratio_p50": round(lat.p50_ms / r.floor_p50_ms, 2),
        "commit_ratio_p99": round(lat.p99_ms / r.floor_p99_ms, 2),
        "baseline_echo_requests_per_s": round(b.echo_load.requests_per_s),
        "throughput_ratio": round(single.proposals_per_s / b.echo_load.requests_per_s, 3),
    }
    for t in batched:
        out[f"records_per_s_incr{t.records_per_proposal}"] = round(t.records_per_s)
        out[f"proposals_per_s_incr{t.records_per_proposal}"] = round(t.proposals_per_s)
    out["commit_latency"] = paced_json(r.latency)
    out["latency_rounds"] = {
        name: [{"p50_ms": round(d.p50_ms, 3), "p99_ms": round(d.p99_ms, 3)} for d in side]
        for name, side in r.rounds.items()
    }
    out["echo_rtt"] = paced_json(b.echo)
    out["grpc_rtt"] = paced_json(b.grpc)
    out["fdatasync"] = b.fsync.summary() | {"write_bytes": FSYNC_WRITE_BYTES}
    out["echo_load"] = load_json(b.echo_load)
    out["throughput"] = {
        f"incr{t.records_per_proposal}": load_json(t.load)
        | {"records_per_s": round(t.records_per_s), "leader_id": t.leader_id}
        for t in r.throughput
    }
    out["failover_trials"] = [
        {
            "killed": t.killed,
            "new_leader": t.new_leader,
            "elected_s": round(t.elected_s, 3),
            "commit_s": round(t.commit_s, 3),
            "epochs": t.epochs,
        }
        for t in r.failover
    ]
    out |= {
        "quick": params.quick,
        "raft_timeouts": "defaults",
        "election_timeout_ms": ELECTION_TIMEOUT_MS,
        "fetch_timeout_ms": FETCH_TIMEOUT_MS,
        "fetch_max_wait_ms": FETCH_MAX_WAIT_MS,
        "append_linger_ms": RAFT_DEFAULTS.append_linger_ms,
        "snapshot_every_records": SNAPSHOT_EVERY_RECORDS,
        "latency_mode": "open loop, paced",
        "latency_rate_per_s": RATE_PER_S,
        "latency_proposals": params.latency_proposals,
        "baseline_requests": params.baseline_requests,
        "fsync_samples": params.fsync_samples,
        "throughput_mode": "pipelined",
        "throughput_connections": params.connections,
        "throughput_pipeline_depth": params.pipeline_depth,
        "throughput_window_s": params.throughput_window_s,
        "throughput_warmup_s": params.throughput_warmup_s,
        "failover_trials_count": len(r.failover),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "load_average_1m_at_start": round(load_at_start, 2),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "elapsed_s": round(elapsed_s, 1),
    }
    return out | source_version()


def source_version() -> dict[str, Any]:
    """The commit measured, and whether raft/ (or what it stands on) had uncommitted changes."""
    commit, dirty = git_state("raft", "storage", "proto")
    return {"git_commit": commit, "raft_uncommitted_changes": dirty}


def print_table(params: Params, r: Results) -> None:
    b, lat = r.baseline, r.latency.latency
    print(f"\n{'latency (ms)':<46}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}  target")
    rows: list[tuple[str, Distribution, str]] = [
        (f"baseline: line echo round trip, {RATE_PER_S}/s", b.echo.latency, ""),
        (f"baseline: gRPC unary round trip, {RATE_PER_S}/s", b.grpc.latency, ""),
        (f"baseline: write {FSYNC_WRITE_BYTES} B + fdatasync", b.fsync, ""),
        (
            f"commit INCR 1, {RATE_PER_S}/s open loop",
            lat,
            f"p99 <= 10: {verdict(lat.p99_ms <= 10)}",
        ),
    ]
    for label, d, target in rows:
        figures = f"{d.p50_ms:>8.2f}{d.ms(0.9):>8.2f}{d.p99_ms:>8.2f}{d.max_ms:>8.2f}"
        print(f"{label:<46}{figures}  {target}")
    floor = f"{r.floor_p50_ms:>8.2f}{'':>8}{r.floor_p99_ms:>8.2f}"
    print(f"{'floor: 2 x echo + 2 x fdatasync':<46}{floor}")
    ratios = f"{lat.p50_ms / r.floor_p50_ms:>8.2f}{'':>8}{lat.p99_ms / r.floor_p99_ms:>8.2f}"
    print(f"{'ratio commit / floor':<46}{ratios}")
    by_round = "; ".join(
        f"{name} " + " / ".join(f"{d.p99_ms:.1f}" for d in side) for name, side in r.rounds.items()
    )
    print(f"p99 by round (ms): {by_round}")

    print(
        f"\n{'throughput, pipelined':<30}{'records/s':>10}{'requests/s':>11}{'p50 ms':>8}"
        f"{'p99 ms':>8}{'errors':>7}  CPU s in window  target"
    )
    loads: list[tuple[str, Load, float, str]] = [
        (f"baseline: line echo {params.connections}x{params.pipeline_depth}", b.echo_load, 0.0, ""),
    ]
    for t in r.throughput:
        label = f"INCR {t.records_per_proposal} {t.load.connections}x{t.load.pipeline_depth}"
        target = f">= 20000: {verdict(t.records_per_s >= 20_000)}"
        loads.append((label, t.load, t.records_per_s, target))
    for label, load, records, target in loads:
        cpu = ", ".join(f"{name} {c:.1f}" for name, c in load.server_cpu_s.items())
        records_text = f"{records:.0f}" if records else "-"
        print(
            f"{label:<30}{records_text:>10}{load.requests_per_s:>11.0f}"
            f"{load.latency.p50_ms:>8.1f}{load.latency.p99_ms:>8.1f}{load.errors:>7}"
            f"  client {load.client_cpu_s:.1f}, {cpu}  {target}"
        )
    single = r.throughput[0]
    print(
        f"{'ratio INCR 1 / echo':<30}{'':>10}"
        f"{single.proposals_per_s / b.echo_load.requests_per_s:>11.3f}"
    )

    fo, el = r.failover_s, r.elected_s
    print(f"\n{'failover (s), ' + str(len(fo)) + ' trials':<40}{'median':>8}{'max':>8}  target")
    print(
        f"{'kill -9 -> a survivor reports leader':<40}{statistics.median(el):>8.3f}{max(el):>8.3f}"
    )
    print(
        f"{'kill -9 -> first new commit':<40}{statistics.median(fo):>8.3f}{max(fo):>8.3f}"
        f"  median <= 1.5: {verdict(statistics.median(fo) <= 1.5)}"
    )
    repeated = sum(t.epochs > 1 for t in r.failover)
    print(f"trials that needed more than one election (epoch moved by 2 or more): {repeated}")
    print(
        f"\nRaft timeouts: defaults (election {ELECTION_TIMEOUT_MS} ms, fetch "
        f"{FETCH_TIMEOUT_MS} ms, fetch max wait {FETCH_MAX_WAIT_MS} ms, "
        f"linger {RAFT_DEFAULTS.append_linger_ms} ms); "
        f"snapshot every {SNAPSHOT_EVERY_RECORDS} records.\n"
        f"latency: {params.latency_proposals} proposals in {ROUNDS} rounds alternating with "
        f"the baselines, after a 1 s warm-up each, open loop (sent on "
        f"schedule on an idle connection; {r.latency.connections_used} connections used, worst "
        f"send lag {r.latency.max_send_lag_ms:.1f} ms); baselines: {params.baseline_requests} "
        f"requests the same way.\nthroughput: {params.throughput_window_s:.0f} s window after "
        f"{params.throughput_warmup_s:.0f} s warm-up; {params.connections} connections, each "
        f"keeping {params.pipeline_depth} requests outstanding; "
        f"CPU = user + system seconds of each process inside the window."
    )
