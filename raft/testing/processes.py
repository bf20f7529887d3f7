"""Starting and killing counter voter processes (``raft.testing.counter_node``) on
127.0.0.1, shared by the real-process tests and ``bench/raft.py``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXIT_TIMEOUT_S = 10


def free_ports(count: int) -> list[int]:
    """Ports the kernel hands out now (bound together, so distinct; released on return)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def spawn_python(args: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
    """``python <args>`` from the repository root, output appended to ``log_path``."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=REPO,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )


def spawn_counter_node(
    node_id: int,
    voters: str,
    client_port: int,
    data_dir: Path,
    *,
    election_timeout_ms: int,
    fetch_timeout_ms: int,
    snapshot_every: int,
) -> subprocess.Popen[bytes]:
    """One counter voter; its log is ``node-<id>.log`` beside its data directory."""
    args = [
        "-m", "raft.testing.counter_node", "--node-id", str(node_id), "--voters", voters,
        "--client-port", str(client_port), "--data-dir", str(data_dir),
        "--election-timeout-ms", str(election_timeout_ms),
        "--fetch-timeout-ms", str(fetch_timeout_ms), "--snapshot-every", str(snapshot_every),
    ]  # fmt: skip
    return spawn_python(args, data_dir.parent / f"node-{node_id}.log")


def kill(proc: subprocess.Popen[bytes] | None) -> None:
    """kill -9 and reap (bounded)."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=EXIT_TIMEOUT_S)
