"""A broker short of file descriptors refuses the logs of some partitions assigned to it, and
serves them once descriptors are free again, without their topic changing (real processes:
one controller and one broker under an open-file limit of 512, of which 256 stay reserved,
``storage.descriptors``)."""

from __future__ import annotations

import os
import re
import resource
import signal
from collections.abc import Iterator
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from test_local_cluster import Cluster, free_base_port, wait_for
from test_local_cluster import runnel as local_runnel

from runnel.local_cluster import process_alive

LIMIT = 512  # the node raises its soft limit to the hard one: both are set
FILLER_PARTITIONS = 300  # one descriptor a log here: more than the 256 left for logs
WAIT_S = 30.0


def runnel(*args: str, stdin: str = "", timeout_s: float = WAIT_S) -> CompletedProcess[str]:
    """``python -m runnel`` under the low open-file limit (the nodes it starts inherit it)."""
    return local_runnel(
        *args,
        stdin=stdin,
        timeout_s=timeout_s + 30,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT)),
    )


def ok(*args: str, stdin: str = "") -> str:
    done = runnel(*args, stdin=stdin)
    assert done.returncode == 0, f"runnel {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture
def short(tmp_path: Path) -> Iterator[tuple[Cluster, str]]:
    cluster = Cluster(tmp_path / "cluster", free_base_port(2))
    try:
        up = ok(
            "cluster", "up", "--once", "--controllers", "1", "--brokers", "1",
            "--base-port", str(cluster.base_port), *cluster.where,
        )  # fmt: skip
        match = re.search(r"^bootstrap: (\S+)", up, re.MULTILINE)
        assert match is not None, up
        yield cluster, match[1]
    finally:
        runnel("cluster", "down", *cluster.where)
        for pid in cluster.pids():  # whatever is left: kill -9, found by pid file
            if process_alive(pid, str(cluster.data_dir)) or process_alive(pid, "cluster\0up"):
                os.kill(pid, signal.SIGKILL)


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
