"""The asyncio driver with real files and an in-process network: elections, commits,
NotLeader, read barriers, failover, restart and catch-up through a snapshot."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from support import FAST_RAFT, fill, tmpfs

from raft.core import NotLeader, RaftConfig
from raft.driver import APPLY_CHUNK_RECORDS, RaftNode, RaftNodeConfig, RecordTooLarge
from raft.messages import Envelope
from storage.errors import StorageError

FAST = FAST_RAFT


class Counter:
    """A replicated state machine: the list of applied records."""

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.offsets: dict[int, bytes] = {}  # what was applied at each offset

    def apply(self, offset: int, record: bytes) -> None:
        self.records.append(record)
        self.offsets[offset] = record

    def snapshot(self) -> bytes:
        return b"\n".join(self.records)

    def restore(self, data: bytes) -> None:
        self.records = data.split(b"\n") if data else []


class Hub:
    """Delivers envelopes between nodes in this event loop; a node that is down drops them,
    and a send to a crashed one is reported unreachable to the sender, as the gRPC transport
    reports a refused connection (a report can be outdated by a reply already on its way)."""

    def __init__(self) -> None:
        self.receivers: dict[int, Callable[[Envelope], None]] = {}
        self.unreachable_listeners: dict[int, Callable[[int], None]] = {}
        self.crashed: set[int] = set()

    def transport(self, node_id: int) -> HubTransport:
        return HubTransport(self, node_id)


class HubTransport:
    def __init__(self, hub: Hub, node_id: int) -> None:
        self.hub, self.node_id = hub, node_id

    async def send(self, envelope: Envelope) -> None:
        receiver = self.hub.receivers.get(envelope.destination)
        if receiver is not None:
            asyncio.get_running_loop().call_soon(receiver, envelope)
        elif envelope.destination in self.hub.crashed:
            listener = self.hub.unreachable_listeners.get(self.node_id)
            if listener is not None:
                asyncio.get_running_loop().call_soon(listener, envelope.destination)

    def set_receiver(self, callback: Callable[[Envelope], None]) -> None:
        self.hub.receivers[self.node_id] = callback

    def set_unreachable_listener(self, callback: Callable[[int], None]) -> None:
        self.hub.unreachable_listeners[self.node_id] = callback


class Cluster:
    def __init__(
        self,
        root: Path,
        voters: int = 3,
        snapshot_every: int = 10_000,
        raft: RaftConfig = FAST,
        snapshot_bytes: int = 2**62,
        snapshot_ms: int = 2**62,
    ) -> None:
        self.root, self.hub, self.raft = root, Hub(), raft
        self.snapshot_bytes, self.snapshot_ms = snapshot_bytes, snapshot_ms
        self.voters = frozenset(range(1, voters + 1))
        self.snapshot_every = snapshot_every
        self.nodes: dict[int, RaftNode] = {}
        self.machines: dict[int, Counter] = {}

    async def start(self, node_id: int) -> RaftNode:
        machine = Counter()
        config = RaftNodeConfig(
            node_id,
            self.voters,
            self.root / f"node-{node_id}",
            self.raft,
            snapshot_interval_records=self.snapshot_every,
            snapshot_interval_bytes=self.snapshot_bytes,
            snapshot_interval_ms=self.snapshot_ms,
        )
        node = RaftNode(config, self.hub.transport(node_id), machine)
        await node.start()
        self.nodes[node_id], self.machines[node_id] = node, machine
        return node

    async def stop(self, node_id: int) -> None:
        self.hub.receivers.pop(node_id, None)
        self.hub.unreachable_listeners.pop(node_id, None)
        await self.nodes.pop(node_id).close()

    def crash(self, node_id: int) -> None:
        """Cut the node off without a resignation, and tell the others as a reset
        connection would; its task keeps running but hears and reaches nobody."""
        self.hub.receivers.pop(node_id, None)
        self.hub.unreachable_listeners.pop(node_id, None)
        self.hub.crashed.add(node_id)
        for listener in self.hub.unreachable_listeners.values():
            listener(node_id)

    async def leader(self, timeout_s: float = 10.0, exclude: int | None = None) -> RaftNode:
        async with asyncio.timeout(timeout_s):
            while True:
                leaders = [n for i, n in self.nodes.items() if n.role == "leader" and i != exclude]
                if len(leaders) == 1:
                    return leaders[0]
                await asyncio.sleep(0.02)

    async def converge(
        self, expected: list[bytes], timeout_s: float = 10.0, nodes: set[int] | None = None
    ) -> None:
        machines = [m for i, m in self.machines.items() if nodes is None or i in nodes]
        async with asyncio.timeout(timeout_s):
            while any(m.records != expected for m in machines):
                await asyncio.sleep(0.02)

    async def close(self) -> None:
        for node_id in list(self.nodes):
            await self.stop(node_id)


def run(coro: Callable[[], object]) -> None:
    asyncio.run(asyncio.wait_for(coro(), 60))  # type: ignore[arg-type]


def test_three_nodes_elect_a_leader_and_commit_proposals(tmp_path: Path) -> None:
    async def main() -> None:
        cluster = Cluster(tmp_path)
        try:
            for node_id in (1, 2, 3):
                await cluster.start(node_id)
            leader = await cluster.leader()
            offsets = [await leader.propose([b"r%d" % i]) for i in range(5)]
            assert offsets == sorted(offsets) and len(set(offsets)) == 5
            await cluster.converge([b"r%d" % i for i in range(5)])
            await leader.read_barrier()
            follower = next(n for n in cluster.nodes.values() if n is not leader)
            with pytest.raises(NotLeader) as err:
                await follower.propose([b"nope"])
            assert err.value.leader_id == leader.config.node_id
            with pytest.raises(NotLeader):
                await follower.read_barrier()
        finally:
            await cluster.close()

    run(main)


def test_concurrent_proposals_each_learn_the_offset_of_their_last_record(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        # About offsets, not elections. Once (CI on a slow, busy machine, 2026-11-23) a
        # follower heard nothing for FAST's 600 ms fetch timeout mid-test and an election
        # ended the leader's term (NotLeader, epoch 2): here silence cannot end a term.
        cluster = Cluster(tmp_path, raft=replace(FAST, fetch_timeout_ms=60_000))
        try:
            for node_id in (1, 2, 3):
                await cluster.start(node_id)
            leader = await cluster.leader()
            proposals = [[b"p%d-%d" % (i, j) for j in range(i % 3 + 1)] for i in range(300)]
            offsets = await asyncio.gather(*(leader.propose(p) for p in proposals))
            applied = cluster.machines[leader.config.node_id].offsets
            for records, last in zip(proposals, offsets, strict=True):
                first = last - len(records) + 1
                assert [applied[o] for o in range(first, last + 1)] == records
            assert len(set(offsets)) == len(offsets)
            with pytest.raises(ValueError):
                await leader.propose([])
        finally:
            await cluster.close()

    run(main)


def test_a_crashed_leader_reported_unreachable_is_replaced_without_waiting_out_silence(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        # Silence alone would need a minute to start an election; the report needs one
        # election timeout (150 ms), so an election inside the 10 s wait is the report's.
        cluster = Cluster(tmp_path, raft=replace(FAST, fetch_timeout_ms=60_000))
        try:
            for node_id in (1, 2, 3):
                await cluster.start(node_id)
            leader = await cluster.leader()
            old = leader.config.node_id
            await leader.propose([b"before"])
            cluster.crash(old)
            new = await cluster.leader(timeout_s=10, exclude=old)
            await new.propose([b"after"])
            await cluster.converge([b"before", b"after"], nodes=set(cluster.nodes) - {old})
        finally:
            await cluster.close()

    run(main)


def test_failover_restart_and_catch_up_through_a_snapshot(tmp_path: Path) -> None:
    async def main() -> None:
        cluster = Cluster(tmp_path, snapshot_every=5)
        try:
            for node_id in (1, 2, 3):
                await cluster.start(node_id)
            leader = await cluster.leader()
            expected = []
            for i in range(12):
                expected.append(b"a%d" % i)
                await leader.propose([expected[-1]])
            old = leader.config.node_id
            await cluster.stop(old)  # the leader goes away
            leader = await cluster.leader(exclude=old)
            for i in range(12):
                expected.append(b"b%d" % i)
                await leader.propose([expected[-1]])
            # The old leader comes back with its data and catches up.
            await cluster.start(old)
            await cluster.converge(expected)
            # A node wiped of its data rejoins through a snapshot.
            victim = next(i for i in cluster.nodes if i != leader.config.node_id)
            await cluster.stop(victim)
            shutil.rmtree(tmp_path / f"node-{victim}")
            await cluster.start(victim)
            await cluster.converge(expected)
            assert list((tmp_path / f"node-{victim}" / "snapshots").glob("*.checkpoint"))
        finally:
            await cluster.close()

    run(main)


def snapshot_after(
    tmp_path: Path, cluster: Cluster, before: list[bytes], pause_s: float, after: list[bytes]
) -> None:
    """One voter: propose ``before`` (no snapshot yet), wait ``pause_s``, propose ``after``;
    a snapshot must then appear (taken right after the commit that made it due)."""

    async def main() -> None:
        try:
            leader = await cluster.start(1)
            await cluster.leader()
            directory = tmp_path / "node-1" / "snapshots"
            await leader.propose(before)
            assert not list(directory.glob("*.checkpoint"))
            await asyncio.sleep(pause_s)
            await leader.propose(after)
            async with asyncio.timeout(10):
                while not list(directory.glob("*.checkpoint")):
                    await asyncio.sleep(0.01)
        finally:
            await cluster.close()

    run(main)


def test_a_snapshot_is_taken_after_a_number_of_applied_bytes(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, voters=1, snapshot_bytes=1000)
    snapshot_after(tmp_path, cluster, [b"x" * 400, b"y" * 400], 0, [b"z" * 300])  # 800, 1100


def test_a_snapshot_is_taken_once_its_interval_has_passed_and_there_is_news(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path, voters=1, snapshot_ms=300)
    snapshot_after(tmp_path, cluster, [b"a"], 0.4, [b"b"])  # news after the 300 ms interval


def test_a_commit_larger_than_an_apply_chunk_is_applied_in_full_and_in_order(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        cluster = Cluster(tmp_path)
        try:
            for node_id in (1, 2, 3):
                await cluster.start(node_id)
            leader = await cluster.leader()
            big = [b"r%d" % i for i in range(APPLY_CHUNK_RECORDS * 2 + 7)]
            last = await leader.propose(big)  # answered once every record is applied
            assert cluster.machines[leader.config.node_id].records == big
            await leader.propose([b"after"])
            await cluster.converge([*big, b"after"])
            assert last == leader.applied_end - 2  # the next proposal's record follows it
        finally:
            await cluster.close()

    run(main)


def test_a_burst_beyond_the_logs_largest_batch_commits_everywhere_and_stops_no_node(
    tmp_path: Path,
) -> None:
    # 18 proposals of 1 MiB taken by one turn of the leader's loop were written as one
    # 18 MiB batch, which the metadata log (max_message_bytes 16 MiB) refused: the leader's
    # Raft task ended (on_fatal), and so would every follower's that fetched it.
    async def main() -> None:
        cluster = Cluster(tmp_path)
        fatal: list[str] = []
        try:
            for node_id in (1, 2, 3):
                (await cluster.start(node_id)).on_fatal = fatal.append
            leader = await cluster.leader()
            records = [b"%02d" % i + b"." * (1024 * 1024) for i in range(18)]
            futures = [leader.submit([record]) for record in records]
            async with asyncio.timeout(30):
                while not fatal and not all(f.done() for f in futures):
                    await asyncio.sleep(0.02)
            assert not fatal, fatal
            offsets = [f.result() for f in futures]
            assert offsets == list(range(offsets[0], offsets[0] + 18))
            await cluster.converge(records, timeout_s=30)
            with pytest.raises(RecordTooLarge):  # it cannot be stored even alone
                leader.submit([b"x" * (16 * 1024 * 1024)])
            assert await leader.propose([b"after"]) == offsets[-1] + 1
            await cluster.converge([*records, b"after"])
            assert not fatal and all(n.failed is None for n in cluster.nodes.values())
        finally:
            await cluster.close()

    run(main)


def test_a_metadata_log_on_a_full_disk_is_fatal_and_said_once(tmp_path: Path) -> None:
    # A real full disk under the only voter: the next append fails (ENOSPC), the Raft task
    # ends, and on_fatal tells the node why; close() still returns (the log's own close may
    # fail on the full disk, which the node logs).
    with tmpfs(tmp_path / "node-1", 2) as disk:

        async def main() -> None:
            cluster = Cluster(tmp_path, voters=1)
            node = await cluster.start(1)
            told: list[str] = []
            node.on_fatal = told.append
            try:
                leader = await cluster.leader()
                await leader.propose([b"before"])
                fill(disk)
                proposal = asyncio.ensure_future(leader.propose([b"x" * 4096]))
                async with asyncio.timeout(10):
                    while not told:
                        await asyncio.sleep(0.01)
                assert len(told) == 1 and "No space left on device" in told[0], told
                assert node.failed == told[0]
                proposal.cancel()
            finally:
                cluster.hub.receivers.pop(1, None)
                with contextlib.suppress(StorageError):
                    await cluster.nodes.pop(1).close()

        run(main)
