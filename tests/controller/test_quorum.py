"""The quorum controller on three in-process controller nodes (real Raft driver, real files,
the in-memory transport): one becomes active, changes commit everywhere, decisions see the
ones before them, standbys refuse, and a new active controller takes over."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from support import FAST_RAFT

from controller.config import ControllerConfig
from controller.image import MetadataImage
from controller.outcome import DecisionError, Outcome
from controller.quorum import NotController, PeriodicTask, QuorumController
from controller.state_machine import MetadataStateMachine
from proto import controller_pb2 as cpb
from proto import metadata_pb2 as mpb
from raft.driver import RaftNode, RaftNodeConfig
from raft.transport import LocalHub

FAST = FAST_RAFT
VOTERS = frozenset({1, 2, 3})


def create_topic(name: str) -> Callable[[MetadataImage], Outcome[str]]:
    """A toy decision: a topic with a name-derived id, refused if the name is taken."""

    def decide(image: MetadataImage) -> Outcome[str]:
        if image.topic_by_name(name) is not None:
            raise DecisionError(cpb.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        topic_id = name.encode().ljust(16, b"-")[:16]
        record = mpb.MetadataRecord(topic=mpb.TopicRecord(name=name, topic_id=topic_id))
        return Outcome((record,), name)

    return decide


class Controllers:
    def __init__(self, root: Path) -> None:
        self.root, self.hub = root, LocalHub()
        self.nodes: dict[int, RaftNode] = {}
        self.controllers: dict[int, QuorumController] = {}

    async def start(self, node_id: int) -> QuorumController:
        machine = MetadataStateMachine()
        transport = self.hub.transport(node_id)
        config = RaftNodeConfig(node_id, VOTERS, self.root / f"c{node_id}", FAST)
        node = RaftNode(config, transport, machine)
        controller = QuorumController(node, machine, ControllerConfig())
        await transport.start()
        await node.start()
        self.nodes[node_id], self.controllers[node_id] = node, controller
        return controller

    async def stop(self, node_id: int) -> None:
        controller, node = self.controllers.pop(node_id), self.nodes.pop(node_id)
        await controller.close()
        await node.close()
        await node._transport.close()  # type: ignore[attr-defined]

    async def active(self, exclude: int | None = None) -> QuorumController:
        async with asyncio.timeout(10):
            while True:
                active = [c for i, c in self.controllers.items() if c.active and i != exclude]
                if len(active) == 1:
                    return active[0]
                await asyncio.sleep(0.01)

    async def converged(self) -> set[str]:
        """Wait until every controller's committed image is the same; return its digests."""
        async with asyncio.timeout(10):
            while True:
                images = [c.committed_image for c in self.controllers.values()]
                if len({i.offset for i in images}) == 1:
                    return {i.digest() for i in images}
                await asyncio.sleep(0.01)

    async def close(self) -> None:
        for node_id in list(self.controllers):
            await self.stop(node_id)


def run(main: Callable[[Controllers], Coroutine[Any, Any, None]], root: Path) -> None:
    async def body() -> None:
        controllers = Controllers(root)
        try:
            for node_id in sorted(VOTERS):
                await controllers.start(node_id)
            await main(controllers)
        finally:
            await controllers.close()

    asyncio.run(asyncio.wait_for(body(), 60))


def test_a_change_commits_on_every_controller(tmp_path: Path) -> None:
    async def main(cs: Controllers) -> None:
        active = await cs.active()
        answer, offset = await active.write(create_topic("orders"))
        assert answer == "orders" and offset > 0
        digests = await cs.converged()
        assert len(digests) == 1
        for controller in cs.controllers.values():
            assert controller.committed_image.topic_by_name("orders") is not None

    run(main, tmp_path)


def test_a_standby_refuses_naming_the_active_controller(tmp_path: Path) -> None:
    async def main(cs: Controllers) -> None:
        active = await cs.active()
        standby = next(c for c in cs.controllers.values() if c is not active)
        with pytest.raises(NotController) as err:
            await standby.write(create_topic("x"))
        assert err.value.leader_id == active.node_id

    run(main, tmp_path)


