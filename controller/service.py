"""The controller's gRPC API (``proto/controller.proto``), served on every controller node.

How this works. Each RPC turns into one ``QuorumController.write`` of a pure decision
(controller.brokers, .elections, .topics, .configs) and answers once its records are
committed. The mapping of failures to the response header happens here, once:
``NotController`` → NOT_CONTROLLER with the active controller's id and address (a standby
answers every request so), ``DecisionError`` → its code and message, a commit that takes too
long → REQUEST_TIMED_OUT, anything else → UNKNOWN_SERVER_ERROR (and a logged traceback).

Broker sessions (last heartbeat, reported metadata offset, the offset a broker must reach to
be unfenced) are the active controller's memory, not metadata: they start afresh each time
this node becomes active, giving every unfenced broker a full session timeout (as Kafka
does; a new process for such a broker id registers once it has expired). A broker let go
by a controlled shutdown has no session any more. Four duties run while active: fencing
brokers whose session expired, preferred-leader rebalancing (for brokers above
``leader_imbalance_per_broker_percentage``), a NoOp record after
``metadata_max_idle_interval_ms`` without a commit, and electing leaderless partitions that
can have a leader: one decision elects at most ``elections.MAX_PARTITION_CHANGES``, so a
broker coming back as the last ISR member of more partitions than that gets the rest there,
a decision at a time; it runs after such an unfence, once on taking over (the previous
controller may have stopped in the middle of one), after a committed change of
``unclean.leader.election.enable`` (an operator allowing it for an offline partition whose
out-of-sync replicas are alive gets the election at once) and every
``LEADERLESS_RECHECK_INTERVAL_S`` otherwise (Kafka's periodic unclean election).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import grpc.aio

from controller import brokers, configs, elections, topics
from controller.brokers import BrokerSession
from controller.image import MetadataImage
from controller.outcome import DecisionError, Outcome
from controller.quorum import NotController, PeriodicTask, QuorumController
from controller.records import ConfigResourceType, MetadataRecord
from proto import controller_pb2 as cpb
from proto import controller_pb2_grpc
from proto import metadata_pb2 as mpb
from storage.config import LogConfig

__all__ = ["ControllerService"]

_log = logging.getLogger(__name__)
R = TypeVar("R")
Context = grpc.aio.ServicerContext[Any, Any]
FENCE_CHECK_INTERVAL_MS = 1000
# Requests decided and waiting for their commits at once; half the transport's default
# max_concurrent_rpcs, so that Raft always finds slots (a node passes half of its own).
DEFAULT_MAX_IN_FLIGHT_REQUESTS = 5_000
LEADERLESS_CHECK_INTERVAL_S = 0.1  # a pass when one is due (module doc), else nothing
# A pass anyway this long after the last (Kafka's unclean.leader.election.interval.ms).
LEADERLESS_RECHECK_INTERVAL_S = 300.0


class ControllerService(controller_pb2_grpc.ControllerServiceServicer):
    """Serves ``ControllerService`` for one controller node."""

    def __init__(
        self,
        controller: QuorumController,
        addresses: Mapping[int, str],
        log_defaults: LogConfig | None = None,
        max_in_flight_requests: int = DEFAULT_MAX_IN_FLIGHT_REQUESTS,
    ) -> None:
        self.controller = controller
        self.max_in_flight_requests = max_in_flight_requests  # then RESOURCE_EXHAUSTED
        self._in_flight = 0
        self.config = controller.config
        self.addresses = dict(addresses)  # controller id -> its controller listener
        self.log_defaults = log_defaults or LogConfig()
        self.topic_limits = topics.TopicLimits(
            max_cluster_partitions=self.config.max_cluster_partitions
        )
        self.sessions: dict[int, BrokerSession] = {}
        self._leaderless_due = False  # electing leaderless partitions may find some
        self._leaderless_checked_ms = controller.clock_ms()  # at the last pass or activation
        self.partition_change_limit = elections.MAX_PARTITION_CHANGES  # per unfence decision
        controller.on_activation(self._reset_sessions)
        timeout_ms = self.config.broker_session_timeout_ms
        interval_ms = min(FENCE_CHECK_INTERVAL_MS, max(1, timeout_ms // 3))
        # A fence check this long after the last one means this controller itself did not run
        # (its process paused or starved): see _fence_expired.
        self._stall_ms = interval_ms + timeout_ms // 2
        self._fence_checked_ms = controller.clock_ms()
        controller.add_periodic(PeriodicTask("fence", interval_ms / 1000, self._fence_expired))
        self._idle_since_offset = -1
        idle_s = self.config.metadata_max_idle_interval_ms / 1000
        controller.add_periodic(PeriodicTask("keep-alive", idle_s, self._keep_alive))
        if self.config.auto_leader_rebalance_enable:
            interval_s = float(self.config.leader_imbalance_check_interval_s)
            controller.add_periodic(PeriodicTask("rebalance", interval_s, self._rebalance))
        controller.add_periodic(
            PeriodicTask("leaderless", LEADERLESS_CHECK_INTERVAL_S, self._elect_leaderless)
        )

    def register(self, server: grpc.aio.Server) -> None:
        controller_pb2_grpc.add_ControllerServiceServicer_to_server(self, server)

    # -- brokers -------------------------------------------------------------------------
    async def RegisterBroker(
        self, request: cpb.RegisterBrokerRequest, context: Context
    ) -> cpb.RegisterBrokerResponse:
        now, timeout = self.controller.clock_ms(), self.config.broker_session_timeout_ms

        def decide(image: MetadataImage) -> Outcome[cpb.RegisterBrokerResponse]:
            return brokers.register_broker(image, request, self.sessions, now, timeout)

        async def committed(response: cpb.RegisterBrokerResponse, offset: int) -> None:
            if response.header.error != cpb.NONE:
                return  # partitions moved, nothing registered: the broker asks again
            session = self.sessions.get(request.broker_id)
            if session is None or session.broker_epoch != response.broker_epoch:
                # Heartbeats report an end offset (everything below it applied): caught up
                # means the registration record at ``offset`` is applied too.
                self.sessions[request.broker_id] = BrokerSession(
                    request.broker_id, response.broker_epoch, now, -1, offset + 1
                )

        return await self._serve(context, cpb.RegisterBrokerResponse, decide, committed)

    async def BrokerHeartbeat(
        self, request: cpb.BrokerHeartbeatRequest, context: Context
    ) -> cpb.BrokerHeartbeatResponse:
        now = self.controller.clock_ms()
        session = self.sessions.get(request.broker_id)
        unclean = self.config.unclean_leader_election_enable

        def decide(image: MetadataImage) -> Outcome[cpb.BrokerHeartbeatResponse]:
            committed_offset = self.controller.committed_offset
            limit = self.partition_change_limit
            outcome = brokers.broker_heartbeat(
                image, request, session, committed_offset, now, unclean=unclean, limit=limit
            )
            if not outcome.response.is_fenced and elections.hit_limit(outcome.records, limit):
                self._leaderless_due = True  # an unfence that did not elect them all
            return outcome

        async def committed(response: cpb.BrokerHeartbeatResponse, offset: int) -> None:
            current = self.sessions.get(request.broker_id)
            if response.should_shut_down:
                self.sessions.pop(request.broker_id, None)  # let go: a restart may register
            elif current is not None and current.broker_epoch == request.broker_epoch:
                self.sessions[request.broker_id] = current.touched(now, request.metadata_offset)
            elif current is None or current.broker_epoch < request.broker_epoch:
                # A broker fenced when this controller became active has no session yet
                # (``_reset_sessions``); the heartbeat was decided on its current
                # registration, so it opens one: once unfenced, its silence must expire.
                self.sessions[request.broker_id] = BrokerSession(
                    request.broker_id,
                    request.broker_epoch,
                    now,
                    request.metadata_offset,
                    self.controller.committed_offset,
                )

        return await self._serve(context, cpb.BrokerHeartbeatResponse, decide, committed)

    async def AlterPartition(
        self, request: cpb.AlterPartitionRequest, context: Context
    ) -> cpb.AlterPartitionResponse:
        return await self._serve(
            context,
            cpb.AlterPartitionResponse,
            lambda image: elections.alter_partition(image, request),
        )

    async def ElectLeaders(
        self, request: cpb.ElectLeadersRequest, context: Context
    ) -> cpb.ElectLeadersResponse:
        """ElectLeaders of the type asked (another: INVALID_REQUEST "Unknown election
        type", as Kafka's controller refuses it), one answer per partition named (an
        unknown topic's partitions: UNKNOWN_TOPIC_OR_PARTITION, as in Kafka)."""
        elect = {
            cpb.PREFERRED: elections.elect_preferred_leaders,
            cpb.UNCLEAN: elections.elect_unclean_leaders,
        }.get(request.election_type)
        wanted = [(tp.topic, p) for tp in request.partitions for p in tp.partitions]

        def decide(image: MetadataImage) -> Outcome[cpb.ElectLeadersResponse]:
            if elect is None:
                message = f"Unknown election type {request.election_type}"
                raise DecisionError(cpb.INVALID_REQUEST, message)
            outcome = elect(image, wanted if request.partitions else None)
            results = [
                cpb.PartitionResult(
                    topic=r.topic,
                    partition=r.partition,
                    error=configs.as_error_code(r.error),
                    message=r.message,
                )
                for r in outcome.response
            ]
            return Outcome(outcome.records, cpb.ElectLeadersResponse(partitions=results))

        return await self._serve(context, cpb.ElectLeadersResponse, decide)

    # -- topics and configs --------------------------------------------------------------
    async def CreateTopics(
        self, request: cpb.CreateTopicsRequest, context: Context
    ) -> cpb.CreateTopicsResponse:
        def decide(image: MetadataImage) -> Outcome[cpb.CreateTopicsResponse]:
            return topics.create_topics(
                image,
                request,
                defaults=topics.TopicDefaults(
                    self.config.num_partitions, self.config.default_replication_factor
                ),
                new_topic_id=lambda: os.urandom(16),
                placement_start=int.from_bytes(os.urandom(2), "big"),
                limits=self.topic_limits,
                log_defaults=self.log_defaults,
            )

        return await self._serve(context, cpb.CreateTopicsResponse, decide)

    async def DeleteTopics(
        self, request: cpb.DeleteTopicsRequest, context: Context
    ) -> cpb.DeleteTopicsResponse:
        return await self._serve(
            context, cpb.DeleteTopicsResponse, lambda image: topics.delete_topics(image, request)
        )

    async def CreatePartitions(
        self, request: cpb.CreatePartitionsRequest, context: Context
    ) -> cpb.CreatePartitionsResponse:
        start = int.from_bytes(os.urandom(2), "big")
        return await self._serve(
            context,
            cpb.CreatePartitionsResponse,
            lambda image: topics.create_partitions(
                image, request, placement_start=start, limits=self.topic_limits
            ),
        )

    async def IncrementalAlterConfigs(
        self, request: cpb.IncrementalAlterConfigsRequest, context: Context
    ) -> cpb.IncrementalAlterConfigsResponse:
        async def committed(response: cpb.IncrementalAlterConfigsResponse, offset: int) -> None:
            if any(
                c.name == elections.UNCLEAN_CONFIG for r in request.resources for c in r.configs
            ):
                self._leaderless_due = True  # it may allow electing an offline partition now

        return await self._serve(
            context,
            cpb.IncrementalAlterConfigsResponse,
            lambda image: configs.incremental_alter_configs(image, request, self.log_defaults),
            committed,
        )

    async def AllocateProducerIds(
        self, request: cpb.AllocateProducerIdsRequest, context: Context
    ) -> cpb.AllocateProducerIdsResponse:
        return await self._serve(
            context,
            cpb.AllocateProducerIdsResponse,
            lambda image: configs.allocate_producer_ids(image, request),
        )

    async def DescribeCluster(
        self, request: cpb.DescribeClusterRequest, context: Context
    ) -> cpb.DescribeClusterResponse:
        def decide(image: MetadataImage) -> Outcome[cpb.DescribeClusterResponse]:
            committed = self.controller.committed_image
            offsets = {b: s.metadata_offset for b, s in self.sessions.items()}
            response = configs.describe_cluster(
                committed, offsets, self.controller.node.epoch, self.controller.committed_offset
            )
            return Outcome((), response)

        return await self._serve(context, cpb.DescribeClusterResponse, decide)

    async def DescribeTopics(
        self, request: cpb.DescribeTopicsRequest, context: Context
    ) -> cpb.DescribeTopicsResponse:
        def decide(image: MetadataImage) -> Outcome[cpb.DescribeTopicsResponse]:
            return Outcome((), describe_topics(self.controller.committed_image, request.names))

        return await self._serve(context, cpb.DescribeTopicsResponse, decide)

    # -- the mapping of failures, once -----------------------------------------------------
    async def _serve(
        self,
        context: Context,
        response_type: Callable[..., R],
        decide: Callable[[MetadataImage], Outcome[R]],
        committed: Callable[[R, int], Awaitable[None]] | None = None,
    ) -> R:
        if self._in_flight >= self.max_in_flight_requests:
            # Beyond it, requests waiting for their commits could take every RPC slot of the
            # server they share with Raft, whose Sends would then be refused and nothing
            # would commit. RESOURCE_EXHAUSTED: the client retries after a backoff.
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the active controller has {self._in_flight} requests in flight; try again",
            )
        self._in_flight += 1
        try:
            return await self._decide_and_answer(response_type, decide, committed)
        finally:
            self._in_flight -= 1

    async def _decide_and_answer(
        self,
        response_type: Callable[..., R],
        decide: Callable[[MetadataImage], Outcome[R]],
        committed: Callable[[R, int], Awaitable[None]] | None,
    ) -> R:
        try:
            response, offset = await self.controller.write(decide)
        except NotController as e:
            return response_type(header=self._not_controller(e.leader_id))
        except DecisionError as e:
            error = configs.as_error_code(e.code)
            return response_type(header=cpb.ResponseHeader(error=error, message=e.message))
        except TimeoutError:
            message = "the change was not committed in time; it may still be"
            return response_type(
                header=cpb.ResponseHeader(error=cpb.REQUEST_TIMED_OUT, message=message)
            )
        except Exception as e:  # a bug: answer, log loudly, keep serving
            _log.exception("controller %d: request failed", self.controller.node_id)
            header = cpb.ResponseHeader(error=cpb.UNKNOWN_SERVER_ERROR, message=repr(e))
            return response_type(header=header)
        if committed is not None:
            await committed(response, offset)
        if response.header.error == cpb.NONE:  # type: ignore[attr-defined]
            # A decision may answer an error with records to commit (a registration that
            # moved partitions first): its header stays.
            response.header.CopyFrom(cpb.ResponseHeader(error=cpb.NONE))  # type: ignore[attr-defined]
        return response

    def _not_controller(self, leader_id: int) -> cpb.ResponseHeader:
        return cpb.ResponseHeader(
            error=cpb.NOT_CONTROLLER,
            message=f"node {self.controller.node_id} is not the active controller",
            controller_id=leader_id,
            controller_address=self.addresses.get(leader_id, ""),
        )

    # -- duties of the active controller ---------------------------------------------------
    def _reset_sessions(self) -> None:
        self._leaderless_due = True  # the last controller may have stopped in the middle
        self._leaderless_checked_ms = self._fence_checked_ms = self.controller.clock_ms()
        now, offset = self.controller.clock_ms(), self.controller.committed_offset
        image = self.controller.committed_image
        self.sessions = {  # a fenced broker's session opens with its next heartbeat
            b: BrokerSession(b, reg.broker_epoch, now, -1, offset)
            for b, reg in image.brokers.items()
            if not reg.fenced
        }

    async def _fence_expired(self) -> None:
        """Fence the brokers whose sessions expired. If this check comes more than
        ``_stall_ms`` after the last one, this controller did not run meanwhile (SIGSTOP, a
        starved process): the heartbeats that arrived are still unread, and every broker
        would look dead at once (a 5 s pause once fenced all three brokers of a test
        cluster). It cannot tell dead brokers from its own absence, so every session is
        moved on by the time it was away, and a broker dead before it is fenced when its
        remaining time runs out. The time is taken from the end of the last check, so a
        decision slow to commit does not count as time away."""
        now, timeout = self.controller.clock_ms(), self.config.broker_session_timeout_ms
        away = now - self._fence_checked_ms
        if away > self._stall_ms:
            self.sessions = {  # one heard since it resumed is not moved past now
                b: replace(s, last_heartbeat_ms=min(s.last_heartbeat_ms + away, now))
                for b, s in self.sessions.items()
            }
            _log.warning(
                "controller %d did not run for %d ms: broker sessions moved on by that much",
                self.controller.node_id,
                away,
            )
        unclean = self.config.unclean_leader_election_enable
        try:
            fenced, _ = await self.controller.write(
                lambda image: brokers.fence_expired_brokers(
                    image, self.sessions, now, timeout, unclean
                )
            )
        finally:
            self._fence_checked_ms = self.controller.clock_ms()
        if fenced:
            _log.warning("controller: fenced brokers %s: no heartbeat for %d ms", fenced, timeout)

    async def _rebalance(self) -> None:
        percentage = self.config.leader_imbalance_per_broker_percentage
        await self.controller.write(
            lambda image: Outcome(tuple(elections.rebalance_leaders(image, percentage)), None)
        )

    async def _elect_leaderless(self) -> None:
        now_ms = self.controller.clock_ms()
        recheck_ms = LEADERLESS_RECHECK_INTERVAL_S * 1000
        if not self._leaderless_due and now_ms - self._leaderless_checked_ms < recheck_ms:
            return
        self._leaderless_checked_ms = now_ms
        unclean, limit = self.config.unclean_leader_election_enable, self.partition_change_limit

        def decide(image: MetadataImage) -> Outcome[bool]:
            records = elections.elect_leaderless(image, unclean, limit)
            return Outcome(tuple(records), elections.hit_limit(records, limit))

        self._leaderless_due = False  # a heartbeat may set it again while this commits
        try:
            more, _ = await self.controller.write(decide)
        except BaseException:
            self._leaderless_due = True  # not done: the next pass tries again
            raise
        if more:
            self._leaderless_due = True
            _log.info(
                "controller %d: electing leaderless partitions, more to come",
                self.controller.node_id,
            )

    async def _keep_alive(self) -> None:
        """A NoOp when nothing was committed for a whole interval: the log (and the offsets
        brokers report) keeps moving, and a leader that lost its quorum finds out."""
        offset = self.controller.committed_offset
        if offset == self._idle_since_offset:
            noop = MetadataRecord(no_op=mpb.NoOpRecord())
            await self.controller.write(lambda image: Outcome((noop,), None))
        self._idle_since_offset = self.controller.committed_offset


def describe_topics(image: MetadataImage, names: Sequence[str]) -> cpb.DescribeTopicsResponse:
    """The committed state of ``names`` (every topic when empty), by name."""
    response = cpb.DescribeTopicsResponse()
    for name in sorted(set(names) if names else image.topic_ids):
        described = response.topics.add(name=name)
        topic = image.topic_by_name(name)
        if topic is None:
            described.error = cpb.UNKNOWN_TOPIC_OR_PARTITION
            continue
        described.topic_id = topic.topic_id
        described.partitions.extend(
            elections.partition_record(topic.partitions[i]) for i in sorted(topic.partitions)
        )
        entries = image.configs.get((int(ConfigResourceType.TOPIC), name), {})
        for key in sorted(entries):
            described.configs.add(name=key, value=entries[key])
    return response
