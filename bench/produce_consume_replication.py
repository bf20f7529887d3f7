"""Replication runs of bench.produce_consume: the Kafka 2014 test's replicated producer (three
brokers, replication factor 3, 100-byte records, acks=1 and acks=all), a follower's catch-up
after a restart, and the unavailability after kill -9 of a leader.

How this works. One cluster of 1 controller + 3 brokers (``runnel cluster up``'s processes,
default settings) for all of it. In order (``produce_consume_replication_phases.py`` has
each kind of run):

  rounds     ``rounds`` times: the raw-protocol generator (16 KiB batches) into a
             replication-factor-1 topic with acks=1 (the baseline), into a replication-
             factor-3 topic with acks=1, and into another with acks=all, ``max_s`` each, a
             fresh topic per run (created just before it, deleted after it, so that no
             idle partitions are held meanwhile). The topics have six partitions, as the
             2014 test's, whose leaders the controller spreads over the three brokers; the
             generator sends each partition's batches to its leader, a connection per
             leader with 5 requests in flight, the Java producer's default (``--in-flight
             N``: N; ``--partitions 1``: one partition, one leader, one connection).
             ``rf3_ratio_to_rf1`` is each round's acks=all records/s over its
             replication-factor-1 records/s, the median over the rounds.
  catch-up   a follower of a one-partition replication-factor-3 topic is stopped,
             ``catch_up_bytes`` are produced with acks=1, the follower is started again;
             MB/s of its copy, with the raw baseline (the same bytes over a plain socket
             with sendfile into a file).
  failover   ``kills`` times: kill -9 of the leader of a replication-factor-3 topic with
             min.insync.replicas 2 under a paced acks=all producer; seconds from the kill to
             the first write the new leader acknowledges, against the cluster's
             ``broker_session_timeout_ms`` (the target: at most that + 2 s).

Standalone: ``python -m bench.produce_consume_replication [--quick] [--dir DIR] [--rounds R]
[--partitions P] [--batch-bytes B] [--in-flight N]`` prints the table and a JSON object of
these runs alone; ``python -m bench.produce_consume`` runs them after its own
(``--no-replication`` leaves them out).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import REPO, work_dir
from bench.produce_consume_cluster import RunnelCluster, stopped_after
from bench.produce_consume_figures import JAVA_BATCH_BYTES, JAVA_MAX_IN_FLIGHT, MB
from bench.produce_consume_replication_figures import (
    Replication,
    ReplicationParams,
    ReplicationRound,
)
from bench.produce_consume_replication_phases import (
    Brokers,
    catch_up,
    failover,
    produce_run,
    step,
)
from bench.produce_consume_replication_report import print_replication, replication_json
from bench.produce_consume_report import measured_commit
from runnel.commands import CommandError
from runnel.config import load_config

__all__ = ["replication_params", "run_replication"]

BROKERS = 3
CONTROLLER_ID = 1
START_TIMEOUT_S = 120.0
START_ATTEMPTS = 3
PORT_CLASH = "Address already in use"
TOPIC_TIMEOUT_S = 60.0
RF1, RF3 = 1, 3
ACKS_ALL = -1
CATCH_UP_TOPIC = "bench-rf3-catch-up"
FAILOVER_TOPIC = "bench-rf3-failover"


KAFKA_2014_PARTITIONS = 6  # the 2014 test's topic


def replication_params(
    quick: bool,
    rounds: int,
    records: int,
    batch_bytes: int,
    in_flight: int,
    partitions: int = KAFKA_2014_PARTITIONS,
) -> ReplicationParams:
    return ReplicationParams(
        partitions=partitions,
        rounds=rounds,
        max_s=3.0 if quick else 15.0,
        records=records,
        batch_bytes=batch_bytes,
        in_flight=in_flight,
        catch_up_bytes=(100 if quick else 500) * MB,
        kills=1 if quick else 3,
        probe_interval_ms=10.0,
        probe_backoff_ms=50.0,
        min_insync_replicas=2,
    )


def round_topics(i: int) -> tuple[str, str, str]:
    """Replication factor 1; 3 with acks=1; 3 with acks=all."""
    return (
        f"bench-rf1-round{i + 1}",
        f"bench-rf3-acks1-round{i + 1}",
        f"bench-rf3-all-round{i + 1}",
    )


def create_topics(cluster: RunnelCluster, rp: ReplicationParams) -> None:
    """The catch-up's and the failover's topics; each round's come and go with its runs."""
    cluster.create_topics({CATCH_UP_TOPIC: 1}, TOPIC_TIMEOUT_S, RF3)
    configs = {"min.insync.replicas": str(rp.min_insync_replicas)}
    cluster.create_topics({FAILOVER_TOPIC: 1}, TOPIC_TIMEOUT_S, RF3, configs)


