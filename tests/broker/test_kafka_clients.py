"""What every Kafka client relies on from a cluster that ``runnel cluster up`` is starting or
has just reported healthy. (Each client's own tests are in ``test_clients_*.py``.)

A client's first request is Metadata, to learn the brokers and the controller. A broker that
answers without listing itself, or names a controller it does not list, or that refuses the
connection once ``cluster up --once`` has said the cluster is healthy (its ``bootstrap:``
line), or then does not list every broker, breaks clients started right then:
librdkafka takes an answer without brokers as partial, and its admin client then waits for
the controller for 30 s and more, so ``AdminClient.create_topics`` times out.

The test watches both brokers' client listeners from before ``cluster up --once`` starts the
nodes until it says the cluster is healthy, asking each for Metadata (with kafka-python's
protocol classes) as fast as it can, then asks each once more.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import NamedTuple

import pytest
from kafka_cluster import BROKER_IDS, broker_metadata
from test_local_cluster import REPO, Cluster, cluster

from runnel.local_cluster import ClusterSpec, Port

__all__ = ["cluster"]  # the fixture

UP_TIMEOUT_S = 90


class Answer(NamedTuple):
    after_up: bool  # whether `cluster up --once` had said "healthy" when the question was asked
    broker_id: int
    brokers: list[int] | None  # None: the connection was refused
    controller_id: int

    def __str__(self) -> str:
        when = "after" if self.after_up else "during"
        if self.brokers is None:
            return f"{when} up: broker {self.broker_id} refused the connection"
        return (
            f"{when} up: broker {self.broker_id} answered brokers {self.brokers}, "
            f"controller_id {self.controller_id}"
        )


def _watch(addresses: dict[int, str], up: subprocess.Popen[str]) -> tuple[list[Answer], str]:
    """Ask each broker for Metadata from before ``up`` starts the nodes until it has reported
    the cluster healthy (its ``bootstrap:`` line) and each broker has answered once more.
    Returns the answers and ``up``'s output."""
    assert up.stdout is not None
    stdout = up.stdout
    lines: list[str] = []
    healthy = threading.Event()

    def read() -> None:
        for line in stdout:
            lines.append(line)
            if line.startswith("bootstrap:"):
                healthy.set()
        healthy.set()  # `up` ended (its exit code tells whether it said healthy)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    answers: list[Answer] = []
    deadline = time.monotonic() + UP_TIMEOUT_S
    while time.monotonic() < deadline:
        after_up = healthy.is_set()
        for broker_id, address in addresses.items():
            try:
                brokers, controller_id, _ = broker_metadata(address)
            except OSError:
                if after_up:  # while starting, a broker opens its listener when it is ready
                    answers.append(Answer(after_up, broker_id, None, -1))
                continue
            answers.append(Answer(after_up, broker_id, brokers, controller_id))
        if after_up:
            reader.join(timeout=30)
            return answers, "".join(lines)
    raise AssertionError(f"`cluster up --once` did not report within {UP_TIMEOUT_S} s")


def _up_and_watch(cluster: Cluster, *args: str) -> list[Answer]:
    """``cluster up --once [args]`` while watching the brokers; every answer they gave."""
    spec = ClusterSpec(1, 2, cluster.data_dir, cluster.base_port)
    addresses = {b: f"127.0.0.1:{spec.node(b).ports[Port.CLIENT]}" for b in BROKER_IDS}
    up = subprocess.Popen(
        [sys.executable, "-m", "runnel", "cluster", "up", "--once", *args, *cluster.where],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        answers, output = _watch(addresses, up)
        up.wait(timeout=30)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(timeout=10)
    assert up.returncode == 0, output
    return answers


def _wrong(answers: list[Answer]) -> list[Answer]:
    """While starting, a broker may not know the other yet, but it knows itself."""
    return [
        a
        for a in answers
        if a.brokers is None
        or a.broker_id not in a.brokers
        or a.controller_id not in a.brokers
        or (a.after_up and sorted(a.brokers) != list(BROKER_IDS))
    ]


@pytest.mark.slow
def test_while_and_after_cluster_up_brokers_answer_metadata_consistently(
    cluster: Cluster,
) -> None:
    """First a new cluster; then the same one restarted with 100 partition replicas on each
    broker, which it opens after being unfenced (so a listener that opens late, opens
    later)."""
    first = _up_and_watch(
        cluster, "--controllers", "1", "--brokers", "2", "--base-port", str(cluster.base_port)
    )
    create = ["many", "--partitions", "100", "--replication-factor", "2"]
    cluster.ok("topics", "create", *create)
    cluster.ok("cluster", "down")
    again = _up_and_watch(cluster)
    cluster.ok("cluster", "down")

    report = []
    for phase, answers in (("new cluster", first), ("restarted", again)):
        wrong = _wrong(answers)
        shown = "".join(f"\n  {a}" for a in wrong[:6])
        report += [f"{phase}: {len(wrong)} of {len(answers)} Metadata answers wrong{shown}"]
    assert not _wrong(first + again), "\n".join(report)
