"""Raft benchmark: three local voter processes running a replicated counter, against raw
baselines (loopback round trips, fdatasync) measured in the same run.

How this works. Three ``raft.testing.counter_node`` processes (real gRPC between them, real
files, default Raft timeouts) run on 127.0.0.1; this process is the client and speaks their
line protocol (``INCR n`` -> ``OK <offset>`` once committed, ``STATUS``). A baseline server
process answers the same line protocol with no Raft behind it (the node's own
readline/write/drain loop) and serves ``RaftService.Send`` with a bare acknowledgement.

  latency    ``INCR 1`` against the leader at 100 proposals/s, **open loop**: proposals are
             sent on a fixed schedule whatever the replies do, each on an idle connection of
             a pool (a new one when all are busy), so a slow commit does not hide the next
             one's wait. Latency is from the request's write to its reply. In alternating
             rounds with the same paced run against the echo server, a paced unary gRPC
             ``Send``, and ``os.write`` of 64 bytes + ``os.fdatasync`` on the nodes' disk.
             A durable replicated commit needs at least: client round trip + leader fsync +
             one leader <-> follower round trip + follower fsync, so the floor is
             2 x echo round trip + 2 x fdatasync; commit latency / floor is the ratio.
  throughput ``connections`` client connections each keeping ``pipeline_depth`` requests of
             ``INCR 1`` (then ``INCR 100``) outstanding; the node answers a connection's
             requests in order but works on them at once, so they share batches. Records/s
             and proposals/s over a timed window after a warm-up, with the CPU seconds each
             process used. Baseline: the same load against the echo server.
  failover   kill -9 of the leader at a random point of the followers' fetch cycle, then the
             time until an ``INCR 1`` is answered ``OK`` by a surviving node (STATUS polled
             every 20 ms to find the new leader); also the time until a survivor reports
             itself leader, and how far the epoch moved (more than 1: a split or failed
             vote). The killed node is restarted and caught up before the next trial.

The pieces: ``raft_figures.py`` (settings, parameters, the measured figures),
``raft_cluster.py`` (the line-protocol client, the node processes, the baseline server),
``raft_phases.py`` (the three measurements), ``raft_report.py`` (the table and the JSON line).

Usage: ``python -m bench.raft [--quick] [--dir DIR] [--connections N] [--pipeline-depth D]``.
The last line printed is one JSON object with every figure and the parameters.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import work_dir
from bench.raft_cluster import BaselineServer, Cluster, baseline_server
from bench.raft_figures import REPO, START_TIMEOUT_S, Baseline, Params, Results
from bench.raft_phases import bench_failover, bench_latency, bench_throughput, pipelined_load
from bench.raft_report import print_table, report


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.raft", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples, about a minute")
    parser.add_argument(
        "--dir",
        type=Path,
        default=REPO / "data",
        help="a directory on the disk to measure (a temporary subdirectory is used)",
    )
    parser.add_argument("--connections", type=int, default=8, help="throughput clients")
    parser.add_argument(
        "--pipeline-depth", type=int, default=128, help="outstanding requests per client"
    )
    parser.add_argument(
        "--baseline-server", type=int, nargs=2, metavar="PORT", help=argparse.SUPPRESS
    )
    return parser.parse_args(argv)


async def run(root: Path, params: Params) -> Results:
    server = BaselineServer(root)
    cluster = Cluster(root)
    try:
        await server.start()
        cluster.start()
        await cluster.wait_caught_up(START_TIMEOUT_S)
        phase = await bench_latency(cluster, server, params)
        print(
            f"commit latency p50 {phase.commit.latency.p50_ms:.2f} ms; baselines: echo "
            f"{phase.echo.latency.p50_ms:.2f} ms, gRPC {phase.grpc.latency.p50_ms:.2f} ms, "
            f"fdatasync {phase.fsync.p50_ms:.2f} ms",
            flush=True,
        )
        pids = {"echo server": server.pid}
        echo_load = await pipelined_load(server.line_port, b"INCR 1\n", params, pids)
        server.stop()
        print(f"echo load: {echo_load.requests_per_s:.0f} requests/s", flush=True)
        throughput = []
        for records in (1, 100):
            throughput.append(await bench_throughput(cluster, params, records))
            print(f"INCR {records}: {throughput[-1].records_per_s:.0f} records/s", flush=True)
        failover = await bench_failover(cluster, params.failover_trials)
    except BaseException:
        print(cluster.log_tail(), file=sys.stderr)
        raise
    finally:
        server.stop()
        cluster.stop()
    baseline = Baseline(phase.echo, phase.grpc, phase.fsync, echo_load)
    return Results(baseline, phase.commit, phase.rounds, tuple(throughput), tuple(failover))


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.baseline_server is not None:
        asyncio.run(baseline_server(*args.baseline_server))
        return
    quick: bool = args.quick
    params = Params(
        quick=quick,
        latency_proposals=500 if quick else 2000,
        baseline_requests=300 if quick else 1000,
        fsync_samples=200 if quick else 1000,
        throughput_window_s=5.0 if quick else 10.0,
        throughput_warmup_s=1.0 if quick else 2.0,
        connections=args.connections,
        pipeline_depth=args.pipeline_depth,
        failover_trials=5 if quick else 20,
    )
    load_at_start = os.getloadavg()[0]
    started = time.perf_counter()
    with work_dir(args.dir, "bench-raft-") as root:
        print(
            f"runnel raft benchmark in {root} (quick={quick}, "
            f"load average {load_at_start:.2f} at start)",
            flush=True,
        )
        results = asyncio.run(run(root, params))
    elapsed = time.perf_counter() - started
    print_table(params, results)
    print(f"finished in {elapsed:.1f} s")
    print(json.dumps(report(params, results, load_at_start, elapsed)))


if __name__ == "__main__":
    main()
