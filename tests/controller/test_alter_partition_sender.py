"""The AlterPartition sender against a real controller quorum (three in-process controllers,
real gRPC): a committed change reaches the partition at once; a proposal made from a stale
view stays pending (it may have been committed) and is asked again until the image ends it;
a refusal for good ends it."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

from support import FakeClock
from test_service import Quorum, heartbeat_until_unfenced, register, run, topic

from broker.alter_partition import AlterPartitionSender
from controller.client import ControllerClient
from controller.image import MetadataImage, PartitionState
from controller.quorum import QuorumController
from proto import controller_pb2 as cpb
from replication.partition import Partition
from storage.config import LogConfig
from storage.loader import load_log

BACKOFF_MS = 50


def active(quorum: Quorum) -> QuorumController:
    return next(c for _, _, c in quorum.parts if c.active)


async def setup(
    quorum: Quorum, client: ControllerClient
) -> tuple[dict[int, int], PartitionState, bytes]:
    epochs = {}
    for broker_id in (1, 2, 3):
        epochs[broker_id] = await register(client, broker_id)
        await heartbeat_until_unfenced(client, broker_id, epochs[broker_id])
    response = await client.call("CreateTopics", cpb.CreateTopicsRequest(topics=[topic("t", 1, 3)]))
    assert [t.error for t in response.topics] == [cpb.NONE]
    image = active(quorum).committed_image
    topic_id = image.topic_ids["t"]
    return epochs, image.topics[topic_id].partitions[0], topic_id


LAG_MS = 1000


def leader_replica(
    root: Path, state: PartitionState, topic_id: bytes, sender: AlterPartitionSender
) -> Partition:
    log = load_log(root / "t-0", LogConfig(), clock=FakeClock())
    partition = Partition(
        "t", topic_id, 0, log, local_broker_id=state.leader, replica_lag_time_max_ms=LAG_MS
    )
    partition.propose_isr = sender.propose
    partition.make_leader(state, now_ms=0)
    return partition


def shrink_to(partition: Partition, kept: int) -> tuple[int, ...]:
    """Follower ``kept`` fetches; the other stays silent past the lag time: the leader
    proposes the ISR without it (through the sender)."""
    partition.read_for_follower(
        kept, 0, 1000, last_fetched_epoch=-1, current_leader_epoch=partition.leader_epoch,
        now_ms=LAG_MS + 500,
    )  # fmt: skip
    assert partition.maybe_shrink_isr(now_ms=LAG_MS + 600)
    proposed = partition.pending_isr
    assert proposed == (partition.leader_id, kept)
    return proposed


def sender_for(
    quorum: Quorum, client: ControllerClient, epochs: dict[int, int], leader: int
) -> AlterPartitionSender:
    ticks = itertools.count()

    def image() -> MetadataImage:
        return active(quorum).committed_image

    return AlterPartitionSender(
        leader,
        client,
        lambda: epochs[leader],
        image,
        lambda: next(ticks),
        retry_backoff_ms=BACKOFF_MS,
    )


async def until(what: str, condition: object, timeout_s: float = 10) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)


def test_a_committed_shrink_reaches_the_partition_from_the_answer(tmp_path: Path) -> None:
    async def main(quorum: Quorum, client: ControllerClient) -> None:
        epochs, state, topic_id = await setup(quorum, client)
        sender = sender_for(quorum, client, epochs, state.leader)
        partition = leader_replica(tmp_path, state, topic_id, sender)
        others = [b for b in state.isr if b != state.leader]
        smaller = shrink_to(partition, others[0])
        await until("the answer", lambda: partition.pending_isr is None)
        assert partition.isr == smaller and partition.partition_epoch == state.partition_epoch + 1
        committed = active(quorum).committed_image.topics[topic_id].partitions[0]
        assert committed.isr == smaller
        await sender.close()

    run(main, tmp_path)


def test_a_proposal_from_a_stale_view_stays_pending_until_the_image_ends_it(
    tmp_path: Path,
) -> None:
    async def main(quorum: Quorum, client: ControllerClient) -> None:
        epochs, state, topic_id = await setup(quorum, client)
        sender = sender_for(quorum, client, epochs, state.leader)
        partition = leader_replica(tmp_path, state, topic_id, sender)
        others = [b for b in state.isr if b != state.leader]
        # Another proposal, committed while this replica's view stays at the old epoch (as
        # if its answer were lost): the controller now has partition epoch + 1.
        first = (state.leader, others[0])
        request = cpb.AlterPartitionRequest(
            broker_id=state.leader,
            broker_epoch=epochs[state.leader],
            topic_id=topic_id,
            partition_id=0,
            leader_epoch=state.leader_epoch,
            partition_epoch=state.partition_epoch,
            new_isr=[cpb.IsrMember(broker_id=b, broker_epoch=epochs[b]) for b in first],
        )
        assert (await client.call("AlterPartition", request)).header.error == cpb.NONE
        second = shrink_to(partition, others[1])
        await until("refusals", lambda: sender.refused >= 2)  # asked again, still pending
        assert partition.pending_isr == second and partition.isr == state.isr
        newer = active(quorum).committed_image.topics[topic_id].partitions[0]
        partition.make_leader(newer, now_ms=1)  # the image catches up: the proposal ends
        assert partition.pending_isr is None and partition.isr == first
        await asyncio.sleep(3 * BACKOFF_MS / 1000)
        refused = sender.refused
        await asyncio.sleep(3 * BACKOFF_MS / 1000)
        assert sender.refused == refused  # no longer asked
        await sender.close()

    run(main, tmp_path)
