"""The active controller's service (controller/service.py) over a stand-in for the quorum
controller that commits every decision at once on an in-memory image and whose clock is
moved by hand: broker sessions (a broker dead for longer than the session timeout must be
fenced, whatever state it was in when this controller became active), registrations that
move partitions first, ElectLeaders and the periodic duties it schedules."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

import pytest
from test_elections import ORDERS, cluster, replay

from controller import brokers
from controller import records as rec
from controller.config import ControllerConfig
from controller.image import MetadataImage
from controller.outcome import Outcome
from controller.quorum import PeriodicTask
from controller.service import LEADERLESS_RECHECK_INTERVAL_S, ControllerService
from proto import controller_pb2 as cpb
from proto import metadata_pb2 as mpb

SESSION_MS = 9_000


class StandInController:
    """What ControllerService uses of QuorumController: decisions commit at once."""

    def __init__(self, image: MetadataImage, **config: Any) -> None:
        self.config = ControllerConfig(broker_session_timeout_ms=SESSION_MS, **config)
        self.node_id = 1
        self.now_ms = 1_000_000
        self.committed_image = image
        self.committed_offset = image.offset
        self.activations: list[Callable[[], None]] = []
        self.periodic: dict[str, PeriodicTask] = {}

    def clock_ms(self) -> int:
        return self.now_ms

    def on_activation(self, callback: Callable[[], None]) -> None:
        self.activations.append(callback)

    def add_periodic(self, task: PeriodicTask) -> None:
        self.periodic[task.name] = task

    async def write(self, decide: Callable[[MetadataImage], Outcome[Any]]) -> tuple[Any, int]:
        outcome = decide(self.committed_image)
        self.committed_image = replay(self.committed_image, outcome.records)
        self.committed_offset = self.committed_image.offset
        return outcome.response, self.committed_offset

    def activate(self) -> None:
        for callback in self.activations:
            callback()


async def heartbeat(service: ControllerService, image: MetadataImage, broker_id: int) -> Any:
    request = cpb.BrokerHeartbeatRequest(
        broker_id=broker_id,
        broker_epoch=image.brokers[broker_id].broker_epoch,
        metadata_offset=image.offset + 1_000,  # caught up
    )
    return await service.BrokerHeartbeat(request, None)  # type: ignore[arg-type]


def test_a_broker_fenced_at_activation_and_unfenced_later_is_fenced_when_it_goes_silent() -> None:
    async def main() -> None:
        image = cluster(partitions={0: ([3, 1], [3, 1], 3)})
        image = replay(image, [rec.fence_broker(3, image.brokers[3].broker_epoch)])
        controller = StandInController(image)
        service = ControllerService(controller, {1: "127.0.0.1:1"})  # type: ignore[arg-type]
        controller.activate()  # broker 3 is fenced now: catching up, say
        answer = await heartbeat(service, controller.committed_image, 3)
        assert answer.header.error == cpb.NONE
        assert not controller.committed_image.brokers[3].fenced
        await run_for(service, controller, SESSION_MS + 2_000, alive=(1, 2))  # 3 died
        assert controller.committed_image.brokers[3].fenced
        assert not controller.committed_image.brokers[1].fenced

    asyncio.run(asyncio.wait_for(main(), 30))


async def run_for(
    service: ControllerService, controller: StandInController, ms: int, alive: tuple[int, ...]
) -> None:
    """``ms`` of a running controller: every second the ``alive`` brokers heartbeat and the
    fence duty runs (its interval)."""
    for _ in range(ms // 1_000):
        controller.now_ms += 1_000
        for broker_id in alive:
            await heartbeat(service, controller.committed_image, broker_id)
        await controller.periodic["fence"].run()


def test_a_controller_that_did_not_run_for_a_while_fences_nobody_for_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Paused longer than a session timeout, the controller finds every session expired, yet
    the heartbeats of its time away are only unread: it moves every session on by that time.
    A broker that died before it is fenced when its remaining time runs out."""

    async def main() -> None:
        image = cluster(partitions={0: ([3, 1], [3, 1], 3)})
        controller = StandInController(image)
        service = ControllerService(controller, {1: "127.0.0.1:1"})  # type: ignore[arg-type]
        controller.activate()
        await run_for(service, controller, 3_000, alive=(1, 2, 3))
        await run_for(service, controller, 4_000, alive=(1, 2))  # 3 dies: 4 s of its 9 gone
        controller.now_ms += 2 * SESSION_MS  # paused: no heartbeat read, no duty run
        await heartbeat(service, controller.committed_image, 1)  # read before the duty runs
        await controller.periodic["fence"].run()
        assert not any(b.fenced for b in controller.committed_image.brokers.values())
        assert "did not run for 18000 ms" in caplog.text
        await run_for(service, controller, 4_000, alive=(2,))  # 1 dies just after the pause
        assert not controller.committed_image.brokers[3].fenced  # 8 s of its 9 gone
        await run_for(service, controller, 2_000, alive=(2,))
        assert controller.committed_image.brokers[3].fenced
        assert not controller.committed_image.brokers[1].fenced  # 6 s of its 9 gone
        await run_for(service, controller, 4_000, alive=(2,))  # its session, not 9 s more
        assert controller.committed_image.brokers[1].fenced
        assert not controller.committed_image.brokers[2].fenced

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_registration_that_first_moves_partitions_answers_its_error_and_opens_no_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new incarnation of a broker in more partitions than one decision changes: the
    service commits the moves, answers REQUEST_TIMED_OUT (the broker registers again) and
    opens a session only for the registration that is written at last."""
    monkeypatch.setattr(
        brokers, "register_broker", functools.partial(brokers.register_broker, limit=2)
    )

    async def main() -> None:
        image = cluster(partitions={p: ([2, 1], [2, 1], 2) for p in range(3)})
        controller = StandInController(image)
        service = ControllerService(controller, {1: "127.0.0.1:1"})  # type: ignore[arg-type]
        controller.now_ms += SESSION_MS + 1  # broker 2's old process is long gone
        listener = mpb.Listener(name="PLAINTEXT", host="h2", port=9092)
        request = cpb.RegisterBrokerRequest(
            broker_id=2, incarnation_id=bytes(range(16)), listeners=[listener]
        )
        first = await service.RegisterBroker(request, None)  # type: ignore[arg-type]
        assert first.header.error == cpb.REQUEST_TIMED_OUT
        assert 2 not in service.sessions
        second = await service.RegisterBroker(request, None)  # type: ignore[arg-type]
        assert second.header.error == cpb.NONE
        assert service.sessions[2].broker_epoch == second.broker_epoch
        assert controller.committed_image.brokers[2].incarnation_id == bytes(range(16))

    asyncio.run(asyncio.wait_for(main(), 30))


def test_elect_leaders_moves_leadership_to_the_preferred_replicas_named() -> None:
    async def main() -> None:
        image = cluster(partitions={0: ([1, 2], [1, 2], 2), 1: ([2, 1], [2, 1], 1)})
        controller = StandInController(image)
        service = ControllerService(controller, {1: "127.0.0.1:1"})  # type: ignore[arg-type]
        named = cpb.ElectLeadersRequest(
            partitions=[cpb.TopicPartitions(topic="orders", partitions=[0])]
        )
        answer = await service.ElectLeaders(named, None)  # type: ignore[arg-type]
        assert [(r.partition, r.error) for r in answer.partitions] == [(0, cpb.NONE)]
        partitions = controller.committed_image.topics[ORDERS].partitions
        assert (partitions[0].leader, partitions[1].leader) == (1, 1)
        every = await service.ElectLeaders(cpb.ElectLeadersRequest(), None)  # type: ignore[arg-type]
        assert [(r.partition, r.error) for r in every.partitions] == [(1, cpb.NONE)]
        assert controller.committed_image.topics[ORDERS].partitions[1].leader == 2
        unknown = cpb.ElectLeadersRequest(
            partitions=[
                cpb.TopicPartitions(topic="nope", partitions=[0]),
                cpb.TopicPartitions(topic="orders", partitions=[1]),
            ]
        )
        answered = await service.ElectLeaders(unknown, None)  # type: ignore[arg-type]
        assert answered.header.error == cpb.NONE  # each partition answered, as in Kafka
        assert [(r.topic, r.partition, r.error) for r in answered.partitions] == [
            ("nope", 0, cpb.UNKNOWN_TOPIC_OR_PARTITION),
            ("orders", 1, cpb.ELECTION_NOT_NEEDED),
        ]

    asyncio.run(asyncio.wait_for(main(), 30))


def test_elect_leaders_unclean_elects_an_out_of_sync_replica_and_refuses_unknown_types() -> None:
    async def main() -> None:
        # Partition 0's last ISR member (3) is fenced; replica 2 is alive and out of sync.
        image = cluster(partitions={0: ([3, 2], [3], -1), 1: ([1, 2], [1, 2], 1)}, fenced=[3])
        controller = StandInController(image)  # unclean election off: the request asks it
        service = ControllerService(controller, {1: "127.0.0.1:1"})  # type: ignore[arg-type]
        odd = cpb.ElectLeadersRequest(election_type=7)  # type: ignore[arg-type]
        refused = await service.ElectLeaders(odd, None)  # type: ignore[arg-type]
        assert refused.header.error == cpb.INVALID_REQUEST
        assert refused.header.message == "Unknown election type 7"
        every = cpb.ElectLeadersRequest(election_type=cpb.UNCLEAN)
        answer = await service.ElectLeaders(every, None)  # type: ignore[arg-type]
        assert [(r.partition, r.error) for r in answer.partitions] == [(0, cpb.NONE)]
        p = controller.committed_image.topics[ORDERS].partitions[0]
        assert (p.leader, p.isr) == (2, (2,))

    asyncio.run(asyncio.wait_for(main(), 30))


@pytest.mark.parametrize("enabled", [True, False])
def test_leader_rebalancing_is_scheduled_only_when_enabled(enabled: bool) -> None:
    controller = StandInController(cluster(), auto_leader_rebalance_enable=enabled)
    ControllerService(controller, {1: "127.0.0.1:1"})  # type: ignore[arg-type]
    assert ("rebalance" in controller.periodic) is enabled
    assert {"fence", "keep-alive"} <= set(controller.periodic)


def test_topics_and_partitions_beyond_max_cluster_partitions_are_policy_violation() -> None:
    """``max_cluster_partitions`` of the controller's config bounds CreateTopics (the
    default count included) and CreatePartitions, each refused POLICY_VIOLATION (Kafka's
    code 44, as for its own partition limit per request) with nothing written."""

    async def main() -> None:
        image = cluster(partitions={p: ([1], [1], 1) for p in range(2)})  # "orders": 2
        controller = StandInController(image, max_cluster_partitions=5)
        service = ControllerService(controller, {1: "127.0.0.1:1"})  # type: ignore[arg-type]

        async def create(name: str, partitions: int) -> Any:
            topic = cpb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1)
            request = cpb.CreateTopicsRequest(topics=[topic])
            answer = await service.CreateTopics(request, None)  # type: ignore[arg-type]
            assert answer.header.error == cpb.NONE
            (result,) = answer.topics
            return result

        assert (await create("fits", 3)).error == cpb.NONE  # 5 in all: the limit
        for name, partitions in (("over", 1), ("default", -1)):
            refused = await create(name, partitions)
            assert (refused.error, int(refused.error)) == (cpb.POLICY_VIOLATION, 44)
            assert "above its limit of 5" in refused.message
        grow = cpb.CreatePartitionsRequest(topics=[cpb.CreatePartitionsTopic(name="fits", count=4)])
        answer = await service.CreatePartitions(grow, None)  # type: ignore[arg-type]
        assert [t.error for t in answer.topics] == [cpb.POLICY_VIOLATION]
        assert controller.committed_image.partition_count() == 5
        assert set(controller.committed_image.topic_ids) == {"orders", "fits"}

    asyncio.run(asyncio.wait_for(main(), 30))


def leaders(controller: StandInController) -> list[int]:
    partitions = controller.committed_image.topics[ORDERS].partitions
    return [partitions[p].leader for p in sorted(partitions)]


def test_an_unfence_over_the_change_limit_elects_the_rest_in_later_bounded_decisions() -> None:
    """Broker 1 comes back as the last ISR member of 5 leaderless partitions, 2 changes per
    decision: the unfence elects 2, the leaderless duty 2 and then 1, and then stops
    writing."""

    async def main() -> None:
        image = cluster(partitions={p: ([1, 2], [1], -1) for p in range(5)}, fenced=[1])
        controller = StandInController(image)
        service = ControllerService(controller, {1: "127.0.0.1:1"})  # type: ignore[arg-type]
        service.partition_change_limit = 2
        controller.activate()
        await controller.periodic["leaderless"].run()  # the pass a takeover asks for: none
        assert leaders(controller) == [-1] * 5
        await heartbeat(service, controller.committed_image, 1)
        assert not controller.committed_image.brokers[1].fenced
        assert leaders(controller) == [1, 1, -1, -1, -1]
        await controller.periodic["leaderless"].run()
        assert leaders(controller) == [1, 1, 1, 1, -1]
        await controller.periodic["leaderless"].run()
        assert leaders(controller) == [1] * 5
        offset = controller.committed_offset
        await controller.periodic["leaderless"].run()  # not due any more: no decision
        assert controller.committed_offset == offset

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_new_active_controller_elects_leaderless_partitions_an_earlier_one_left() -> None:
    """An earlier controller unfenced broker 1 and stopped before electing all of its
    partitions: the duty is due from the moment this one becomes active, not before."""

    async def main() -> None:
        image = cluster(partitions={p: ([1, 2], [1], -1) for p in range(3)})
        controller = StandInController(image)
        ControllerService(controller, {1: "127.0.0.1:1"})  # type: ignore[arg-type]
        await controller.periodic["leaderless"].run()  # not active yet: nothing due
        assert leaders(controller) == [-1] * 3
        controller.activate()
        await controller.periodic["leaderless"].run()
        assert leaders(controller) == [1] * 3

    asyncio.run(asyncio.wait_for(main(), 30))


def test_allowing_unclean_election_elects_an_offline_partition_s_alive_replica_at_once() -> None:
    """Broker 1, the whole ISR, is dead; broker 2, out of sync, is alive. The operator's way
    out is unclean.leader.election.enable on the topic: once that change is committed, the
    leaderless duty elects broker 2 (Kafka's controller does so in its periodic unclean
    election); nothing else would elect it while broker 2 stays up."""

    async def main() -> None:
        image = cluster(partitions={0: ([1, 2], [1], -1)}, fenced=[1])
        controller = StandInController(image)
        service = ControllerService(controller, {1: "127.0.0.1:1"})  # type: ignore[arg-type]
        controller.activate()
        await controller.periodic["leaderless"].run()  # unclean election is off: none
        assert leaders(controller) == [-1]
        allow = cpb.AlterableConfig(name="unclean.leader.election.enable", op=cpb.SET, value="true")
        request = cpb.IncrementalAlterConfigsRequest(
            resources=[
                cpb.AlterConfigsResource(
                    resource_type=mpb.TOPIC, resource_name="orders", configs=[allow]
                )
            ]
        )
        answer = await service.IncrementalAlterConfigs(request, None)  # type: ignore[arg-type]
        assert [r.error for r in answer.resources] == [cpb.NONE]
        await controller.periodic["leaderless"].run()
        assert leaders(controller) == [2]
        assert controller.committed_image.partition(ORDERS, 0).isr == (2,)  # type: ignore[union-attr]

    asyncio.run(asyncio.wait_for(main(), 30))


def test_the_leaderless_duty_runs_anyway_every_recheck_interval() -> None:
    """A change no trigger saw (here written behind the service's back) is acted on at the
    next periodic pass, LEADERLESS_RECHECK_INTERVAL_S after the last."""

    async def main() -> None:
        image = cluster(partitions={0: ([1, 2], [1], -1)}, fenced=[1])
        controller = StandInController(image)
        ControllerService(controller, {1: "127.0.0.1:1"})  # type: ignore[arg-type]
        controller.activate()
        await controller.periodic["leaderless"].run()
        allow = rec.config(
            rec.ConfigResourceType.TOPIC, "orders", "unclean.leader.election.enable", "true"
        )
        controller.committed_image = replay(controller.committed_image, [allow])
        controller.now_ms += int(LEADERLESS_RECHECK_INTERVAL_S * 1000) - 1
        await controller.periodic["leaderless"].run()  # not due, and not yet time
        assert leaders(controller) == [-1]
        controller.now_ms += 1
        await controller.periodic["leaderless"].run()
        assert leaders(controller) == [2]

    asyncio.run(asyncio.wait_for(main(), 30))


class _Aborted(Exception):
    pass


class _Context:
    """What ``_serve`` uses of a gRPC servicer context: ``abort`` ends the RPC."""

    def __init__(self) -> None:
        self.aborted: tuple[Any, str] | None = None

    async def abort(self, code: Any, details: str) -> None:
        self.aborted = (code, details)
        raise _Aborted(details)


def test_requests_beyond_the_in_flight_bound_are_refused_resource_exhausted() -> None:
    """Requests waiting for their commits must leave the RPC slots the service shares with
    Raft: past the bound the next is refused RESOURCE_EXHAUSTED (the client retries), and
    once one completes another is taken."""
    import grpc

    async def main() -> None:
        controller = StandInController(cluster())
        service = ControllerService(  # type: ignore[arg-type]
            controller, {1: "127.0.0.1:1"}, max_in_flight_requests=1
        )
        release = asyncio.Event()
        write = controller.write

        async def slow_write(decide: Callable[[MetadataImage], Outcome[Any]]) -> tuple[Any, int]:
            await release.wait()
            return await write(decide)

        controller.write = slow_write  # type: ignore[method-assign]
        elect = cpb.ElectLeadersRequest()
        first = asyncio.create_task(service.ElectLeaders(elect, _Context()))  # type: ignore[arg-type]
        await asyncio.sleep(0)  # it is waiting in write
        context = _Context()
        with pytest.raises(_Aborted):
            await service.ElectLeaders(elect, context)  # type: ignore[arg-type]
        assert context.aborted is not None
        assert context.aborted[0] is grpc.StatusCode.RESOURCE_EXHAUSTED
        release.set()
        assert (await first).header.error == cpb.NONE
        again = await service.ElectLeaders(elect, _Context())  # type: ignore[arg-type]
        assert again.header.error == cpb.NONE

    asyncio.run(asyncio.wait_for(main(), 30))
