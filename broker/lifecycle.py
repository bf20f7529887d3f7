"""A broker's life in the cluster, as the active controller sees it: register, catch up on
the metadata log, get unfenced, run, and shut down under control (KIP-631).

How this works. The broker replicates the metadata log as a Raft observer (its ``RaftNode``
is not a voter) into a ``MetadataStateMachine``; this class talks to the active controller
through a ``ControllerClient``:

1. ``start`` registers (a new incarnation id each process start) and gets a broker epoch;
   the broker is fenced.
2. A heartbeat every ``heartbeat_interval_ms`` reports the metadata offset the broker has
   applied; once it has caught up the controller unfences it: the broker is RUNNING. While
   fenced it heartbeats every ``FENCED_HEARTBEAT_INTERVAL_MS`` instead, so it is unfenced
   about that soon after it has caught up (Kafka's broker heartbeats every 10 ms until it
   has caught up). With the plain interval a starting broker, whose first heartbeat comes
   right after registration and before its metadata caught up, stayed fenced for a whole
   interval (2 s by default) of every start.
3. ``shutdown`` asks for a controlled shutdown: heartbeats say ``want_shutdown`` until the
   controller has moved every leadership away and answers ``should_shut_down`` (or the time
   limit passes), then the broker stops.

An answer of STALE_BROKER_EPOCH or BROKER_ID_NOT_REGISTERED (the controller lost or replaced
the registration) makes it register again. Registration itself is retried with backoff while
the answer is DUPLICATE_BROKER_REGISTRATION: after a restart, the previous process's session
must expire first (``broker_session_timeout_ms``), as in Kafka. Errors reaching the
controller are retried by the client; a heartbeat that fails altogether is logged and the
next one tries again: the controller fences a broker it has not heard from for its session
timeout. A heartbeat's attempts are short (``HEARTBEAT_ATTEMPT_INTERVALS`` intervals), so
one sent to a paused controller moves on to the next active one within the session timeout
that controller starts counting when it takes over.

Each time the committed image changes, the partitions this broker leads and follows (with
their epochs) go to the ``on_partitions`` callbacks: the hook that replication turns into
become-leader / become-follower.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from controller.client import ControllerClient, ControllerUnavailable
from controller.image import MetadataImage, PartitionState
from controller.state_machine import MetadataStateMachine
from proto import controller_pb2 as cpb
from proto import metadata_pb2 as mpb
from raft.driver import RaftNode

__all__ = ["BrokerLifecycle", "BrokerState", "PartitionAssignment"]

_log = logging.getLogger(__name__)
INCARNATION_ID_BYTES = 16
_REREGISTER = frozenset({cpb.STALE_BROKER_EPOCH, cpb.BROKER_ID_NOT_REGISTERED})
_RETRY_REGISTRATION = frozenset(
    {cpb.DUPLICATE_BROKER_REGISTRATION, cpb.REQUEST_TIMED_OUT, cpb.UNKNOWN_SERVER_ERROR}
)
REGISTER_TIMEOUT_S = 120.0  # beyond a session timeout (9 s by default) with room to spare
# One heartbeat attempt waits at most this many heartbeat intervals (and this long at least):
# a paused controller must not hold a heartbeat past the session timeout the next active
# controller counts from its start (Kafka's controller requests time out after 2 s too).
HEARTBEAT_ATTEMPT_INTERVALS = 2
HEARTBEAT_ATTEMPT_MIN_MS = 1_000
REGISTER_BACKOFF_S = 0.2
FENCED_HEARTBEAT_INTERVAL_MS = 50  # the heartbeat interval while fenced, at most
REGISTER_BACKOFF_MAX_S = 2.0


class BrokerState(enum.Enum):
    STARTING = "starting"  # not registered yet
    FENCED = "fenced"  # registered, catching up (or fenced by the controller)
    RUNNING = "running"  # unfenced
    SHUTTING_DOWN = "shutting-down"  # controlled shutdown asked for
    STOPPED = "stopped"


PartitionKey = tuple[bytes, int]  # (topic id, partition id)


@dataclass(frozen=True, slots=True)
class PartitionAssignment:
    """What this broker holds, from one image: partitions it leads and partitions it
    follows, each with its current state (leader and partition epochs)."""

    offset: int
    leading: Mapping[PartitionKey, PartitionState]
    following: Mapping[PartitionKey, PartitionState]


class BrokerLifecycle:
    """One broker's registration, heartbeats and shutdown. Use from the node's event loop."""

    def __init__(
        self,
        broker_id: int,
        listeners: Sequence[mpb.Listener],
        rack: str | None,
        client: ControllerClient,
        node: RaftNode,
        machine: MetadataStateMachine,
        heartbeat_interval_ms: int,
    ) -> None:
        self.broker_id = broker_id
        self.incarnation_id = os.urandom(INCARNATION_ID_BYTES)
        self.listeners = list(listeners)
        self.rack = rack
        self.client = client
        self.node = node
        self.machine = machine
        self.heartbeat_interval_s = heartbeat_interval_ms / 1000
        attempt_ms = max(
            HEARTBEAT_ATTEMPT_MIN_MS, HEARTBEAT_ATTEMPT_INTERVALS * heartbeat_interval_ms
        )
        self.heartbeat_policy = dataclasses.replace(client.policy, rpc_timeout_ms=attempt_ms)
        self.state = BrokerState.STARTING
        self.broker_epoch = -1
        self._callbacks: list[Callable[[PartitionAssignment], None]] = []
        self._last_image: MetadataImage | None = None
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    def on_partitions(self, callback: Callable[[PartitionAssignment], None]) -> None:
        self._callbacks.append(callback)

    async def start(self) -> None:
        """Register, then heartbeat in the background."""
        await self._register()
        self._task = asyncio.get_running_loop().create_task(
            self._heartbeats(), name=f"broker-{self.broker_id}-heartbeats"
        )

    async def wait_for(self, state: BrokerState, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while self.state is not state:
                self._changed.clear()
                await self._changed.wait()

    async def shutdown(self, timeout_s: float) -> bool:
        """Controlled shutdown; True if the controller let the broker go in time."""
        self._set_state(BrokerState.SHUTTING_DOWN)
        released = False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while not released:
                    response = await self._heartbeat(want_shutdown=True)
                    released = response is not None and response.should_shut_down
                    if not released:
                        await asyncio.sleep(min(self.heartbeat_interval_s, 0.1))
        await self.close()
        return released

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._set_state(BrokerState.STOPPED)

    # -- internals -------------------------------------------------------------------------
    async def _register(self) -> None:
        """Register, retrying what may pass: a previous process's session that has not
        expired yet (DUPLICATE_BROKER_REGISTRATION, after a restart) or a slow commit."""
        request = cpb.RegisterBrokerRequest(
            broker_id=self.broker_id,
            incarnation_id=self.incarnation_id,
            listeners=self.listeners,
            rack=self.rack or "",
        )
        backoff_s = REGISTER_BACKOFF_S
        async with asyncio.timeout(REGISTER_TIMEOUT_S):
            while True:
                response = await self.client.call("RegisterBroker", request)
                error = response.header.error
                if error == cpb.NONE:
                    break
                name = cpb.ErrorCode.Name(error)
                if error not in _RETRY_REGISTRATION:
                    raise RuntimeError(
                        f"broker {self.broker_id}: {name}: {response.header.message}"
                    )
                _log.info(
                    "broker %d: %s; registering again in %.1f s", self.broker_id, name, backoff_s
                )
                await asyncio.sleep(backoff_s)
                backoff_s = min(2 * backoff_s, REGISTER_BACKOFF_MAX_S)
        self.broker_epoch = response.broker_epoch
        self._set_state(BrokerState.FENCED)
        _log.info("broker %d registered with epoch %d", self.broker_id, self.broker_epoch)

    async def _heartbeats(self) -> None:
        fenced_interval_s = min(self.heartbeat_interval_s, FENCED_HEARTBEAT_INTERVAL_MS / 1000)
        while True:
            await self._heartbeat(want_shutdown=False)
            self._publish_partitions()
            fenced = self.state is BrokerState.FENCED
            await asyncio.sleep(fenced_interval_s if fenced else self.heartbeat_interval_s)

    async def _heartbeat(self, want_shutdown: bool) -> cpb.BrokerHeartbeatResponse | None:
        request = cpb.BrokerHeartbeatRequest(
            broker_id=self.broker_id,
            broker_epoch=self.broker_epoch,
            metadata_offset=self.node.applied_end,
            want_shutdown=want_shutdown,
        )
        try:
            response: cpb.BrokerHeartbeatResponse = await self.client.call(
                "BrokerHeartbeat", request, self.heartbeat_policy
            )
        except ControllerUnavailable as e:
            _log.warning("broker %d: heartbeat failed: %s", self.broker_id, e)
            return None
        error = response.header.error
        if error in _REREGISTER:
            _log.warning("broker %d: %s; registering again", self.broker_id, error)
            await self._register()
            return None
        if error != cpb.NONE:
            _log.warning("broker %d: heartbeat refused: %s", self.broker_id, response.header)
            return None
        if self.state is not BrokerState.SHUTTING_DOWN:
            running = not response.is_fenced
            self._set_state(BrokerState.RUNNING if running else BrokerState.FENCED)
        return response

    def _set_state(self, state: BrokerState) -> None:
        if state is not self.state:
            _log.info("broker %d: %s -> %s", self.broker_id, self.state.value, state.value)
            self.state = state
        self._changed.set()

    def _publish_partitions(self) -> None:
        image = self.machine.image
        if image is self._last_image or not self._callbacks:
            return
        self._last_image = image
        assignment = assignment_of(image, self.broker_id)
        for callback in self._callbacks:
            callback(assignment)


def assignment_of(image: MetadataImage, broker_id: int) -> PartitionAssignment:
    leading: dict[PartitionKey, PartitionState] = {}
    following: dict[PartitionKey, PartitionState] = {}
    for topic_id, topic in image.topics.items():
        for partition_id, p in topic.partitions.items():
            if p.leader == broker_id:
                leading[(topic_id, partition_id)] = p
            elif broker_id in p.replicas:
                following[(topic_id, partition_id)] = p
    return PartitionAssignment(image.offset, leading, following)