def test_concurrent_decisions_see_the_uncommitted_ones_before_them(tmp_path: Path) -> None:
    async def main(cs: Controllers) -> None:
        active = await cs.active()
        names = [f"t{i % 40}" for i in range(80)]  # every name twice, all in flight at once
        results = await asyncio.gather(
            *(active.write(create_topic(n)) for n in names), return_exceptions=True
        )
        created = [r for r in results if isinstance(r, tuple)]
        refused = [r for r in results if isinstance(r, DecisionError)]
        assert len(created) == 40 and len(refused) == 40, results
        assert all(r.code == cpb.TOPIC_ALREADY_EXISTS for r in refused)
        await cs.converged()
        assert len(active.committed_image.topics) == 40

    run(main, tmp_path)


def test_an_answer_resting_on_records_in_flight_waits_for_their_commit(tmp_path: Path) -> None:
    """A decision that writes nothing, or refuses, but sees an uncommitted record in the
    speculative image is answered only once that record is in the committed image."""

    def sees(name: str) -> Callable[[MetadataImage], Outcome[bool]]:
        return lambda image: Outcome((), image.topic_by_name(name) is not None)

    async def main(cs: Controllers) -> None:
        active = await cs.active()
        write = asyncio.ensure_future(active.write(create_topic("orders")))
        await asyncio.sleep(0)  # proposed, not committed
        assert active.committed_image.topic_by_name("orders") is None
        seen, _ = await active.write(sees("orders"))
        assert seen and active.committed_image.topic_by_name("orders") is not None
        await write

        again = asyncio.ensure_future(active.write(create_topic("audit")))
        await asyncio.sleep(0)
        with pytest.raises(DecisionError):
            await active.write(create_topic("audit"))
        assert active.committed_image.topic_by_name("audit") is not None
        await again

    run(main, tmp_path)


def test_a_new_active_controller_takes_over_with_the_committed_image(tmp_path: Path) -> None:
    async def main(cs: Controllers) -> None:
        first = await cs.active()
        await first.write(create_topic("before"))
        await cs.stop(first.node_id)
        second = await cs.active(exclude=first.node_id)
        with pytest.raises(DecisionError):
            await second.write(create_topic("before"))  # it sees what the first committed
        await second.write(create_topic("after"))
        await cs.start(first.node_id)  # the old one comes back as a standby and catches up
        digests = await cs.converged()
        assert len(digests) == 1 and not cs.controllers[first.node_id].active

    run(main, tmp_path)


def test_a_record_too_large_for_the_metadata_log_refuses_the_request_not_the_node(
    tmp_path: Path,
) -> None:
    def huge(image: MetadataImage) -> Outcome[str]:
        config = mpb.ConfigRecord(
            resource_type="TOPIC", resource_name="orders", name="x", value="v" * (17 << 20)
        )
        return Outcome((mpb.MetadataRecord(config=config),), "huge")

    async def main(cs: Controllers) -> None:
        active = await cs.active()
        with pytest.raises(DecisionError) as e:
            await active.write(huge)
        assert e.value.code == cpb.INVALID_REQUEST and "too large" in e.value.message
        answer, _ = await active.write(create_topic("orders"))  # the controller goes on
        assert answer == "orders"
        await cs.converged()

    run(main, tmp_path)


def test_a_periodic_duty_that_fails_unexpectedly_is_logged_and_runs_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in one run of a duty (fencing, say) must not end that duty for the rest of
    this controller's term."""
    runs: list[int] = []

    async def duty() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            raise ValueError("a bug in the duty")

    async def body() -> None:
        machine, transport = MetadataStateMachine(), LocalHub().transport(1)
        node = RaftNode(
            RaftNodeConfig(1, frozenset({1}), tmp_path / "c1", FAST), transport, machine
        )
        controller = QuorumController(node, machine, ControllerConfig())
        controller.add_periodic(PeriodicTask("duty", 0.01, duty))
        await transport.start()
        await node.start()
        try:
            async with asyncio.timeout(10):
                while len(runs) < 3:
                    await asyncio.sleep(0.01)
        finally:
            await controller.close()
            await node.close()
            await transport.close()

    with caplog.at_level(logging.ERROR, logger="controller.quorum"):
        asyncio.run(asyncio.wait_for(body(), 30))
    assert any("duty failed" in r.getMessage() and r.exc_info for r in caplog.records)
