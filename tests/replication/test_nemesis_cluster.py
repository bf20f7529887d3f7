"""Random faults on real processes, chosen by a seeded RNG: 1 controller and 3 brokers
(``fault_cluster.py``), a topic of 3 partitions with replication factor 3 and
min.insync.replicas 2, a producer writing unique values with acks=all and a consumer
tailing the topic the whole time.

Each step strikes one or two brokers at once (two leave a single one running: acks=all
must then fail, not lie), each with one of: kill -9, SIGSTOP, SIGTERM (a controlled
shutdown), chosen among the leaders half the time, and in a quarter of the steps the
controller too (kill -9 or SIGSTOP: no metadata changes meanwhile, the brokers go on with
the image they have); waits a random while (up to twice the
session timeout, so a paused broker is sometimes fenced and sometimes not); heals them in a
random order (start again, SIGCONT); and waits until every partition has its full ISR and the
producer has records acknowledged again. At the end, as in ``test_cluster_replication.py``:
the replicas agree batch for batch below the high watermark, every acknowledged record is in
the log once at its offset, and the consumer saw nothing the log does not hold.

Each failure names its seed; replay one with ``NEMESIS_SEEDS=7 python -m pytest
tests/replication/test_nemesis_cluster.py`` (the faults are the same; the timing of real
processes is not).
"""

from __future__ import annotations

import os
import random
import time

import fault_cluster as rc
import pytest

replication_cluster = rc.replication_cluster
Cluster = rc.Cluster

PARTITIONS = 3
STEPS = 5
CONTROLLER = 1
FAULTS = ("kill", "pause", "terminate")
SEEDS = [int(s) for s in os.environ.get("NEMESIS_SEEDS", "1,3").split(",")]


def strike(c: Cluster, broker: int, fault: str) -> None:
    if fault == "kill":
        c.kill(broker)
    elif fault == "pause":
        c.pause(broker)
    else:
        c.terminate(broker)


def heal(c: Cluster, broker: int, fault: str) -> None:
    if fault == "pause":
        c.resume(broker)
    else:
        c.start(broker)


def victims(c: Cluster, rng: random.Random, topic: str) -> list[tuple[int, str]]:
    """One or two brokers, leaders half the time, each with its fault; sometimes the
    controller too."""
    leaders = sorted({v.leader for v in c.partitions(topic, rc.BROKERS)} - {-1})
    pool = leaders if leaders and rng.random() < 0.5 else list(rc.BROKERS)
    first = rng.choice(pool)
    chosen = [first]
    if rng.random() < 0.4:
        chosen.append(rng.choice([b for b in rc.BROKERS if b != first]))
    struck = [(b, rng.choice(FAULTS)) for b in chosen]
    if rng.random() < 0.25:
        struck.append((CONTROLLER, rng.choice(("kill", "pause"))))
    return struck


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_random_faults_lose_no_acknowledged_record(replication_cluster: Cluster, seed: int) -> None:
    c, topic, rng = replication_cluster, "nemesis", random.Random(seed)
    c.note(f"seed {seed} (replay: NEMESIS_SEEDS={seed})")
    c.create_topic(topic, PARTITIONS)
    load = rc.Continuous(c.bootstrap, topic, PARTITIONS, "nemesis", rc.ONCE)
    with rc.Tail(c, topic, PARTITIONS) as tail, load:
        rc.wait_acks(c, load, 0, 0, 50, f"seed {seed}: acks before any fault")
        for step in range(1, STEPS + 1):
            struck = victims(c, rng, topic)
            for broker, fault in struck:
                strike(c, broker, fault)
            c.note(f"seed {seed} step {step}: {struck}")
            time.sleep(rng.uniform(0.5, 2 * c.session_s))
            rng.shuffle(struck)
            for broker, fault in struck:
                heal(c, broker, fault)
            c.wait_full_isr(topic, 60)
            rc.wait_acks(c, load, time.monotonic(), 0, 30, f"seed {seed} step {step}: healed")
    load.stop()
    tail.stop()
    c.note(f"seed {seed}: {load.report.summary()}; consumer saw {len(tail.seen)}")
    if tail.late_stop:
        c.note(f"the consumer thread took over 10 s to stop; 10 s in, it was in:\n{tail.late_stop}")
    assert load.unflushed == 0, f"seed {seed}: {load.report.summary()}"
    rc.check_outcome(c, topic, PARTITIONS, [load.report], tail=tail)
    assert len(tail.seen) > 0 and len(load.report.acked) > 300, load.report.summary()
