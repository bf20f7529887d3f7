"""The AlterPartition sender against a real controller quorum (three in-process controllers,
real gRPC): a committed change reaches the partition at once; proposals made together go in
one request, each answered on its own; a proposal made from a stale view stays pending (it
may have been committed) and is asked again until the image ends it; a refusal for good
ends it."""

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
    quorum: Quorum, client: ControllerClient, partitions: int = 1
) -> tuple[dict[int, int], PartitionState, bytes]:
    epochs = {}
    for broker_id in (1, 2, 3):
        epochs[broker_id] = await register(client, broker_id)
        await heartbeat_until_unfenced(client, broker_id, epochs[broker_id])
    request = cpb.CreateTopicsRequest(topics=[topic("t", partitions, 3)])
    response = await client.call("CreateTopics", request)
    assert [t.error for t in response.topics] == [cpb.NONE]
    image = active(quorum).committed_image
    topic_id = image.topic_ids["t"]
    return epochs, image.topics[topic_id].partitions[0], topic_id


LAG_MS = 1000


def leader_replica(
    root: Path, state: PartitionState, topic_id: bytes, sender: AlterPartitionSender
) -> Partition:
    log = load_log(root / f"t-{state.partition_id}", LogConfig(), clock=FakeClock())
    partition = Partition(
        "t",
        topic_id,
        state.partition_id,
        log,
        local_broker_id=state.leader,
        replica_lag_time_max_ms=LAG_MS,
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
        change = cpb.IsrChange(
            topic_id=topic_id,
            partition_id=0,
            leader_epoch=state.leader_epoch,
            partition_epoch=state.partition_epoch,
            new_isr=[cpb.IsrMember(broker_id=b, broker_epoch=epochs[b]) for b in first],
        )
        request = cpb.AlterPartitionRequest(
            broker_id=state.leader, broker_epoch=epochs[state.leader], changes=[change]
        )
        response = await client.call("AlterPartition", request)
        assert response.header.error == cpb.NONE
        assert [r.error for r in response.results] == [cpb.NONE]
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


def test_proposals_made_together_go_in_one_request_each_answered_on_its_own(
    tmp_path: Path,
) -> None:
    """A leader of many partitions shrinks them all at once: one AlterPartition carries
    them. One proposal in it is malformed (an ISR without the leader): refused for good, it
    ends alone and its partition rests; the others are committed."""

    async def main(quorum: Quorum, client: ControllerClient) -> None:
        epochs, _, topic_id = await setup(quorum, client, partitions=12)
        states = active(quorum).committed_image.topics[topic_id].partitions
        leader = max((1, 2, 3), key=lambda b: sum(p.leader == b for p in states.values()))
        sender = sender_for(quorum, client, epochs, leader)
        led = [
            leader_replica(tmp_path, state, topic_id, sender)
            for state in states.values()
            if state.leader == leader
        ]
        assert len(led) >= 4
        malformed, rest = led[0], led[1:]
        followers = [b for b in malformed.isr if b != leader]
        assert malformed._propose_isr((followers[0],))  # the leader left out
        smaller = {
            p.partition_id: shrink_to(p, next(b for b in p.isr if b != leader)) for p in rest
        }
        await until("the answers", lambda: all(p.pending_isr is None for p in led))
        assert sender.requests == 1 and sender.sent == len(led)
        assert {p.partition_id: p.isr for p in rest} == smaller
        committed = active(quorum).committed_image.topics[topic_id].partitions
        assert {i: committed[i].isr for i in smaller} == smaller
        assert malformed.isr == committed[malformed.partition_id].isr
        assert malformed.isr == states[malformed.partition_id].isr
        assert sender.refused == 1
        assert not sender.propose(malformed, (leader, followers[0]))  # resting after it
        await sender.close()

    run(main, tmp_path)


def test_a_request_refused_as_a_whole_is_asked_again_with_the_current_broker_epoch(
    tmp_path: Path,
) -> None:
    async def main(quorum: Quorum, client: ControllerClient) -> None:
        epochs, state, topic_id = await setup(quorum, client)
        registered = epochs[state.leader]
        epochs[state.leader] = registered - 1  # as if this broker's view were behind
        sender = sender_for(quorum, client, epochs, state.leader)
        partition = leader_replica(tmp_path, state, topic_id, sender)
        smaller = shrink_to(partition, next(b for b in state.isr if b != state.leader))
        await until("refusals", lambda: sender.requests >= 2)  # STALE_BROKER_EPOCH, again
        assert partition.pending_isr == smaller and partition.isr == state.isr
        epochs[state.leader] = registered
        await until("the answer", lambda: partition.pending_isr is None)
        assert partition.isr == smaller
        await sender.close()

    run(main, tmp_path)


def rejoin_fetch(partition: Partition, follower: int, broker_epoch: int = -1) -> None:
    """A fetch of ``follower`` at the leader's log end (0), saying ``broker_epoch``."""
    partition.read_for_follower(
        follower, 0, 1000, last_fetched_epoch=-1, current_leader_epoch=partition.leader_epoch,
        now_ms=LAG_MS + 700, broker_epoch=broker_epoch,
    )  # fmt: skip


async def one_follower_dropped(
    quorum: Quorum, client: ControllerClient, root: Path
) -> tuple[dict[int, int], AlterPartitionSender, Partition, int]:
    """A leader whose ISR has committed the shrink of one follower: (brokers' epochs, the
    sender, the leader's partition, the dropped follower)."""
    epochs, state, topic_id = await setup(quorum, client)
    sender = sender_for(quorum, client, epochs, state.leader)
    partition = leader_replica(root, state, topic_id, sender)
    kept, dropped = [b for b in state.isr if b != state.leader]
    shrink_to(partition, kept)
    await until("the shrink", lambda: partition.pending_isr is None)
    assert dropped not in partition.isr
    return epochs, sender, partition, dropped


def test_a_follower_joins_only_as_the_incarnation_the_metadata_names(tmp_path: Path) -> None:
    """KIP-903: a follower out of the ISR that has caught up is proposed back only when its
    fetch says the broker epoch the metadata holds for it; a fetch saying another epoch (a
    previous incarnation's, which may have had records the restarted one lost) proposes
    nothing. A fetch that says none (Fetch v14 and below) is taken as before."""

    async def main(quorum: Quorum, client: ControllerClient) -> None:
        epochs, sender, partition, dropped = await one_follower_dropped(quorum, client, tmp_path)
        stale = epochs[dropped] + 7  # another incarnation's (epochs start at 0)
        rejoin_fetch(partition, dropped, stale)
        assert partition.follower_broker_epoch(dropped) == stale
        assert partition.pending_isr is None and sender.sent == 1  # nothing proposed
        rejoin_fetch(partition, dropped, epochs[dropped])
        assert partition.pending_isr == (*partition.isr, dropped)
        await until("the expansion", lambda: partition.pending_isr is None)
        assert dropped in partition.isr
        await sender.close()

    run(main, tmp_path)


def test_a_follower_that_says_no_broker_epoch_joins_as_before(tmp_path: Path) -> None:
    async def main(quorum: Quorum, client: ControllerClient) -> None:
        _, sender, partition, dropped = await one_follower_dropped(quorum, client, tmp_path)
        rejoin_fetch(partition, dropped)
        assert partition.follower_broker_epoch(dropped) == -1
        await until("the expansion", lambda: dropped in partition.isr)
        await sender.close()

    run(main, tmp_path)
