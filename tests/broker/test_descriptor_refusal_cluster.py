"""A broker short of file descriptors (real processes: one controller and one broker under an
open-file limit of 512, of which 256 stay reserved, ``storage.descriptors``): it refuses the
logs of some partitions assigned to it and serves them once descriptors are free again,
without their topic changing; and restarted with more logs on disk than its limit allows, it
says so and does not start (no data directory is taken for failed)."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from test_local_cluster import REPO, Cluster, free_base_port, wait_for
from test_local_cluster import runnel as local_runnel

from runnel.local_cluster import process_alive

LIMIT = 512  # the node raises its soft limit to the hard one: both are set
FILLER_PARTITIONS = 300  # one descriptor a log here: more than the 256 left for logs
WAIT_S = 30.0
MANY_PARTITIONS = 600  # one descriptor each at load: more than the limit


def low_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def runnel(*args: str, stdin: str = "", timeout_s: float = WAIT_S) -> CompletedProcess[str]:
    """``python -m runnel`` under the low open-file limit (the nodes it starts inherit it)."""
    return local_runnel(*args, stdin=stdin, timeout_s=timeout_s + 30, preexec_fn=low_limit)


def ok(*args: str, stdin: str = "") -> str:
    done = runnel(*args, stdin=stdin)
    assert done.returncode == 0, f"runnel {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout + done.stderr


@contextlib.contextmanager
def one_broker(tmp_path: Path, limited: bool) -> Iterator[tuple[Cluster, str]]:
    """A cluster of one controller and one broker, started under the low limit or not."""
    cluster = Cluster(tmp_path / "cluster", free_base_port(2))
    try:
        up = local_runnel(
            "cluster", "up", "--once", "--controllers", "1", "--brokers", "1",
            "--base-port", str(cluster.base_port), *cluster.where,
            preexec_fn=low_limit if limited else None,
        )  # fmt: skip
        assert up.returncode == 0, up.stdout + up.stderr
        match = re.search(r"^bootstrap: (\S+)", up.stdout, re.MULTILINE)
        assert match is not None, up.stdout
        yield cluster, match[1]
    finally:
        runnel("cluster", "down", *cluster.where)
        for pid in cluster.pids():  # whatever is left: kill -9, found by pid file
            if process_alive(pid, str(cluster.data_dir)) or process_alive(pid, "cluster\0up"):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def short(tmp_path: Path) -> Iterator[tuple[Cluster, str]]:
    with one_broker(tmp_path, limited=True) as started:
        yield started


def broker_log(cluster: Cluster) -> str:
    (node,) = [p for p in cluster.data_dir.glob("node-*/node.log") if "broker" in p.read_text()]
    return node.read_text()


@pytest.mark.slow
def test_refused_partitions_are_served_once_descriptors_are_free(
    short: tuple[Cluster, str],
) -> None:
    cluster, bootstrap = short
    where = cluster.where
    ok("topics", "create", "filler", "--partitions", str(FILLER_PARTITIONS), *where)
    ok("topics", "create", "wanted", "--partitions", "1", "--replication-factor", "1", *where)
    summary = wait_for(
        "the broker's summary of refused logs",
        lambda: re.search(r"(\d+) logs of partitions assigned here refused", broker_log(cluster)),
        WAIT_S,
    )
    assert int(summary[1]) > 0
    assert list(cluster.data_dir.glob("node-*/data/wanted-0")) == []  # refused
    refused = runnel(
        "produce", "wanted", "--bootstrap", bootstrap, "--timeout-s", "3", stdin="early\n",
        timeout_s=3,
    )  # fmt: skip
    assert refused.returncode != 0, refused.stderr

    ok("topics", "delete", "filler", *where)  # its logs close: descriptors free again
    values = [f"record {i}" for i in range(20)]

    def produced() -> bool | None:
        done = runnel(
            "produce", "wanted", "--bootstrap", bootstrap, "--timeout-s", "3",
            stdin="".join(f"{v}\n" for v in values), timeout_s=3,
        )  # fmt: skip
        return True if done.returncode == 0 else None

    wait_for("produce to the once refused partition", produced, WAIT_S)
    consumed = ok(
        "consume", "wanted", "--bootstrap", bootstrap, "--from", "earliest",
        "--max-messages", str(len(values)), "--timeout-s", "10",
    )  # fmt: skip
    assert [line for line in consumed.splitlines() if line.startswith("record ")] == values
    assert "early" not in consumed


@pytest.mark.slow
def test_a_restart_with_more_logs_than_descriptors_says_so_and_does_not_start(
    tmp_path: Path,
) -> None:
    with one_broker(tmp_path, limited=False) as (cluster, _):
        ok("topics", "create", "many", "--partitions", str(MANY_PARTITIONS), *cluster.where)
        wait_for(
            "every log created",
            lambda: (
                sum(1 for _ in cluster.data_dir.glob("node-*/data/many-*")) == MANY_PARTITIONS
                or None
            ),
            WAIT_S,
        )
        (node_dir,) = {p.parent.parent for p in cluster.data_dir.glob("node-*/data/many-*")}
        pid_file, config = node_dir / "node.pid", node_dir / "node.toml"
        os.kill(int(pid_file.read_text()), signal.SIGTERM)  # a clean stop
        wait_for(
            "the broker to stop",
            lambda: not process_alive(int(pid_file.read_text()), str(cluster.data_dir)) or None,
            WAIT_S,
        )
        started = subprocess.run(
            [sys.executable, "-m", "runnel", "node", "--config", str(config)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=WAIT_S + 60,
            preexec_fn=low_limit,
        )
    assert started.returncode != 0, started.stderr[-2000:]
    (said,) = [line for line in started.stderr.splitlines() if "cannot start" in line]
    assert "ran out of file descriptors loading its logs" in said and "ulimit -n" in said, said
    assert "offline" not in said, said
