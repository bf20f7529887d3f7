"""The order of bench.produce_consume's runs.

How this works. The trivial sinks and the runnel cluster are up together (an idle server
costs nothing), so every runnel figure is measured next to the baselines that qualify it and
a noisy spell of the shared machine hits both:

  latency  the paced producer and the long-polling consumer on the in-memory sink, then on
           runnel, alternating in ``rounds`` parts; each target's rounds are pooled.
  rounds   ``rounds`` times: the raw baseline (write, then read), a pause of
           ``PAGE_RETURN_SETTLE_S`` (so runnel does not write into the raw file's freed
           pages), the raw generator alone producing into the sink, then into runnel (a
           topic per round), the generator alone consuming from the sink, then the round's
           topic from runnel from offset 0. Ratios and headroom are per round; the table
           shows medians. The rounds' topics are kept (deleting a topic whose log the
           broker's maintenance thread is flushing took the broker's data directory offline:
           see docs/performance.md).
  clients  confluent-kafka: produce into the sink, into runnel; consume from the sink, and the
           last round's topic from runnel.
  sweep    the raw generator into runnel at the other batch sizes, into six partitions
           (produce, then consume), the 2014 test's topic, and (when pinned) the headline
           produce once more with the broker and the generator free to use both CPUs.
  replication  once that cluster is stopped, a cluster of 1 controller + 3 brokers for the
           replication runs (``produce_consume_replication.py``; not with ``--no-replication``).
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from bench.produce_consume_cluster import RunnelCluster, stopped_after
from bench.produce_consume_figures import Latency, LatencyRound, Params, Results, Round, Run
from bench.produce_consume_phases import (
    Target,
    confluent_run,
    e2e_run,
    load_run,
    raw_round,
    sink,
)
from bench.produce_consume_procs import ALL_CPUS, SERVER_CPUS, pin_process
from bench.produce_consume_replication import replication_params, run_replication

__all__ = ["run"]

TOPIC = "bench"
CLIENT_TOPIC = "bench-confluent"
E2E_TOPIC = "bench-e2e"
START_TIMEOUT_S = 120.0
TOPIC_TIMEOUT_S = 60.0
# On this VM page-cache memory freed within a second or so has been up to ten times cheaper to
# write into than memory freed 2 s or more before (docs/performance.md, "Page-cache memory"). The
# raw baseline deletes its file when done: a produce run starting sooner would write into the
# raw file's still-cheap pages, which the raw write itself did not have.
PAGE_RETURN_SETTLE_S = 3.0


def step(text: str) -> None:
    print(text, flush=True)


def round_topic(i: int) -> str:
    return f"{TOPIC}-round{i + 1}"


def batch_topic(batch_bytes: int) -> str:
    return f"{TOPIC}-{batch_bytes}"


PARTITIONS_TOPIC = f"{TOPIC}-partitions"
UNPINNED_TOPIC = f"{TOPIC}-unpinned"


def sweep_topics(params: Params) -> dict[str, int]:
    """The sweep's topics: name -> partitions."""
    topics = {batch_topic(b): params.partitions for b in params.sweep_batch_bytes}
    if params.sweep_partitions:
        topics[PARTITIONS_TOPIC] = params.sweep_partitions
    if params.pin:
        topics[UNPINNED_TOPIC] = params.partitions
    return topics


def all_topics(params: Params) -> dict[str, int]:
    topics = {round_topic(i): params.partitions for i in range(params.rounds)}
    topics.update({CLIENT_TOPIC: params.partitions, E2E_TOPIC: 1})
    topics.update(sweep_topics(params))
    return topics


def latency(alone: Target, runnel: Target, params: Params) -> tuple[Latency, Latency]:
    """``rounds`` paced runs on each, alternating, ``e2e_seconds`` in all per target."""
    seconds = params.e2e_seconds / params.rounds
    rounds: dict[Target, list[LatencyRound]] = {alone: [], runnel: []}
    offsets = dict.fromkeys(rounds, 0)  # each consumer starts after the earlier rounds' records
    for _ in range(params.rounds):
        for target in (alone, runnel):
            done, produced = e2e_run(target, E2E_TOPIC, params, seconds, offsets[target])
            rounds[target].append(done)
            offsets[target] += produced
            step(f"e2e round on {target.name}: p99 {done.p99_ms:.2f} ms")
    floor, e2e = (Latency(t.name, tuple(rounds[t])) for t in (alone, runnel))
    step(f"e2e, generator alone (in-memory sink): {_percentiles(floor)}")
    step(f"e2e, runnel: {_percentiles(e2e)}")
    return floor, e2e


def _percentiles(e2e: Latency) -> str:
    return f"p50 {e2e.p50_ms:.2f} ms, p99 {e2e.p99_ms:.2f} ms, p99.9 {e2e.p999_ms:.2f} ms"


