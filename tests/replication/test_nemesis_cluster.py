"""Random faults on real processes, chosen by a seeded RNG: 1 controller and 3 brokers
(``fault_cluster.py``), a topic of 3 partitions with replication factor 3 and
min.insync.replicas 2, a producer writing unique values with acks=all and a consumer
tailing the topic the whole time.

Each step strikes one or two brokers at once (two leave a single one running: acks=all
must then fail, not lie), each with one of: kill -9, SIGSTOP, SIGTERM (a controlled
shutdown), and where network namespaces can be made (root; ``netns_cluster.py``, each node
a host of its own) three cuts of the network: the broker cut off from everyone but the
clients, from the controller only (it goes on replicating while the controller fences it),
or from one other broker; chosen among the leaders half the time. In a quarter of the steps
the controller too (kill -9 or SIGSTOP, or cut off from every broker: no metadata reaches
the brokers meanwhile, they go on with the image they have). Then it waits a random while
(up to twice the session timeout, so a paused or cut-off broker is sometimes fenced and
sometimes not); heals them in a random order (start again, SIGCONT, the cuts removed); and
waits until every partition has its full ISR and the producer has records acknowledged
again. At the end, as in ``test_cluster_replication.py``: the replicas agree batch for batch
below the high watermark, every acknowledged record is in the log once at its offset, and
the consumer saw nothing the log does not hold.

The quorum variant runs the same with three controllers (ids 1-3): a controller is struck
in 60 % of the steps, the active one half the time, and one cut off is cut from every other
node, so the others elect one of themselves (check-quorum). It ends, besides, with the three
controllers holding the same metadata image.

Each failure names its seed; replay one with ``NEMESIS_SEEDS=7 python -m pytest
tests/replication/test_nemesis_cluster.py`` (``NEMESIS_QUORUM_SEEDS`` for the quorum
variant; the faults are the same on any machine that can make network namespaces, and
differ from those drawn where it cannot; the timing of real processes is not).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import fault_cluster as rc
import netns_cluster as nc
import pytest

Cluster = rc.Cluster

PARTITIONS = 3
STEPS = 5
CONTROLLER = 1
FAULTS = ("kill", "pause", "terminate")
NETWORK_FAULTS = ("isolate", "lose-controller", "split")  # with network namespaces only
SEEDS = [int(s) for s in os.environ.get("NEMESIS_SEEDS", "1,3").split(",")]
QUORUM_SEEDS = [int(s) for s in os.environ.get("NEMESIS_QUORUM_SEEDS", "4,6").split(",")]
QUORUM = (1, 2, 3)


def _running(tmp_path: Path, controllers: int) -> Iterator[Cluster]:
    """Nodes on a network of their own where this machine can make one (the network faults
    need it), else on 127.0.0.1 (``fault_cluster.replication_cluster``)."""
    running = nc.running if nc.available() is None else rc.running
    with running(tmp_path / "cluster", controllers=controllers) as cluster:
        yield cluster


@pytest.fixture
def nemesis_cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from _running(tmp_path, 1)


@pytest.fixture
def nemesis_quorum(tmp_path: Path) -> Iterator[Cluster]:
    yield from _running(tmp_path, len(QUORUM))


class Faults:
    """Strikes and heals; remembers which cuts each struck node made."""

    def __init__(self, c: Cluster, rng: random.Random, controllers: tuple[int, ...]) -> None:
        self.c, self.rng, self.controllers = c, rng, controllers
        self.cuts: dict[int, list[tuple[int, int]]] = {}

    def strike(self, node: int, fault: str) -> None:
        c = self.c
        if fault == "kill":
            c.kill(node)
        elif fault == "pause":
            c.pause(node)
        elif fault == "terminate":
            c.terminate(node)
        else:
            network = self._network()
            others = [b for b in rc.BROKERS if b != node]
            controllers = [n for n in self.controllers if n != node]
            if fault == "isolate":  # from every other node
                pairs = network.isolate(node, [*controllers, *others])
            elif fault == "lose-controller":  # a broker from every controller
                pairs = network.isolate(node, controllers)
            else:  # split: a broker from one other broker
                pairs = network.isolate(node, [self.rng.choice(others)])
            self.cuts[node] = pairs
            c.note(f"cut {node} off from {[b for _, b in pairs]}")

    def heal(self, node: int, fault: str) -> None:
        c = self.c
        if fault == "pause":
            c.resume(node)
        elif fault in FAULTS:
            c.start(node)
        else:
            for a, b in self.cuts.pop(node):
                self._network().heal(a, b)
            c.note(f"healed the cuts of {node}")

    def broker_faults(self) -> tuple[str, ...]:
        return FAULTS + NETWORK_FAULTS if isinstance(self.c, nc.NetnsCluster) else FAULTS

    def controller_faults(self) -> tuple[str, ...]:
        networked = isinstance(self.c, nc.NetnsCluster)
        return ("kill", "pause", "isolate") if networked else ("kill", "pause")

    def _network(self) -> nc.Network:
        assert isinstance(self.c, nc.NetnsCluster) and self.c.network is not None
        return self.c.network


def victims(c: Cluster, faults: Faults, rng: random.Random, topic: str) -> list[tuple[int, str]]:
    """One or two brokers, leaders half the time, each with its fault; sometimes the
    controller too."""
    leaders = sorted({v.leader for v in c.partitions(topic, rc.BROKERS)} - {-1})
    pool = leaders if leaders and rng.random() < 0.5 else list(rc.BROKERS)
    first = rng.choice(pool)
    chosen = [first]
    if rng.random() < 0.4:
        chosen.append(rng.choice([b for b in rc.BROKERS if b != first]))
    struck = [(b, rng.choice(faults.broker_faults())) for b in chosen]
    quorum = len(faults.controllers) > 1
    if rng.random() < (0.6 if quorum else 0.25):
        controller = faults.controllers[0]
        if quorum:  # the active one half the time (drawn alike either way)
            active, other = rng.random() < 0.5, rng.choice(faults.controllers)
            controller = (c.active_controller() if active else None) or other
        struck.append((controller, rng.choice(faults.controller_faults())))
    return struck


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_random_faults_lose_no_acknowledged_record(nemesis_cluster: Cluster, seed: int) -> None:
    run(nemesis_cluster, seed, (CONTROLLER,), "NEMESIS_SEEDS")


@pytest.mark.slow
@pytest.mark.parametrize("seed", QUORUM_SEEDS)
def test_random_faults_with_a_controller_quorum(nemesis_quorum: Cluster, seed: int) -> None:
    run(nemesis_quorum, seed, QUORUM, "NEMESIS_QUORUM_SEEDS")
    rc.wait_for(
        f"seed {seed}: the controllers to hold the same metadata image",
        lambda: nemesis_quorum.same_metadata_image(QUORUM),
        30,
    )


def run(c: Cluster, seed: int, controllers: tuple[int, ...], variable: str) -> None:
    """The steps, then the checks of the module docstring; ``variable`` replays the seed."""
    topic, rng = "nemesis", random.Random(seed)
    faults = Faults(c, rng, controllers)
    c.note(f"seed {seed} (replay: {variable}={seed})")
    c.create_topic(topic, PARTITIONS)
    load = rc.Continuous(c.bootstrap, topic, PARTITIONS, "nemesis", rc.ONCE)
    with rc.Tail(c, topic, PARTITIONS) as tail, load:
        rc.wait_acks(c, load, 0, 0, 50, f"seed {seed}: acks before any fault")
        for step in range(1, STEPS + 1):
            struck = victims(c, faults, rng, topic)
            for node, fault in struck:
                faults.strike(node, fault)
            c.note(f"seed {seed} step {step}: {struck}")
            time.sleep(rng.uniform(0.5, 2 * c.session_s))
            rng.shuffle(struck)
            for node, fault in struck:
                faults.heal(node, fault)
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
