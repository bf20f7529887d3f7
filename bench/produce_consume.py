"""Produce and consume over the Kafka protocol: the Kafka 2014 single-producer test against a
one-broker runnel cluster, with the raw baseline and the load generator alone in the same run.

How this works. The test is Jay Kreps' "Benchmarking Apache Kafka: 2 Million Writes Per
Second (On Three Cheap Machines)" (2014): one producer, no replication (replication factor 1,
acks=1), 100-byte records without keys, 50 million records, then one consumer reading them
back; here on one 2-core box that also runs the load. Every role is its own process
(``produce_consume_procs.py``); this process only starts them and waits. The kinds of run:

  raw baseline   the very Produce request stream over a plain loopback TCP socket into a
                 file, then ``os.sendfile`` of the file back out to a reader
                 (``produce_consume_raw.py``): the least any broker must do.
  generator      the load generators against a trivial Kafka-protocol sink that stores
  alone          nothing (``produce_consume_sink.py``): what they can do when the broker
                 costs next to nothing, so a broker figure well below it is the broker's.
  produce        the raw-protocol generator (``kafka_load.py``: pre-built v2 batches,
                 Produce v9, 5 requests in flight, no per-record Python work) into runnel
                 (1 controller + 1 broker processes, ``produce_consume_cluster.py``), one
                 partition, the Java producer's default 16 KiB batches; also at 8,196 B
                 (2014) and 1 MB (librdkafka's default) batches and into six partitions
                 (the 2014 test's topic); and confluent-kafka for a real client's figure.
  consume        the raw Fetch consumer from offset 0 of what was produced (1 MiB per
                 partition per fetch, one fetch in flight); also confluent-kafka.
  latency        a paced producer at 10,000 records/s (a batch every ``linger_ms``) and a
                 long-polling consumer; latency is from a record's due time (written in its
                 value) to the read of the fetch response holding it. On the in-memory sink
                 (the generator's own floor), then on runnel.
  replication    on 1 controller + 3 brokers (``produce_consume_replication.py``): produce
                 at replication factor 1, and 3 with acks=1 and acks=all; a follower's
                 catch-up after a restart, with its raw baseline; kill -9 of a leader under
                 acks=all writes.

The order (``produce_consume_plan.py``) interleaves each runnel run with its baselines, in
rounds. Servers run on CPU 0 and load processes on CPU 1 (``--no-pin``: wherever the
scheduler puts them), as the 2014 test ran broker and producer on separate machines; one
produce run unpinned shows what that changes. Figures are in
``produce_consume_figures.py``, the table and JSON in ``produce_consume_report.py``. The
last line printed is one JSON object with every figure; the commands to reproduce precede it.

Usage: ``python -m bench.produce_consume [--quick] [--dir DIR] [--records N] [--max-s S]
[--rounds R] [--batch-bytes B] [--partitions P] [--no-pin] [--no-replication]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import REPO, work_dir
from bench.produce_consume_figures import (
    JAVA_BATCH_BYTES,
    JAVA_MAX_IN_FLIGHT,
    KAFKA_2014_BATCH_BYTES,
    LIBRDKAFKA_BATCH_BYTES,
    Params,
)
from bench.produce_consume_plan import run
from bench.produce_consume_report import Summary, measured_commit, print_table, report

KAFKA_2014_PARTITIONS = 6  # the 2014 test's topic


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.produce_consume", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short runs, under a minute")
    parser.add_argument(
        "--dir", type=Path, default=REPO / "data", help="where the logs and the raw file go"
    )
    parser.add_argument("--records", type=int, help="produce at most this many (50,000,000)")
    parser.add_argument("--max-s", type=float, help="...or for this long per round (30; quick 4)")
    parser.add_argument("--rounds", type=int, help="headline rounds (3; quick 1)")
    parser.add_argument("--batch-bytes", type=int, default=JAVA_BATCH_BYTES)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="servers (and every thread of the broker) on CPU 0, load processes on CPU 1",
    )
    parser.add_argument(
        "--replication",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the replication runs (3 brokers) after the others",
    )
    return parser.parse_args(argv)


def make_params(args: argparse.Namespace) -> Params:
    quick: bool = args.quick
    sweep = tuple(
        b for b in (KAFKA_2014_BATCH_BYTES, LIBRDKAFKA_BATCH_BYTES) if b != args.batch_bytes
    )
    return Params(
        quick=quick,
        records=args.records or (10_000_000 if quick else 50_000_000),
        max_s=args.max_s or (4.0 if quick else 30.0),
        batch_bytes=args.batch_bytes,
        sweep_batch_bytes=sweep,
        sweep_partitions=0 if args.partitions == KAFKA_2014_PARTITIONS else KAFKA_2014_PARTITIONS,
        sweep_max_s=1.5 if quick else 15.0,
        partitions=args.partitions,
        in_flight=JAVA_MAX_IN_FLIGHT,
        partition_max_bytes=1_048_576,
        sink_max_s=1.5 if quick else 10.0,
        client_max_s=1.5 if quick else 15.0,
        raw_bytes=400_000_000 if quick else 4_000_000_000,
        rounds=args.rounds or (1 if quick else 3),
        e2e_rate=10_000.0,
        e2e_seconds=3.0 if quick else 30.0,
        e2e_warmup_s=1.0,
        linger_ms=1.0,
        fetch_wait_ms=100,
        pin=args.pin,
        confluent=importlib.util.find_spec("confluent_kafka") is not None,
        replication=args.replication,
    )


def reproduce(params: Params) -> str:
    flags = (" --quick" if params.quick else "") + ("" if params.pin else " --no-pin")
    flags += "" if params.replication else " --no-replication"
    python = sys.executable
    return "\n".join(
        [
            "to reproduce (from the repository root):",
            f"  {python} -m bench.produce_consume{flags}",
            "one piece by hand, e.g. the generator alone against the sink:",
            f"  {python} -m bench.produce_consume_sink --mode discard     # prints: ready PORT",
            f"  {python} -m bench.kafka_load produce --bootstrap 127.0.0.1:PORT --topic bench",
            "  (roles: produce, consume, e2e-produce, e2e-consume; bench.produce_consume_raw"
            " receive|send; bench.produce_consume_client produce|consume)",
            "the replication runs alone:",
            f"  {python} -m bench.produce_consume_replication{' --quick' * params.quick}",
        ]
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    params = make_params(args)
    load_at_start, commit = os.getloadavg()[0], measured_commit()
    started = time.perf_counter()
    with work_dir(args.dir, "bench-produce-consume-") as root:
        print(
            f"runnel produce/consume benchmark in {root} (quick={params.quick}, pin={params.pin}, "
            f"confluent-kafka={'yes' if params.confluent else 'not installed'}, "
            f"commit {commit[0]}{' with uncommitted changes' if commit[1] else ''}, "
            f"load average {load_at_start:.2f} at start)",
            flush=True,
        )
        results = run(root, params)
    elapsed = time.perf_counter() - started
    summary = Summary(results)
    print_table(params, results, summary)
    print(f"finished in {elapsed:.1f} s")
    print(reproduce(params))
    print(json.dumps(report(params, results, summary, commit, load_at_start, elapsed)))


if __name__ == "__main__":
    main()
