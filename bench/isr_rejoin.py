"""How fast a broker back from an outage rejoins the ISRs: ``python -m bench.isr_rejoin``.

One controller and two brokers (``bench.produce_consume_cluster``), a topic with replication
factor 2. Broker 102 is paused (SIGSTOP) until the controller has fenced it and every
partition's ISR is the other broker alone, then resumed (SIGCONT). Measured: the time from
the resume until every partition's ISR holds both brokers again, as broker 101's Metadata
answers show it (polled every 50 ms), and the AlterPartition requests and ISR changes
broker 101 sent meanwhile (its metrics). Each partition's rejoin takes a follower fetch that
reaches the leader's HW, an ISR change committed by the controller, and the change reaching
broker 101's image.

Two runs in the same cluster, the baseline first: a topic of ``--baseline-partitions`` (30),
deleted afterwards, then one of ``--partitions`` (3,000). Each topic's logs are all created
on both brokers before the pause. Reported: both rejoin times, the ratio (run / baseline),
and the milliseconds each extra partition adds. Nothing is pinned. The last line printed is
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, git_state, work_dir
from bench.kafka_load import Connection
from bench.produce_consume_cluster import RunnelCluster, partition_states

START_TIMEOUT_S = 60.0
TOPIC_TIMEOUT_S = 180.0
FENCE_TIMEOUT_S = 60.0  # the broker session timeout is 9 s by default
REJOIN_TIMEOUT_S = 120.0
POLL_S = 0.05
SETTLE_S = 2.0  # after the last log: followers fetch it
SURVIVOR, PAUSED = 101, 102


def metric(cluster: RunnelCluster, broker: int, name: str) -> float:
    """A figure from the broker's Prometheus endpoint (0 if absent)."""
    prefix = f"runnel_kafka_{name}{{"
    for line in cluster.metrics_text(broker).splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def full_isrs(conn: Connection, topic: str) -> int:
    return sum(1 for p in partition_states(conn, topic) if set(p.isr) == {SURVIVOR, PAUSED})


def wait(what: str, done: Any, timeout_s: float, cluster: RunnelCluster) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        cluster.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s} s")
        time.sleep(POLL_S)


def run_one(cluster: RunnelCluster, topic: str, partitions: int) -> dict[str, Any]:
    cluster.create_topics({topic: partitions}, TOPIC_TIMEOUT_S, replication_factor=2)
    dirs = [cluster.spec.node_dir(b) / "data" for b in (SURVIVOR, PAUSED)]
    wait(
        "every log created",  # then served: the logs are made one loop turn at a time
        lambda: all(sum(1 for _ in d.glob(f"{topic}-*")) == partitions for d in dirs),
        TOPIC_TIMEOUT_S,
        cluster,
    )
    time.sleep(SETTLE_S)
    pid = cluster.supervisor.pid(PAUSED)
    if pid is None:
        raise RuntimeError(f"broker {PAUSED} is not running")
    conn = Connection.connect(cluster.address(SURVIVOR))
    try:
        os.kill(pid, signal.SIGSTOP)
        try:
            paused_at = time.monotonic()
            wait("the ISRs shrunk", lambda: full_isrs(conn, topic) == 0, FENCE_TIMEOUT_S, cluster)
            shrunk_s = time.monotonic() - paused_at
            requests0 = metric(cluster, SURVIVOR, "isr_change_requests_total")
            changes0 = metric(cluster, SURVIVOR, "isr_changes_proposed_total")
        finally:
            os.kill(pid, signal.SIGCONT)
        resumed, first = time.monotonic(), None
        while (full := full_isrs(conn, topic)) < partitions:
            if full and first is None:
                first = time.monotonic() - resumed
            if time.monotonic() - resumed > REJOIN_TIMEOUT_S:
                raise TimeoutError(f"{full} of {partitions} ISRs full after {REJOIN_TIMEOUT_S} s")
            time.sleep(POLL_S)
        rejoin_s = time.monotonic() - resumed
    finally:
        conn.close()
    cluster.check_alive()
    return {
        "partitions": partitions,
        "paused_until_shrunk_s": round(shrunk_s, 2),
        "first_rejoined_s": round(rejoin_s if first is None else first, 3),
        "all_rejoined_s": round(rejoin_s, 3),
        "alter_partition_requests": int(
            metric(cluster, SURVIVOR, "isr_change_requests_total") - requests0
        ),
        "isr_changes_proposed": int(
            metric(cluster, SURVIVOR, "isr_changes_proposed_total") - changes0
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.isr_rejoin", description=__doc__)
    parser.add_argument("--partitions", type=int, default=3000)
    parser.add_argument("--baseline-partitions", type=int, default=30)
    parser.add_argument("--dir", type=Path, default=REPO / "data")
    args = parser.parse_args(argv)
    if not 1 <= args.baseline_partitions < args.partitions:
        parser.error("need 1 <= --baseline-partitions < --partitions")
    load_start = os.getloadavg()[0]
    with work_dir(args.dir, "bench-isr-rejoin-") as root:
        cluster = RunnelCluster(root / "cluster", brokers=2)
        try:
            cluster.start(START_TIMEOUT_S)
            baseline = run_one(cluster, "bench-baseline", args.baseline_partitions)
            cluster.delete_topics(["bench-baseline"], TOPIC_TIMEOUT_S)
            wide = run_one(cluster, "bench-wide", args.partitions)
        finally:
            cluster.stop()
    extra = args.partitions - args.baseline_partitions
    per_partition_ms = 1000 * (wide["all_rejoined_s"] - baseline["all_rejoined_s"]) / extra
    ratio = wide["all_rejoined_s"] / baseline["all_rejoined_s"]
    print(f"{'run':<9} {'partitions':>10} {'first (s)':>9} {'all (s)':>8} {'requests':>8} "
          f"{'changes':>8}")  # fmt: skip
    for name, run in (("baseline", baseline), ("wide", wide)):
        print(
            f"{name:<9} {run['partitions']:>10} {run['first_rejoined_s']:>9} "
            f"{run['all_rejoined_s']:>8} {run['alter_partition_requests']:>8} "
            f"{run['isr_changes_proposed']:>8}"
        )
    print(f"each extra partition: +{per_partition_ms:.3f} ms to rejoin; "
          f"{ratio:.2f} x the baseline")  # fmt: skip
    commit, dirty = git_state()
    print(json.dumps({
        "rejoin_ms_per_partition": round(per_partition_ms, 4),
        "rejoin_ratio_to_baseline": round(ratio, 3),
        "baseline": baseline, "wide": wide,
        "load_average_start": load_start, "commit": commit, "dirty": dirty,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
