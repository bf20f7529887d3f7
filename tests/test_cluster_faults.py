"""Faults on real local clusters (3 controller and 3 broker processes): the active controller
killed during a burst of topic creations, a whole-cluster restart, and a broker wiped of its
metadata catching up through a snapshot. Every node's image digest is read from its metrics
endpoint, so "every node agrees" is checked on all six processes, not just the controller."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import urllib.request
from typing import Any

import pytest
from test_local_cluster import BROKERS, Cluster, assert_all_gone, cluster, wait_for

from controller.client import ControllerClient, ControllerUnavailable, RetryPolicy
from proto import controller_pb2 as cpb
from runnel.local_cluster import ClusterSpec, Port

__all__ = ["cluster"]  # the fixture, shared with test_local_cluster

NODES = [1, 2, 3, *BROKERS]
_IMAGE = re.compile(r"^runnel_metadata_image\{(.*)\} 1\.0$", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def image_of(spec: ClusterSpec, node_id: int) -> tuple[int, str] | None:
    """(offset, digest) of a node's applied image, from its metrics; None if it is down."""
    port = spec.node(node_id).ports[Port.METRICS]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    match = _IMAGE.search(text)
    if match is None:
        return None
    labels = dict(_LABEL.findall(match[1]))
    return int(labels["offset"]), labels["digest"]


def agreed_image(spec: ClusterSpec, timeout_s: float = 30) -> str:
    """Wait until all six nodes report the same image digest; return it. (Offsets may differ
    by the active controller's keep-alive NoOps, which change nothing else.)"""
    seen: list[dict[int, tuple[int, str] | None]] = [{}]

    def same() -> str | None:
        seen[0] = {n: image_of(spec, n) for n in NODES}
        digests = {image[1] if image is not None else None for image in seen[0].values()}
        return digests.pop() if len(digests) == 1 and None not in digests else None

    try:
        return wait_for("every node to report the same image", same, timeout_s)
    except AssertionError as e:
        raise AssertionError(f"{e}; last seen (offset, digest) by node: {seen[0]}") from None


async def create_burst(
    spec: ClusterSpec, names: list[str], kill_after: int, victim_pid: int
) -> dict[str, str]:
    """Create ``names`` with 8 requests in flight; after ``kill_after`` answers, kill -9
    ``victim_pid``. Returns each name's outcome: an error code name or 'unavailable'."""
    client = ControllerClient(spec.controller_addresses(), RetryPolicy(timeout_ms=30_000))
    outcomes: dict[str, str] = {}
    slots = asyncio.Semaphore(8)

    async def create(name: str) -> None:
        request = cpb.CreateTopicsRequest(
            topics=[cpb.CreatableTopic(name=name, num_partitions=2, replication_factor=3)]
        )
        async with slots:
            try:
                response = await client.call("CreateTopics", request)
            except ControllerUnavailable:
                outcomes[name] = "unavailable"
                return
            (result,) = response.topics or [cpb.CreatableTopicResult(error=response.header.error)]
            outcomes[name] = cpb.ErrorCode.Name(result.error)
        if len(outcomes) == kill_after:
            os.kill(victim_pid, signal.SIGKILL)

    try:
        await asyncio.gather(*(create(n) for n in names))
    finally:
        await client.close()
    return outcomes


def _pid(spec: ClusterSpec, node_id: int) -> int:
    pid = spec.running_pid(node_id)
    assert pid is not None, f"node {node_id} is not running"
    return pid


@pytest.mark.slow
def test_killing_the_active_controller_in_a_burst_loses_and_duplicates_nothing(
    cluster: Cluster,
) -> None:
    cluster.ok("cluster", "up", "--once", "--base-port", str(cluster.base_port))
    spec = ClusterSpec.load(cluster.data_dir)
    assert spec is not None
    victim = _pid(spec, cluster.status()["controller_id"])  # the active controller
    names = [f"burst-{i:03d}" for i in range(60)]
    outcomes = asyncio.run(asyncio.wait_for(create_burst(spec, names, 15, victim), 120))
    assert_all_gone([victim])
    listed = set(cluster.ok("topics", "list").split())
    assert listed <= set(names)  # nothing that was not asked for
    for name, outcome in outcomes.items():
        if outcome in ("NONE", "TOPIC_ALREADY_EXISTS"):  # acknowledged, now or on a retry
            assert name in listed, (name, outcome)
        else:  # the client may retry these: they must be retriable errors
            assert outcome in ("unavailable", "REQUEST_TIMED_OUT", "NOT_CONTROLLER"), outcome
    for name in listed:
        partitions = cluster.describe(name)["partitions"]
        assert [p["partition"] for p in partitions] == [0, 1]
    cluster.ok("cluster", "up", "--once")  # the killed controller comes back and catches up
    agreed_image(spec)
    cluster.ok("cluster", "down")


@pytest.mark.slow
def test_a_restarted_cluster_agrees_and_a_wiped_broker_catches_up_from_a_snapshot(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNNEL_CONTROLLER__METADATA_SNAPSHOT_BYTES", "2048")  # snapshot often
    cluster.ok("cluster", "up", "--once", "--base-port", str(cluster.base_port))
    spec = ClusterSpec.load(cluster.data_dir)
    assert spec is not None
    names = [f"t{i}" for i in range(8)]
    for name in names:
        cluster.ok("topics", "create", name, "--partitions", "3", "--replication-factor", "2")
    replicas = {n: [p["replicas"] for p in cluster.describe(n)["partitions"]] for n in names}
    agreed_image(spec)
    pids = cluster.pids()
    cluster.ok("cluster", "down")
    assert_all_gone(pids)
    cluster.ok("cluster", "up", "--once")  # the whole cluster again
    agreed_image(spec)  # all six agree (brokers registered anew: a new state)
    assert cluster.ok("topics", "list").split() == names
    assert {n: [p["replicas"] for p in cluster.describe(n)["partitions"]] for n in names} == (
        replicas
    )

    epoch = cluster.brokers(cluster.status())[103]["broker_epoch"]
    pid = _pid(spec, 103)
    os.kill(pid, signal.SIGKILL)
    assert_all_gone([pid])
    shutil.rmtree(spec.node_dir(103) / "data")  # its metadata log and snapshots
    cluster.ok("cluster", "up", "--once")

    def registered_again() -> dict[str, Any] | None:
        broker = cluster.brokers(cluster.status())[103]
        return broker if broker["broker_epoch"] > epoch and not broker["fenced"] else None

    wait_for("broker 103 to register again and be unfenced", registered_again, 60)
    agreed_image(spec, timeout_s=60)
    assert cluster.ok("topics", "list").split() == names
    assert "loaded the leader's snapshot" in spec.log_path(103).read_text()
    cluster.ok("cluster", "down")
