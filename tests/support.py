"""Helpers shared by the tests: a settable clock, a compact batch builder, an import
checker for pure modules, fast Raft timeouts for in-process clusters, small real disks
(tmpfs) that fill up, and the config file of a one-node cluster."""

from __future__ import annotations

import ast
import contextlib
import subprocess
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import pytest

from raft.core import RaftConfig
from raft.testing.processes import free_ports
from storage.batch import CompressionType
from storage.records import RecordInput, build_batch


class FakeClock:
    """A settable millisecond clock so time-based behaviour is deterministic."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


def make_batch(
    values: list[bytes],
    *,
    timestamp_ms: int = 1_700_000_000_000,
    base_offset: int = 0,
    keys: list[bytes | None] | None = None,
    compression: CompressionType = CompressionType.NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
) -> bytes:
    keys = keys or [None] * len(values)
    return build_batch(
        [
            RecordInput(k, v, timestamp_ms + i)
            for i, (k, v) in enumerate(zip(keys, values, strict=True))
        ],
        base_offset=base_offset,
        compression=compression,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        partition_leader_epoch=partition_leader_epoch,
    )


REPO = Path(__file__).resolve().parent.parent

# Raft timeouts for in-process clusters: elections in a few hundred milliseconds.
FAST_RAFT = RaftConfig(
    election_timeout_ms=150,
    election_backoff_max_ms=100,
    fetch_timeout_ms=600,
    fetch_max_wait_ms=100,
    append_linger_ms=2,
    request_timeout_ms=300,
)


def assert_imports_none_of(paths: Iterable[str], banned: set[str]) -> None:
    """Each module (path from the repository root) imports no module named in ``banned``."""
    for path in paths:
        tree = ast.parse((REPO / path).read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in banned, f"{path} imports {name}"


@contextlib.contextmanager
def tmpfs(path: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` mounted on ``path`` (created if missing) for the block, unmounted
    after it: a real disk that a test can fill. Mounting needs root (or CAP_SYS_ADMIN): the
    test skips, saying so, without it."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def fill(disk: Path) -> None:
    """Take every block left on ``disk`` (a file ``filler``)."""
    with open(disk / "filler", "ab") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"x" * 65536)
            f.flush()


# Quick heartbeats and elections for a one-node cluster started by a test.
FAST_NODE_SECTIONS = """[broker]
heartbeat_interval_ms = 100
[raft]
election_timeout_ms = 100
fetch_timeout_ms = 600
fetch_max_wait_ms = 100
"""


def write_combined_node_config(
    tmp_path: Path,
    listeners: Sequence[str] = ("CLIENT", "CONTROLLER"),
    settings: Callable[[dict[str, int]], str] = lambda ports: "",
    *,
    fast: bool = True,
) -> tuple[Path, dict[str, int]]:
    """``tmp_path/node.toml`` of node 1, controller and broker in one process, the only
    voter: a free port on 127.0.0.1 for each listener named (CONTROLLER is the controller
    listener; METRICS is the metrics port, not a listener), then the top-level lines
    ``settings(ports)`` gives, and ``FAST_NODE_SECTIONS`` if ``fast``. Returns the path and
    the ports."""
    ports = dict(zip(listeners, free_ports(len(listeners)), strict=True))
    bound = ", ".join(f'"{n}://127.0.0.1:{p}"' for n, p in ports.items() if n != "METRICS")
    lines = [
        "node_id = 1",
        'process_roles = ["controller", "broker"]',
        f"listeners = [{bound}]",
        f'data_dirs = ["{tmp_path / "data"}"]',
        f'controller_quorum_voters = "1@127.0.0.1:{ports["CONTROLLER"]}"',
    ]
    if "METRICS" in ports:
        lines.append(f"metrics_port = {ports['METRICS']}")
    text = "\n".join(lines) + "\n" + settings(ports) + (FAST_NODE_SECTIONS if fast else "")
    path = tmp_path / "node.toml"
    path.write_text(text)
    return path, ports
