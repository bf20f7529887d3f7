"""What idle partitions cost a leader: ``python -m bench.idle_partitions``.

A follower fetches every partition it follows from a leader in one incremental fetch session
(KIP-227), and the leader looks at each of them on every fetch, idle or not. This benchmark
prices that: one controller and two brokers (``bench.produce_consume_cluster``), a paced
producer (``kafka_load e2e-produce``: ``--rate`` 100-byte records/s, one request every
``--linger-ms``, acks=1) writing to partition 0 of a topic with replication factor 2, so that
every append wakes the follower's fetch and every fetch visits the session.

Two runs in the same cluster, the baseline first: a topic of 2 partitions, then one of
``--partitions`` (1,000: the other 999 idle). Each run reads both brokers' CPU time from
/proc and the leader's count of Fetch requests from its metrics endpoint, before and after.
Reported: the leader's busy cores, its CPU µs per follower fetch, the extra µs per fetch for
each idle partition it holds ((idle run - baseline) / extra partitions held), and the ratio
of the leader's busy cores (idle run / baseline). Nothing is pinned. The last line printed is
one JSON object.

Attribution. "The leader" is partition 0's leader; with replication factor 2 on 2 brokers it
holds a replica of every partition, leads about half of them and follows the rest (the
controller balances leaderships, and CreateTopics with manual assignments is refused), so
its CPU also includes its own fetcher's work for the partitions it follows. The idle figure
is therefore per partition held (led or followed), not per partition led. Figures recorded
before 2026-11-24 divided by the partitions led (about half as many).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, git_state, work_dir
from bench.kafka_load import Connection, partition_leaders
from bench.produce_consume_cluster import RunnelCluster, partition_states
from bench.produce_consume_procs import cpu_seconds
from broker.protocol import ApiKey
from runnel.local_cluster import Port

FETCH_KEY = f'api_key="{int(ApiKey.FETCH)}"'
START_TIMEOUT_S = 60.0
TOPIC_TIMEOUT_S = 120.0
SETTLE_S = 3.0  # after creating a topic: followers open their sessions
LOAD_EXTRA_S = 60.0


def fetches_served(cluster: RunnelCluster, broker: int) -> int:
    """The broker's count of Fetch requests so far (its Prometheus endpoint)."""
    for line in cluster.metrics_text(broker).splitlines():
        if line.startswith("runnel_kafka_requests_served_total{") and FETCH_KEY in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def run_one(
    cluster: RunnelCluster, topic: str, partitions: int, args: argparse.Namespace
) -> dict[str, Any]:
    cluster.create_topics({topic: partitions}, TOPIC_TIMEOUT_S, replication_factor=2)
    time.sleep(SETTLE_S)
    conn = Connection.connect(cluster.bootstrap)
    try:
        leaders = partition_leaders(conn, topic)
        replicas = {p.partition: p.replicas for p in partition_states(conn, topic)}
    finally:
        conn.close()
    leader = leaders[0]
    follower = next(b for b in cluster.broker_ids if b != leader)
    pids = {b: cluster.supervisor.pid(b) for b in (leader, follower)}
    address = f"127.0.0.1:{cluster.spec.node(leader).ports[Port.CLIENT]}"
    cpu0 = {b: cpu_seconds(pid) for b, pid in pids.items() if pid is not None}
    fetches0, start = fetches_served(cluster, leader), time.monotonic()
    load = subprocess.run(
        [
            sys.executable, "-m", "bench.kafka_load", "e2e-produce", "--bootstrap", address,
            "--topic", topic, "--rate", str(args.rate), "--seconds", str(args.seconds),
            "--linger-ms", str(args.linger_ms),
        ],
        cwd=REPO, capture_output=True, text=True, timeout=args.seconds + LOAD_EXTRA_S,
    )  # fmt: skip
    elapsed = time.monotonic() - start
    fetches = fetches_served(cluster, leader) - fetches0
    cpu = {b: cpu_seconds(pid) - cpu0[b] for b, pid in pids.items() if pid is not None}
    cluster.check_alive()
    produced = json.loads(load.stdout.strip().splitlines()[-1]) if load.returncode == 0 else None
    if produced is None:
        raise RuntimeError(
            f"kafka_load e2e-produce failed: {load.stdout[-500:]}{load.stderr[-500:]}"
        )
    return {
        "partitions": partitions,
        "led_by_leader": sum(1 for b in leaders.values() if b == leader),
        "held_by_leader": sum(1 for r in replicas.values() if leader in r),
        "seconds": round(elapsed, 2),
        "produce_requests": produced["requests"],
        "records": produced["records"],
        "follower_fetches": fetches,
        "fetches_per_s": round(fetches / elapsed, 1),
        "leader_cores": round(cpu[leader] / elapsed, 3),
        "follower_cores": round(cpu[follower] / elapsed, 3),
        "leader_cpu_us_per_fetch": round(1e6 * cpu[leader] / max(fetches, 1), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.idle_partitions", description=__doc__)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=2000.0, help="records/s to partition 0")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--linger-ms", type=float, default=5.0)
    parser.add_argument("--dir", type=Path, default=REPO / "data")
    args = parser.parse_args(argv)
    if args.partitions < 3:
        parser.error("--partitions must be at least 3")
    load_start = os.getloadavg()[0]
    with work_dir(args.dir, "bench-idle-partitions-") as root:
        cluster = RunnelCluster(root / "cluster", brokers=2)
        try:
            cluster.start(START_TIMEOUT_S)
            baseline = run_one(cluster, "bench-baseline", 2, args)
            idle = run_one(cluster, "bench-idle", args.partitions, args)
        finally:
            cluster.stop()
    extra = idle["held_by_leader"] - baseline["held_by_leader"]
    per_partition = (idle["leader_cpu_us_per_fetch"] - baseline["leader_cpu_us_per_fetch"]) / extra
    ratio = idle["leader_cores"] / baseline["leader_cores"]
    print(f"{'run':<10} {'partitions':>10} {'led here':>8} {'held here':>9} {'fetches/s':>9} "
          f"{'leader cores':>12} {'follower cores':>14} {'leader us/fetch':>15}")  # fmt: skip
    for name, run in (("baseline", baseline), ("idle", idle)):
        print(
            f"{name:<10} {run['partitions']:>10} {run['led_by_leader']:>8} "
            f"{run['held_by_leader']:>9} {run['fetches_per_s']:>9} {run['leader_cores']:>12} "
            f"{run['follower_cores']:>14} {run['leader_cpu_us_per_fetch']:>15}"
        )
    print(f"each idle partition held by the leader (led or followed): +{per_partition:.2f} us "
          f"of leader CPU per follower fetch; leader busy {ratio:.2f} x the baseline")  # fmt: skip
    commit, dirty = git_state()
    print(json.dumps({
        "idle_us_per_partition_held_per_fetch": round(per_partition, 3),
        "leader_cores_ratio_to_baseline": round(ratio, 3),
        "baseline": baseline, "idle": idle,
        "rate": args.rate, "seconds": args.seconds, "linger_ms": args.linger_ms,
        "load_average_start": load_start, "commit": commit, "dirty": dirty,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
