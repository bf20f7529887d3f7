"""How soon a new partition takes its first acks=all write: ``python -m bench.new_partition``.

Why. An application that creates a topic and writes to it at once waits, after CreateTopics
has answered, until the partition's leader and followers have all applied it and the
followers fetch it: an acks=all write is acknowledged only when every ISR member has it.
Two stalls of up to half a second each were found there by hand (docs/performance.md, "New
partitions: a follower's parked fetch"); this benchmark measures that path every time.

How this works. 1 controller + 3 brokers, started as ``bench.produce_consume``'s replication
part starts them; nothing pinned. First a warm topic (``bench-warm``: one partition,
replication factor 3, ``min.insync.replicas`` 2) is created and written once. Then
``--topics`` times, one after the other:

  warm  the baseline: the leader of ``bench-warm`` looked up with a Metadata request, a new
        connection to it, one acks=all Produce of one 100-byte record; timed until it is
        acknowledged. Every step of the measured write, on a partition that is not new.
  new   a CreateTopics of a new topic like ``bench-warm`` (timed until answered), then at
        once the same steps for it, repeated every ``RETRY_S`` on any error (no leader
        known yet, the broker asked not the leader yet, an error code); timed from the
        CreateTopics answer until the first acknowledgement.

Reported: the median, 90th percentile and slowest of each, the tries the new writes took,
and the ratio of the medians (new / warm). Every wait is bounded; the cluster and its
directory are removed at the end. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import REPO, git_state, work_dir
from bench.kafka_load import Connection, LoadError
from bench.produce_consume_cluster import CREATE_TOPICS_VERSION, RunnelCluster, stopped_after
from bench.produce_consume_replication import start_cluster
from bench.produce_consume_replication_load import find_leader, produce_one
from broker.protocol import ApiKey

__all__ = ["main"]

WARM_TOPIC = "bench-warm"
REPLICATION_FACTOR = 3
TOPIC_CONFIGS = {"min.insync.replicas": "2"}
RETRY_S = 0.01
WRITE_TIMEOUT_S = 30.0  # a first write that takes longer fails the benchmark
CREATE_TIMEOUT_MS = 30_000


def create_topic(cluster: RunnelCluster, name: str) -> None:
    """One CreateTopics request for ``name``; returns when the broker answers it."""
    request = {
        "topics": [
            {
                "name": name,
                "num_partitions": 1,
                "replication_factor": REPLICATION_FACTOR,
                "configs": [{"name": k, "value": v} for k, v in TOPIC_CONFIGS.items()],
            }
        ],
        "timeout_ms": CREATE_TIMEOUT_MS,
    }
    conn = Connection.connect(cluster.bootstrap)
    try:
        (answer,) = conn.call(ApiKey.CREATE_TOPICS, CREATE_TOPICS_VERSION, request).topics
    finally:
        conn.close()
    if answer.error_code:
        raise RuntimeError(f"CreateTopics {name}: {answer.error_code} {answer.error_message}")


def write_once(addresses: Sequence[str], topic: str) -> int:
    """Find the leader, connect, one acks=all record: the error code (0: acknowledged)."""
    _, address = find_leader(addresses, topic)
    conn = Connection.connect(address)
    try:
        code, _ = produce_one(conn, topic)
    finally:
        conn.close()
    return code


def first_ack(addresses: Sequence[str], topic: str, check: Callable[[], None]) -> tuple[float, int]:
    """(seconds until ``topic`` acknowledged an acks=all write, tries), trying again every
    ``RETRY_S`` after any error."""
    start = time.perf_counter()
    tries = 0
    while True:
        tries += 1
        try:
            if write_once(addresses, topic) == 0:
                return time.perf_counter() - start, tries
        except (OSError, LoadError, ValueError):
            pass  # no leader yet, or the connection went: ask again
        if time.perf_counter() - start > WRITE_TIMEOUT_S:
            raise TimeoutError(f"{topic}: no acks=all write within {WRITE_TIMEOUT_S} s")
        check()
        time.sleep(RETRY_S)


def summary(seconds: Sequence[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    p90 = ordered[min(len(ordered) - 1, (9 * len(ordered)) // 10)]
    return {
        "median_ms": round(1000 * statistics.median(ordered), 2),
        "p90_ms": round(1000 * p90, 2),
        "max_ms": round(1000 * ordered[-1], 2),
    }


def run(root: Path, topics: int) -> dict[str, Any]:
    with stopped_after(start_cluster(root)) as cluster:
        addresses = [cluster.address(b) for b in cluster.broker_ids]
        create_topic(cluster, WARM_TOPIC)
        first_ack(addresses, WARM_TOPIC, cluster.check_alive)
        warm: list[float] = []
        new: list[float] = []
        created: list[float] = []
        tries: list[int] = []
        for i in range(topics):
            warm.append(first_ack(addresses, WARM_TOPIC, cluster.check_alive)[0])
            name = f"bench-new-{i}"
            start = time.perf_counter()
            create_topic(cluster, name)
            created.append(time.perf_counter() - start)
            took, attempts = first_ack(addresses, name, cluster.check_alive)
            new.append(took)
            tries.append(attempts)
        cluster.check_alive()
    return {
        "topics": topics,
        "warm": summary(warm),
        "new": summary(new),
        "create_topics": summary(created),
        "new_tries_max": max(tries),
        "new_retried": sum(1 for t in tries if t > 1),
        "warm_ms": [round(1000 * s, 2) for s in warm],
        "new_ms": [round(1000 * s, 2) for s in new],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.new_partition", description=__doc__)
    parser.add_argument("--topics", type=int, default=24)
    parser.add_argument("--dir", type=Path, default=REPO / "data")
    args = parser.parse_args(argv)
    if args.topics < 1:
        parser.error("--topics must be at least 1")
    load_start = os.getloadavg()[0]
    with work_dir(args.dir, "bench-new-partition-") as root:
        result = run(root, args.topics)
    ratio = result["new"]["median_ms"] / result["warm"]["median_ms"]
    print(f"{args.topics} topics, one partition each, replication factor 3, min ISR 2:")
    print(f"{'first acks=all write':<36} {'median':>8} {'p90':>8} {'max':>8}  (ms)")
    for label, key in (
        ("warm topic (baseline)", "warm"),
        ("new topic, after CreateTopics", "new"),
        ("CreateTopics itself", "create_topics"),
    ):
        row = result[key]
        print(f"{label:<36} {row['median_ms']:>8} {row['p90_ms']:>8} {row['max_ms']:>8}")
    print(
        f"new / warm (medians): {ratio:.2f} x; {result['new_retried']} of {args.topics} new "
        f"writes needed more than one try (at most {result['new_tries_max']})"
    )
    commit, dirty = git_state()
    print(
        json.dumps(
            {
                "benchmark": "new_partition",
                "new_partition_first_ack_median_ms": result["new"]["median_ms"],
                "new_partition_first_ack_max_ms": result["new"]["max_ms"],
                "warm_first_ack_median_ms": result["warm"]["median_ms"],
                "new_ratio_to_warm": round(ratio, 3),
                **result,
                "load_average_start": load_start,
                "commit": commit,
                "dirty": dirty,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