def one_round(i: int, brokers: Brokers, rp: ReplicationParams) -> ReplicationRound:
    """Each run's topic is created just before it and deleted after it, so the cluster
    holds the topic under test and no idle ones, as in the 2014 test (a follower's fetch
    carries every partition it follows from a leader: idle ones cost CPU too)."""
    rf1_topic, acks1_topic, all_topic = round_topics(i)
    runs = []
    for label, topic, factor, acks in (
        ("RF 1, acks=1", rf1_topic, RF1, 1),
        ("RF 3, acks=1", acks1_topic, RF3, 1),
        ("RF 3, acks=all", all_topic, RF3, ACKS_ALL),
    ):
        cluster = brokers.cluster
        cluster.create_topics({topic: rp.partitions}, TOPIC_TIMEOUT_S, factor)
        brokers.listed_everywhere(topic, rp.partitions)
        runs.append(produce_run(label, brokers, topic, factor, acks, rp))
        cluster.delete_topics([topic], TOPIC_TIMEOUT_S)
    done = ReplicationRound(*runs)
    rf1, acks1, acks_all = runs
    step(
        f"replication round {i + 1}: RF 1 {rf1.run.records_per_s:,.0f} records/s, RF 3 acks=1 "
        f"{acks1.run.records_per_s:,.0f}, acks=all {acks_all.run.records_per_s:,.0f} "
        f"({done.acks_all_ratio:.2f} x RF 1)"
    )
    return done


def session_timeout_ms(cluster: RunnelCluster) -> int:
    """The controller's ``broker_session_timeout_ms``, as its node reads its config."""
    config = load_config(cluster.spec.config_path(CONTROLLER_ID), dict(os.environ))
    return config.controller.broker_session_timeout_ms


def start_cluster(root: Path) -> RunnelCluster:
    """The cluster, up. Its block of ports is checked free, then the nodes bind them: on this
    shared machine another process's connection can take one of them in between (the block
    lies in the ephemeral port range), and the node exits. Then again on other ports."""
    for attempt in range(1, START_ATTEMPTS + 1):
        cluster = RunnelCluster(root / f"replication-cluster-{attempt}", BROKERS)
        try:
            cluster.start(START_TIMEOUT_S)
            return cluster
        except (RuntimeError, CommandError) as e:
            cluster.stop()
            if attempt == START_ATTEMPTS or PORT_CLASH not in str(e) + cluster.log_tail():
                raise
            step(f"a node of the cluster could not bind its port ({PORT_CLASH}); other ports")
    raise AssertionError("unreachable")


def run_replication(root: Path, rp: ReplicationParams) -> Replication:
    with stopped_after(start_cluster(root)) as cluster:
        create_topics(cluster, rp)
        brokers = Brokers(cluster)
        session_ms = session_timeout_ms(cluster)
        step(f"runnel: 1 controller + {BROKERS} brokers up (session timeout {session_ms} ms)")
        rounds = tuple(one_round(i, brokers, rp) for i in range(rp.rounds))
        caught = catch_up(brokers, CATCH_UP_TOPIC, rp, root)
        step(
            f"catch-up: follower {caught.follower} copied {caught.bytes:,} B in "
            f"{caught.transfer_s:.2f} s: {caught.mb_per_s:,.0f} MB/s (raw "
            f"{caught.raw.mb_per_s:,.0f} MB/s)"
        )
        failovers = []
        for k in range(rp.kills):
            done = failover(brokers, FAILOVER_TOPIC, rp, session_ms)
            failovers.append(done)
            step(
                f"failover {k + 1}: leader {done.killed} -> {done.new_leader}, unavailable "
                f"{done.unavailable_s:.2f} s"
            )
        cluster.check_alive()
    return Replication(rp, session_ms, rounds, caught, tuple(failovers))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.produce_consume_replication", description=__doc__
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dir", type=Path, default=REPO / "data")
    parser.add_argument("--rounds", type=int)
    parser.add_argument(
        "--partitions",
        type=int,
        default=KAFKA_2014_PARTITIONS,
        help="of the rounds' topics (6, the 2014 test's; their leaders spread over the brokers)",
    )
    parser.add_argument(
        "--batch-bytes",
        type=int,
        default=JAVA_BATCH_BYTES,
        help="of each produce request's batch (the Java producer's default batch.size)",
    )
    parser.add_argument(
        "--in-flight",
        type=int,
        default=JAVA_MAX_IN_FLIGHT,
        help="produce requests outstanding per leader connection (the Java producer's default "
        "max.in.flight.requests.per.connection)",
    )
    args = parser.parse_args(argv)
    if args.in_flight < 1:
        parser.error(f"--in-flight must be at least 1, got {args.in_flight}")
    rounds = args.rounds or (1 if args.quick else 3)
    rp = replication_params(
        args.quick, rounds, 50_000_000, args.batch_bytes, args.in_flight, args.partitions
    )
    load, commit = os.getloadavg()[0], measured_commit()
    started = time.perf_counter()
    with work_dir(args.dir, "bench-replication-") as root:
        step(f"runnel replication benchmark in {root} (commit {commit[0]}, load {load:.2f})")
        replication = run_replication(root, rp)
    print_replication(replication)
    out = replication_json(replication)
    out.update(load_average_at_start=load, load_average_at_end=os.getloadavg()[0])
    out.update(elapsed_s=time.perf_counter() - started, commit=commit[0])
    out["uncommitted_changes"] = commit[1]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
