"""``runnel cluster`` and ``runnel topics`` against real local clusters: 3 controller and 3
broker processes on 127.0.0.1, driven through the command line as a person would.

Each real-process test has its own data dir (``tmp_path``) and a block of free ports, so the
tests can run side by side (``-n 2``); a fixture kill -9s whatever a test leaves running,
found through the pid files. Every wait is bounded. The first tests check the pure parts
(ids, ports, cluster.json, generated configs, the restart backoff) without processes.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from runnel.commands import CommandError
from runnel.config import load_config
from runnel.local_cluster import PORTS_PER_NODE, ClusterSpec, ports_in_use, process_alive
from runnel.supervisor import MAX_BACKOFF_S, next_backoff_s

REPO = Path(__file__).resolve().parent.parent
COMMAND_TIMEOUT_S = 90  # one runnel command (up waits for health within this)
BROKERS = [101, 102, 103]
T = TypeVar("T")

# -- the pure parts ----------------------------------------------------------------------------


def test_ids_and_ports_follow_a_fixed_pattern(tmp_path: Path) -> None:
    spec = ClusterSpec(3, 2, tmp_path, 20000)
    assert [n.node_id for n in spec.nodes()] == [1, 2, 3, 101, 102]
    assert spec.node(1).ports == {"CONTROLLER": 20001, "METRICS": 20003}
    assert spec.node(102).ports == {"CLIENT": 20016, "REPLICATION": 20018, "METRICS": 20019}
    assert spec.quorum_voters == "1@127.0.0.1:20001,2@127.0.0.1:20005,3@127.0.0.1:20009"
    assert spec.bootstrap == "127.0.0.1:20001,127.0.0.1:20005,127.0.0.1:20009"


def test_generated_configs_load_and_a_resume_keeps_the_cluster(tmp_path: Path) -> None:
    spec = ClusterSpec.resolve(tmp_path, 1, 2, 20100)
    spec.save()
    spec.write_node_configs()
    config = load_config(spec.config_path(101), {})
    assert config.node_id == 101 and config.data_dirs == (tmp_path / "node-101" / "data",)
    assert {x.name for x in config.listeners} == {"CLIENT", "REPLICATION"}
    assert ClusterSpec.resolve(tmp_path, None, None, None) == spec
    assert ClusterSpec.resolve(tmp_path, 1, 2, 20100) == spec
    with pytest.raises(CommandError, match=r"--brokers 3 conflicts"):
        ClusterSpec.resolve(tmp_path, None, 3, None)


def test_restart_backoff_doubles_from_one_second_to_thirty() -> None:
    waits = [next_backoff_s(None)]
    for _ in range(6):
        waits.append(next_backoff_s(waits[-1]))
    assert waits == [1, 2, 4, 8, 16, 30, 30] and MAX_BACKOFF_S == 30


def test_a_zombie_or_a_stranger_is_not_a_running_node() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while process_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(child.pid)  # exited, not reaped yet: a zombie
    child.wait(timeout=10)
    assert process_alive(os.getpid()) and not process_alive(os.getpid(), "no-such-node.toml")


# -- helpers for real clusters -----------------------------------------------------------------


def free_base_port(nodes: int) -> int:
    """The first of ``PORTS_PER_NODE * nodes`` consecutive ports that are free now, below the
    ephemeral range, in a range of its own for each xdist worker."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    low = 20000 + (worker % 3) * 4000
    for _ in range(100):
        base = random.randrange(low, low + 4000 - 100, PORTS_PER_NODE)
        if not ports_in_use(list(range(base, base + PORTS_PER_NODE * nodes))):
            return base
    raise AssertionError("no free block of ports")


