"""Layering (DESIGN.md): replication imports storage and nothing above it; the partition and
its errors are synchronous, plain logic driven by the broker's event loop."""

from __future__ import annotations

from support import REPO, assert_imports_none_of


def test_replication_imports_none_of_the_layers_above_it() -> None:
    modules = sorted(str(p.relative_to(REPO)) for p in (REPO / "replication").rglob("*.py"))
    assert "replication/partition.py" in modules
    assert_imports_none_of(modules, {"broker", "controller", "raft", "runnel"})


def test_the_partition_does_no_io_of_its_own() -> None:
    banned = {"asyncio", "grpc", "socket", "threading", "time", "random"}
    assert_imports_none_of(["replication/partition.py", "replication/errors.py"], banned)
