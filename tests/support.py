"""Helpers shared by the tests: a settable clock, a compact batch builder, an import
checker for pure modules, and fast Raft timeouts for in-process clusters."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from raft.core import RaftConfig
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