def one_round(i: int, root: Path, alone: Target, runnel: Target, params: Params) -> Round:
    raw_write, raw_read = raw_round(root, params)
    time.sleep(PAGE_RETURN_SETTLE_S)  # both writes into memory the VM has not just freed
    step(
        f"round {i + 1}: raw write {raw_write.records_per_s:,.0f} records/s equivalent "
        f"({raw_write.wire_mb_per_s or 0:,.0f} MB/s), read {raw_read.records_per_s:,.0f} "
        f"({raw_read.wire_mb_per_s or 0:,.0f} MB/s)"
    )
    topic, batch, max_s = round_topic(i), params.batch_bytes, params.max_s
    alone_produce = load_run(
        "generator alone: produce", "produce", alone, TOPIC, params, params.sink_max_s
    )
    label = f"produce ({batch:,} B batches)"
    produce = load_run(label, "produce", runnel, topic, params, max_s, batch)
    alone_consume = load_run(
        "generator alone: consume", "consume", alone, TOPIC, params, params.sink_max_s
    )
    label = "consume from offset 0"
    consume = load_run(label, "consume", runnel, topic, params, max_s, records=produce.records)
    if consume.records < produce.records and consume.seconds < max_s:
        raise RuntimeError(f"consumed {consume.records} of {produce.records} records")
    done = Round(raw_write, raw_read, alone_produce, produce, alone_consume, consume)
    step(
        f"round {i + 1}: produce {produce.records_per_s:,.0f} records/s "
        f"({produce.records:,}; alone {alone_produce.records_per_s:,.0f}; "
        f"{done.produce_ratio:.2f} x raw), consume {consume.records_per_s:,.0f} "
        f"(alone {alone_consume.records_per_s:,.0f})"
    )
    return done


def clients(alone: Target, runnel: Target, params: Params) -> list[Run]:
    if not params.confluent:
        return []
    max_s, consumed = params.client_max_s, round_topic(params.rounds - 1)
    runs = [
        confluent_run("generator alone: produce", "produce", alone, TOPIC, params, max_s),
        confluent_run(
            "produce (librdkafka defaults)", "produce", runnel, CLIENT_TOPIC, params, max_s
        ),
        confluent_run("generator alone: consume", "consume", alone, TOPIC, params, max_s),
        confluent_run("consume from offset 0", "consume", runnel, consumed, params, max_s),
    ]
    for run in runs:
        step(f"confluent-kafka {run.label} ({run.target}): {run.records_per_s:,.0f} records/s")
    return runs


def sweep(runnel: Target, params: Params) -> list[Run]:
    runs = []
    max_s, batch = params.sweep_max_s, params.batch_bytes
    for batch_bytes in params.sweep_batch_bytes:
        label = f"produce ({batch_bytes:,} B batches)"
        topic = batch_topic(batch_bytes)
        runs.append(load_run(label, "produce", runnel, topic, params, max_s, batch_bytes))
    if params.sweep_partitions:
        n, topic = params.sweep_partitions, PARTITIONS_TOPIC
        label = f"produce ({batch:,} B batches, {n} partitions)"
        produce = load_run(label, "produce", runnel, topic, params, max_s, batch)
        label = f"consume from offset 0 ({n} partitions)"
        records = produce.records
        runs += [produce, load_run(label, "consume", runnel, topic, params, max_s, records=records)]
    if params.pin:  # the headline's produce again, the broker and the generator unpinned
        pin_process(runnel.pid, ALL_CPUS)
        try:
            label = f"produce ({batch:,} B batches, not pinned)"
            unpinned = replace(params, pin=False)
            runs.append(load_run(label, "produce", runnel, UNPINNED_TOPIC, unpinned, max_s, batch))
        finally:
            pin_process(runnel.pid, SERVER_CPUS)
    for run in runs:
        step(f"runnel {run.label}: {run.records_per_s:,.0f} records/s")
    return runs


def run(root: Path, params: Params) -> Results:
    cluster = RunnelCluster(root / "cluster")
    with ExitStack() as stack:
        memory_sink = stack.enter_context(sink(params, "memory", E2E_TOPIC))
        discard_sink = stack.enter_context(sink(params, "discard", TOPIC))
        with stopped_after(cluster):
            cluster.start(START_TIMEOUT_S)
            if params.pin:
                pin_process(cluster.broker_pid, SERVER_CPUS)
            cluster.create_topics(all_topics(params), TOPIC_TIMEOUT_S)
            runnel = Target("runnel", cluster.bootstrap, cluster.broker_pid)
            step(f"runnel: 1 controller + 1 broker up, Kafka listener {cluster.bootstrap}")
            floor, e2e = latency(memory_sink, runnel, params)
            rounds = [
                one_round(i, root, discard_sink, runnel, params) for i in range(params.rounds)
            ]
            client_runs = clients(discard_sink, runnel, params)
            sweep_runs = sweep(runnel, params)
            cluster.check_alive()
    replication = None
    if params.replication:
        rp = replication_params(
            params.quick, params.rounds, params.records, params.batch_bytes, params.in_flight
        )  # the rounds' topics have the 2014 test's six partitions, whatever --partitions says
        replication = run_replication(root, rp)
    return Results(floor, e2e, tuple(rounds), tuple(client_runs), tuple(sweep_runs), replication)
