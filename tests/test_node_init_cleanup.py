"""A node whose construction fails after its Raft node opened the metadata log closes that
log before the error goes on (``runnel/node.py``): no descriptor or memory map of the data
directory is left to the process, whether the node is built on an event loop (as ``serve``
builds it) or not.

The failure is injected into the last part built, the Kafka broker: the config checks leave
no real failure for that step, and everything before it (the controller, the broker's
lifecycle) must not stand in the way of the cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import write_combined_node_config

import runnel.node as node_module
from raft.driver import RaftNode
from runnel.commands import EXIT_PROBLEM
from runnel.config import NodeConfig, load_config
from runnel.node import RunnelNode, serve

PROC_SELF = Path("/proc/self")


def held_open(root: Path) -> list[str]:
    """The files under ``root`` this process holds: open descriptors and memory maps."""
    found = []
    for fd in (PROC_SELF / "fd").iterdir():
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            target = os.readlink(fd)
            if target.startswith(f"{root}/"):
                found.append(target)
    for line in (PROC_SELF / "maps").read_text().splitlines():
        if f" {root}/" in line:
            found.append(line.split()[-1])
    return found


def combined_node_config(tmp_path: Path) -> NodeConfig:
    path, _ = write_combined_node_config(tmp_path, fast=False)
    return load_config(path, {})


class KafkaBrokerFault(OSError):
    """What the injected Kafka broker raises."""


@pytest.fixture(autouse=True)
def no_cyclic_gc() -> Iterator[None]:
    """A half-built node is a reference cycle (its transport holds the Raft node's receiver),
    whose files the cyclic garbage collector would close whenever it runs: the tests must see
    only what the node closed itself."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture
def failing_kafka_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The node's Kafka broker fails to build; the list gets what was held open under
    ``tmp_path`` at that moment (the metadata log, for the test to know it was open)."""
    if not (PROC_SELF / "fd").is_dir():
        pytest.skip("needs /proc/self/fd (Linux) to see the open descriptors")
    seen: list[list[str]] = []

    def fail(*_args: object, **_kwargs: object) -> None:
        seen.append(held_open(tmp_path))
        raise KafkaBrokerFault("injected: the Kafka broker cannot be built")

    monkeypatch.setattr(node_module, "KafkaBroker", fail)
    return seen


def test_a_node_that_cannot_be_built_closes_its_metadata_log(
    tmp_path: Path, failing_kafka_broker: list[list[str]]
) -> None:
    config = combined_node_config(tmp_path)
    with pytest.raises(KafkaBrokerFault, match="injected"):
        RunnelNode(config)
    (during,) = failing_kafka_broker
    log_dir = config.metadata_log_dir
    assert any(path.startswith(f"{log_dir}/") for path in during), during  # it was open
    assert held_open(tmp_path) == []


def test_serve_closes_the_metadata_log_of_a_node_it_cannot_build(
    tmp_path: Path, failing_kafka_broker: list[list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    """On the event loop, as ``runnel node`` runs: exit status 1, the reason said once."""
    config = combined_node_config(tmp_path)
    status = asyncio.run(asyncio.wait_for(serve(config), 60))
    assert status == EXIT_PROBLEM
    (during,) = failing_kafka_broker
    assert during and held_open(tmp_path) == []
    said = [r.getMessage() for r in caplog.records if "cannot start" in r.getMessage()]
    assert said == ["node 1 cannot start: injected: the Kafka broker cannot be built"]


def test_a_failure_to_close_the_log_does_not_hide_why_the_node_cannot_be_built(
    tmp_path: Path,
    failing_kafka_broker: list[list[str]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    closing = RaftNode.close_unstarted

    def close_then_fail(raft: RaftNode) -> None:
        closing(raft)  # closed all the same: this test leaves nothing open either
        raise RuntimeError("injected: closing failed")

    monkeypatch.setattr(RaftNode, "close_unstarted", close_then_fail)
    with pytest.raises(KafkaBrokerFault, match="injected: the Kafka broker"):
        RunnelNode(combined_node_config(tmp_path))
    said = [r for r in caplog.records if "closing the metadata log" in r.getMessage()]
    assert [r.getMessage() for r in said] == ["node 1: closing the metadata log failed"]
    assert said[0].exc_info is not None and "injected: closing failed" in str(said[0].exc_info[1])