def runnel(
    *args: str,
    timeout_s: float = COMMAND_TIMEOUT_S,
    stdin: str = "",
    preexec_fn: Callable[[], object] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m runnel ARGS`` from the repository, ``stdin`` as its input."""
    return subprocess.run(
        [sys.executable, "-m", "runnel", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        preexec_fn=preexec_fn,
    )


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = probe()
        if result is not None:
            return result
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class Cluster:
    """A local cluster's data dir and the commands that act on it."""

    def __init__(self, data_dir: Path, base_port: int) -> None:
        self.data_dir, self.base_port = data_dir, base_port
        self.where = ["--data-dir", str(data_dir)]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return runnel(*args, *self.where)

    def ok(self, *args: str) -> str:
        done = self.run(*args)
        assert done.returncode == 0, f"runnel {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    def up_two_brokers(self) -> str:
        """``cluster up --once`` with one controller and brokers 101 and 102; the Kafka
        bootstrap it prints."""
        up = self.ok(
            "cluster", "up", "--once", "--controllers", "1", "--brokers", "2",
            "--base-port", str(self.base_port),
        )  # fmt: skip
        match = re.search(r"^bootstrap: (\S+)", up, re.MULTILINE)
        assert match is not None, up
        return match[1]

    def status(self) -> dict[str, Any]:
        """``cluster status --json``, healthy or not (exit 0 or 1, as it says)."""
        done = self.run("cluster", "status", "--json")
        status = dict(json.loads(done.stdout))
        assert done.returncode == (0 if status["healthy"] else 1), done.stdout + done.stderr
        return status

    def describe(self, topic: str) -> dict[str, Any]:
        return dict(json.loads(self.ok("topics", "describe", topic, "--json")))

    def brokers(self, status: dict[str, Any]) -> dict[int, dict[str, Any]]:
        return {n["node_id"]: n for n in status["nodes"] if "broker" in n["roles"]}

    def pids(self) -> list[int]:
        files = [*self.data_dir.glob("node-*/node.pid"), self.data_dir / "supervisor.pid"]
        return [int(f.read_text()) for f in files if f.exists()]

    def healthy(self) -> dict[str, Any] | None:
        done = self.run("cluster", "status", "--json")
        return dict(json.loads(done.stdout)) if done.returncode == 0 else None


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    data_dir = tmp_path / "cluster"
    local = Cluster(data_dir, free_base_port(6))
    try:
        yield local
    finally:  # whatever the test left running: kill -9, found by pid file
        for pid in local.pids():
            if process_alive(pid, str(data_dir)) or process_alive(pid, "cluster\0up"):
                os.kill(pid, signal.SIGKILL)


def assert_all_gone(pids: list[int]) -> None:
    wait_for("every process to exit", lambda: all(not process_alive(p) for p in pids) or None, 10)


# -- real clusters -----------------------------------------------------------------------------


@pytest.mark.slow
def test_up_topics_status_bad_input_resume_and_down(cluster: Cluster) -> None:
    up = cluster.ok("cluster", "up", "--once", "--base-port", str(cluster.base_port))
    assert "bootstrap: 127.0.0.1:" in up and "pids: 1=" in up
    status = cluster.status()
    assert status["controller_id"] in {1, 2, 3}
    assert all(n["pid"] is not None and n["alive"] for n in status["nodes"])
    assert [n["node_id"] for n in status["nodes"]] == [1, 2, 3, *BROKERS]

    topic = _create_balanced_topic(cluster)
    _bad_input_changes_nothing(cluster, topic)
    pids = _resume_starts_only_what_is_missing(cluster, status)

    assert "stopped nodes 1,2,3,101,102,103" in cluster.ok("cluster", "down")
    assert_all_gone(pids)
    assert cluster.pids() == []
    assert cluster.run("cluster", "status").returncode == 1  # nobody answers


def _create_balanced_topic(cluster: Cluster) -> dict[str, Any]:
    create = ["events", "--partitions", "6", "--replication-factor", "3"]
    created = cluster.ok("topics", "create", *create, "--config", "retention.ms=3600000")
    assert "created topic events (6 partitions, replication factor 3)" in created
    topic = cluster.describe("events")
    partitions = topic["partitions"]
    assert [p["partition"] for p in partitions] == list(range(6))
    assert all(sorted(p["replicas"]) == BROKERS and p["isr"] == p["replicas"] for p in partitions)
    assert all(p["leader"] == p["replicas"][0] and p["leader_epoch"] == 0 for p in partitions)
    assert Counter(p["leader"] for p in partitions) == {101: 2, 102: 2, 103: 2}
    assert topic["configs"] == {"retention.ms": "3600000"}
    brokers = cluster.brokers(cluster.status())
    assert sorted(brokers) == BROKERS
    for b in brokers.values():
        assert not b["fenced"] and b["partitions"] == 6 and b["leaders"] == 2, b
    return topic


def _bad_input_changes_nothing(cluster: Cluster, topic: dict[str, Any]) -> None:
    one = ["--partitions", "3", "--replication-factor", "1"]
    for args, error in [
        (["bad", "--partitions", "3", "--replication-factor", "4"], "INVALID_REPLICATION_FACTOR"),
        (["bad name!", *one], "INVALID_TOPIC_EXCEPTION"),
        (["events", *one], "TOPIC_ALREADY_EXISTS"),
        (["bad", "--config", "no.such.config=1"], "INVALID_CONFIG"),
    ]:
        done = cluster.run("topics", "create", *args)
        assert done.returncode == 1 and error in done.stderr, done.stderr
    assert cluster.ok("topics", "list").split() == ["events"]
    assert cluster.describe("events") == topic
    conflict = cluster.run("cluster", "up", "--once", "--brokers", "4")
    assert conflict.returncode == 1 and "--brokers 4 conflicts" in conflict.stderr


def _resume_starts_only_what_is_missing(cluster: Cluster, status: dict[str, Any]) -> list[int]:
    """kill -9 a standby controller, then `up --once`: only that node starts again."""
    pids = {n["node_id"]: n["pid"] for n in status["nodes"]}
    standby = next(i for i in (1, 2, 3) if i != status["controller_id"])
    os.kill(pids[standby], signal.SIGKILL)
    assert_all_gone([pids[standby]])
    resumed = cluster.ok("cluster", "up", "--once")
    assert f"started nodes {standby}, already running" in resumed
    after = {n["node_id"]: n["pid"] for n in cluster.status()["nodes"]}
    assert after[standby] != pids[standby]
    assert {i: p for i, p in after.items() if i != standby} == {
        i: p for i, p in pids.items() if i != standby
    }
    return list(after.values())


@pytest.mark.slow
def test_a_killed_broker_is_fenced_restarted_rejoins_the_isr_and_leads_again(
    cluster: Cluster, tmp_path: Path
) -> None:
    with open(tmp_path / "up.out", "w") as out, open(tmp_path / "up.err", "w") as err:
        up = subprocess.Popen(
            [sys.executable, "-m", "runnel", "cluster", "up", *cluster.where,
             "--base-port", str(cluster.base_port)],
            cwd=REPO, env={**os.environ, **FAST_REBALANCE, "PYTHONPATH": str(REPO)},
            stdout=out, stderr=err,
        )  # fmt: skip
    try:
        _kill_and_watch(cluster, tmp_path)
        pids = cluster.pids()
        assert "`runnel cluster up`" in cluster.ok("cluster", "down")  # it stops its nodes
        assert up.wait(timeout=60) == 0
        assert_all_gone(pids)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(timeout=10)


# The periodic preferred-leader election every 2 s, for any imbalance (defaults: 300 s, 10 %).
FAST_REBALANCE = {
    "RUNNEL_CONTROLLER__LEADER_IMBALANCE_CHECK_INTERVAL_S": "2",
    "RUNNEL_CONTROLLER__LEADER_IMBALANCE_PER_BROKER_PERCENTAGE": "0",
}


def _kill_and_watch(cluster: Cluster, tmp_path: Path) -> None:
    output = tmp_path / "up.out"
    wait_for("cluster up to be healthy", lambda: "bootstrap:" in output.read_text() or None, 60)
    cluster.ok("topics", "create", "events", "--partitions", "6", "--replication-factor", "3")
    before = {p["partition"]: p for p in cluster.describe("events")["partitions"]}
    victim = cluster.brokers(cluster.status())[101]
    os.kill(victim["pid"], signal.SIGKILL)

    # The controller fences 101 after its session timeout (9 s) and takes it out of every
    # ISR; its restarted process registers, catches up and rejoins them. Since a restarted
    # broker is unfenced and answered within about 0.1 s (2026-11-24), 101 may be out of the
    # ISRs for less than one CLI poll, so its leaving is checked at the end, on the epochs:
    # each leader change bumps the leader epoch, each ISR change the partition epoch.
    def back() -> dict[str, Any] | None:
        """The restarted process registered (a new broker epoch) and was unfenced."""
        broker = cluster.brokers(cluster.status())[101]
        restarted = broker["pid"] not in {None, victim["pid"]}
        registered = broker["broker_epoch"] > victim["broker_epoch"]
        return broker if restarted and registered and not broker["fenced"] else None

    wait_for("the supervisor to restart broker 101 and its unfencing", back, 40)
    assert "node 101 (pid" in (tmp_path / "up.err").read_text()

    def preferred_again() -> list[dict[str, Any]] | None:
        """101 has caught up (back in every ISR), and the periodic rebalance has given each
        partition back to its preferred replica, the first one."""
        partitions = cluster.describe("events")["partitions"]
        ok = all(101 in p["isr"] and p["leader"] == p["replicas"][0] for p in partitions)
        return partitions if ok else None

    after = wait_for(
        "101 to rejoin every ISR and lead its preferred partitions", preferred_again, 40
    )
    for p in after:
        old = before[p["partition"]]
        assert p["leader"] == old["leader"]
        if old["leader"] == 101:  # away and back: two leader changes
            assert p["leader_epoch"] == old["leader_epoch"] + 2
        else:  # led by 102 or 103 throughout: 101 left the ISR and rejoined it
            assert p["leader_epoch"] == old["leader_epoch"]
            assert p["partition_epoch"] >= old["partition_epoch"] + 2


@pytest.mark.slow
def test_up_once_into_a_closed_pipe_leaves_the_cluster_up_and_status_tells_unhealthy(
    cluster: Cluster,
) -> None:
    """`cluster up --once | head -1` keeps the cluster it started; `cluster status` exits 1,
    saying why, once a broker is fenced and a partition has no leader."""
    up = subprocess.Popen(
        [sys.executable, "-m", "runnel", "cluster", "up", "--once", *cluster.where,
         "--controllers", "1", "--brokers", "2", "--base-port", str(cluster.base_port)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert up.stdout is not None
    try:
        assert up.stdout.readline().startswith("cluster in ")  # then the reader goes away
        up.stdout.close()
        assert up.wait(COMMAND_TIMEOUT_S) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(10)
    status = cluster.healthy()
    assert status is not None and status["problems"] == [], status
    assert all(n["alive"] for n in status["nodes"]), status
    text = cluster.run("cluster", "status")
    assert text.returncode == 0 and text.stdout.splitlines()[-1] == "health: healthy"

    # One partition on each broker (replication factor 1); kill -9 broker 102, which
    # `up --once` does not restart: the controller fences it, and its partition has no
    # leader left.
    cluster.ok("topics", "create", "solo", "--partitions", "2", "--replication-factor", "1")
    victim = cluster.brokers(cluster.status())[102]
    assert victim["leaders"] == 1, victim
    os.kill(victim["pid"], signal.SIGKILL)
    expected = ["broker 102 is fenced", "1 partition without a leader"]

    def unhealthy() -> dict[str, Any] | None:
        status = cluster.status()  # exit 1 exactly when "healthy" is false
        return status if status["problems"] == expected else None

    status = wait_for("broker 102 to be fenced", unhealthy, 40)
    assert status["healthy"] is False
    text = cluster.run("cluster", "status")
    assert text.returncode == 1, text.stdout + text.stderr
    assert text.stdout.splitlines()[-1] == f"health: UNHEALTHY: {'; '.join(expected)}"
    assert "the cluster is unhealthy" in text.stderr

    # Elections on request (`runnel topics elect`, Kafka's ElectLeaders): the dead broker's
    # partition has no replica left to elect, even uncleanly; the other needs nothing.
    partitions = cluster.describe("solo")["partitions"]
    (dead,) = [p["partition"] for p in partitions if p["leader"] == -1]
    unclean = cluster.run("topics", "elect", "solo", "--unclean")
    assert unclean.returncode == 1, unclean.stdout + unclean.stderr
    assert f"solo-{dead}: ELIGIBLE_LEADERS_NOT_AVAILABLE" in unclean.stdout
    assert f"solo-{1 - dead}: no election needed" in unclean.stdout
    assert "1 partition(s) not elected" in unclean.stderr
    preferred = cluster.ok("topics", "elect", "solo", "--partition", str(1 - dead))
    assert preferred.splitlines() == [
        f"solo-{1 - dead}: no election needed (preferred replica 101 already leads)"
    ]
    assert cluster.run("topics", "elect", "ghost").returncode == 1  # no such topic
    assert cluster.run("topics", "elect", "--partition", "0").returncode == 2  # needs NAME
    cluster.ok("cluster", "down")
