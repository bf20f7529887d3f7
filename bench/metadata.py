"""Metadata benchmark: create many topics on a local cluster (3 controllers and 3 brokers as
separate ``runnel node`` processes, plus a spare broker), then measure a broker's cold catch-up
and the snapshot, against raw baselines measured in the same run.

How this works. In order:

  1. baselines   in-process encode + decode of the records the creation writes (and, as a
                 reference, their replay into an image); a gRPC server that answers
                 CreateTopics at once, sent the same requests the same way
                 (``bench/metadata_baselines.py``);
  2. create      the spare broker stopped and wiped first (it holds nothing); ``topics``
                 topics of ``partitions`` partitions through ``ControllerClient``,
                 ``concurrency`` CreateTopics of ``topics_per_request`` topics in flight: wall
                 time, every node's CPU seconds (/proc), request latencies; then the time
                 until every broker has reported the last offset (``bench/metadata_phases.py``);
  3. catch-up    the spare started again on its empty data dir: the time until its reported
                 metadata offset reaches the controller's, fetching the controller's snapshot
                 and then the log after it (``bench/metadata_catch_up.py``);
  4. loaded stop one of the brokers holding topics stopped (controlled shutdown): how long,
                 and whether the controller failed over meanwhile;
  5. snapshot    the active controller's latest snapshot file (as of step 3): size, load
                 time, encode time and the loaded image's memory, in a fresh process after
                 the cluster stopped (``bench/metadata_snapshot.py``).

The spare is there because stopping a broker that holds the topics makes the controller write
one partition change per partition it holds in one decision (step 4 shows what that does);
a wiped broker's catch-up is the same whether or not it held replicas before.

The cluster is ``runnel.local_cluster`` + ``runnel.supervisor`` with the defaults of ``runnel
cluster up`` except ``metadata_snapshot_bytes`` (``--snapshot-bytes``). The default 20 MiB
would never be reached by this much metadata, and the catch-up must find a snapshot; unless
given, it is 95% of the bytes of the records the creation writes, so every node takes one
snapshot near the end of the creation (inside the timed part) and the catch-up fetches it and
replays the rest from the log.

Usage: ``python -m bench.metadata [--quick] [--topics N] [--partitions P] [--brokers B]
[--dir DIR]``. ``--quick`` does a tenth of the work. The last line printed is one JSON object
with every figure and the parameters. Every process is killed and reaped and the temporary
directory removed on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from bench.common import work_dir
from bench.metadata_baselines import baseline_server, measure_baselines
from bench.metadata_catch_up import bench_catch_up, bench_loaded_stop, prepare_spare
from bench.metadata_cluster import BenchCluster, snapshot_setting
from bench.metadata_figures import REPO, Params, Results
from bench.metadata_phases import bench_create
from bench.metadata_report import print_table, report
from bench.metadata_snapshot import measure_file, measure_snapshot


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.metadata", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a tenth of the topics")
    parser.add_argument("--topics", type=int, help="topics to create (10,000; quick: 1,000)")
    parser.add_argument("--partitions", type=int, default=10, help="partitions per topic")
    parser.add_argument("--replication-factor", type=int, default=3)
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--controllers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument("--topics-per-request", type=int, default=10)
    parser.add_argument(
        "--snapshot-bytes", type=int, help="metadata_snapshot_bytes (default: see above)"
    )
    parser.add_argument(
        "--dir", type=Path, default=REPO / "data", help="where the temporary cluster dir goes"
    )
    parser.add_argument("--baseline-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--measure-snapshot", type=Path, metavar="FILE", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def params_from(args: argparse.Namespace) -> Params:
    quick: bool = args.quick
    params = Params(
        quick=quick,
        topics=args.topics or (1_000 if quick else 10_000),
        partitions=args.partitions,
        replication_factor=args.replication_factor,
        controllers=args.controllers,
        brokers=args.brokers,
        concurrency=args.concurrency,
        topics_per_request=args.topics_per_request,
        snapshot_bytes=args.snapshot_bytes,
        rtt_samples=200 if quick else 1000,
    )
    if min(params.topics, params.partitions, params.concurrency, params.topics_per_request) < 1:
        raise SystemExit("--topics, --partitions, --concurrency, --topics-per-request: >= 1")
    if not 1 <= params.replication_factor <= params.brokers:
        raise SystemExit("--replication-factor must be 1 to --brokers")
    return params


async def run(root: Path, params: Params) -> Results:
    baselines = await measure_baselines(root, params)
    print(f"baselines: gRPC alone {baselines.grpc_create_s:.2f} s", flush=True)
    snapshot_bytes = params.snapshot_bytes or baselines.snapshot_bytes()
    params = replace(params, snapshot_bytes=snapshot_bytes)
    cluster = BenchCluster(root / "cluster", params)
    try:
        with snapshot_setting(snapshot_bytes):
            cluster.start()
            await cluster.wait_healthy()
            prepare_spare(cluster)
            create = await bench_create(cluster, params)
            print(f"created: {create.wall_s:.2f} s, {create.partitions:,} partitions", flush=True)
            _check_created(params, create.topics, create.partitions)
            catch_up = await bench_catch_up(cluster, create.active_controller)
            print(f"catch-up: {catch_up.catch_up_s:.2f} s", flush=True)
            latest = cluster.snapshots(create.active_controller)[-1]
            snapshot_file = root / latest.name  # a later snapshot would delete it there
            shutil.copyfile(latest, snapshot_file)
            loaded_stop = await bench_loaded_stop(cluster)
            print(f"loaded broker stopped: {loaded_stop.stop_s:.2f} s", flush=True)
    except BaseException:
        print(cluster.log_tail(list(cluster.supervisor.managed)), file=sys.stderr)
        raise
    finally:
        await cluster.close()
        cluster.stop()
    snapshot = measure_snapshot(snapshot_file)
    return Results(params, baselines, create, catch_up, loaded_stop, snapshot)


def _check_created(params: Params, topics: int, partitions: int) -> None:
    if (topics, partitions) != (params.topics, params.total_partitions):
        raise RuntimeError(
            f"the cluster holds {topics} topics and {partitions} partitions, not "
            f"{params.topics} and {params.total_partitions}: figures would be wrong"
        )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.baseline_server is not None:
        asyncio.run(baseline_server(args.baseline_server))
        return
    if args.measure_snapshot is not None:
        print(json.dumps(measure_file(args.measure_snapshot)))
        return
    params = params_from(args)
    load_at_start = os.getloadavg()[0]
    started = time.perf_counter()
    with work_dir(args.dir, "bench-metadata-") as root:
        print(f"runnel metadata benchmark in {root} (quick={params.quick}, load average "
              f"{load_at_start:.2f} at start)", flush=True)  # fmt: skip
        results = asyncio.run(run(root, params))
    elapsed = time.perf_counter() - started
    print_table(results.params, results)
    print(f"finished in {elapsed:.1f} s")
    print(json.dumps(report(results.params, results, load_at_start, elapsed)))


if __name__ == "__main__":
    main()
