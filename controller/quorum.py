"""The controller on a controller node: a standby that replays the metadata log, and, while its
Raft node leads, the active controller that decides and commits changes.

How this works. Every controller node runs a ``RaftNode`` whose state machine is a
``MetadataStateMachine``: committed records become the committed image on every node, so a
standby is always hot. When this node's Raft node becomes leader, the controller first waits
for the read barrier (every record of earlier epochs applied), then becomes active: it starts
its broker sessions afresh (every registered broker gets a full session timeout from now) and
its periodic duties (fencing brokers whose session expired, preferred-leader rebalancing).

A change runs through ``write(decide)``. ``decide`` is a pure function of an image (see
``controller.outcome``); it runs against the *speculative* image: the committed image plus
every record this controller has proposed and not yet seen committed, so each decision sees
all decisions before it (KRaft keeps the same with its timeline snapshots). Deciding and
proposing happen without yielding to the event loop, so decisions are ordered exactly as
their records are in the log; the caller then waits for the commit, which is what lets many
requests be in flight at once. When leadership goes, Raft fails the waiting proposals
(``NotController`` for the callers) and the speculative image is dropped; when no proposal is
in flight the speculative image is the committed one again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from controller.config import ControllerConfig
from controller.image import MetadataDelta, MetadataImage
from controller.outcome import DecisionError, Outcome
from controller.records import encode
from controller.state_machine import MetadataStateMachine
from proto import controller_pb2 as cpb
from raft.core import NotLeader, RecordTooLarge
from raft.driver import RaftNode

__all__ = ["NotController", "PeriodicTask", "QuorumController"]

_log = logging.getLogger(__name__)
R = TypeVar("R")

COMMIT_TIMEOUT_S = 30.0  # a change not committed by then is answered REQUEST_TIMED_OUT
ACTIVATION_TIMEOUT_S = 30.0


class NotController(Exception):
    """This node is not the active controller; ``leader_id`` is the one it knows (-1: none)."""

    def __init__(self, leader_id: int, epoch: int) -> None:
        super().__init__(f"not the active controller; the Raft leader is {leader_id}")
        self.leader_id = leader_id
        self.epoch = epoch


@dataclass(frozen=True, slots=True)
class PeriodicTask:
    """A duty the active controller runs every ``interval_s`` while active."""

    name: str
    interval_s: float
    run: Callable[[], Coroutine[Any, Any, None]]


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class QuorumController:
    """One controller node's controller. Use from the node's event loop."""

    def __init__(
        self,
        node: RaftNode,
        machine: MetadataStateMachine,
        config: ControllerConfig,
        clock_ms: Callable[[], int] = monotonic_ms,
    ) -> None:
        self.node = node
        self.machine = machine
        self.config = config
        self.clock_ms = clock_ms
        self.node_id = node.config.node_id
        self._active_epoch: int | None = None
        self._speculative: MetadataImage | None = None
        self._in_flight = 0
        self._last_proposal: asyncio.Future[int] | None = None
        self._periodic: list[PeriodicTask] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._activation: asyncio.Task[None] | None = None
        self._activated: list[Callable[[], None]] = []
        node.add_leader_listener(self._on_leader_change)

    # -- state ---------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self._active_epoch is not None

    @property
    def committed_image(self) -> MetadataImage:
        return self.machine.image

    @property
    def committed_offset(self) -> int:
        """Every record below this Raft offset is applied to the committed image."""
        return self.node.applied_end

    def add_periodic(self, task: PeriodicTask) -> None:
        self._periodic.append(task)

    def on_activation(self, callback: Callable[[], None]) -> None:
        """``callback()`` each time this node becomes the active controller (before any
        request is served in its epoch); for session state kept beside the image."""
        self._activated.append(callback)

    def check_active(self) -> None:
        if self._active_epoch is None or self._active_epoch != self.node.epoch:
            raise NotController(self.node.leader_id, self.node.epoch)

    # -- changes -------------------------------------------------------------------------
    async def write(self, decide: Callable[[MetadataImage], Outcome[R]]) -> tuple[R, int]:
        """Decide against the speculative image, commit the records, return the answer and
        the commit offset. An answer that writes nothing (or an error) may still rest on
        records in flight, such as a heartbeat that sees the fence an earlier heartbeat
        proposed: it is given once those are committed.
        Raises NotController, DecisionError (nothing written), or TimeoutError."""
        self.check_active()
        try:
            outcome = decide(self._image())
        except DecisionError:
            await self._in_flight_committed()
            raise
        if not outcome.records:
            await self._in_flight_committed()
            return outcome.response, self.committed_offset
        future = self._propose(outcome)
        self._last_proposal = future
        self._in_flight += 1
        try:
            offset = await self._committed(future)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._speculative = None  # the committed image has caught up
        return outcome.response, offset

    async def _in_flight_committed(self) -> None:
        pending = self._last_proposal
        if pending is not None and not pending.done():
            await self._committed(asyncio.shield(pending))

    @staticmethod
    async def _committed(future: Awaitable[int]) -> int:
        try:
            async with asyncio.timeout(COMMIT_TIMEOUT_S):
                return await future
        except NotLeader as e:
            raise NotController(e.leader_id, e.epoch) from None

    def _image(self) -> MetadataImage:
        return self._speculative if self._speculative is not None else self.machine.image

    def _propose(self, outcome: Outcome[Any]) -> asyncio.Future[int]:
        image = self._image()
        delta = MetadataDelta(image)
        for i, record in enumerate(outcome.records):  # offsets only need to increase here
            delta.replay(record, image.offset + 1 + i)
        try:
            future = self.node.submit([encode(record) for record in outcome.records])
        except NotLeader as e:
            raise NotController(e.leader_id, e.epoch) from None
        except RecordTooLarge as e:  # nothing queued: the request is refused as a whole
            raise DecisionError(
                cpb.INVALID_REQUEST, f"a metadata record is too large: {e}"
            ) from None
        self._speculative = delta.apply()
        return future

    # -- leadership ----------------------------------------------------------------------
    def _on_leader_change(self, epoch: int, leader_id: int) -> None:
        self._deactivate()
        if leader_id == self.node_id:
            self._activation = asyncio.get_running_loop().create_task(
                self._activate(epoch), name=f"controller-{self.node_id}-activate"
            )

    async def _activate(self, epoch: int) -> None:
        try:
            await self.node.read_barrier(ACTIVATION_TIMEOUT_S)
        except (NotLeader, TimeoutError) as e:
            _log.warning("controller %d: not activated in epoch %d: %r", self.node_id, epoch, e)
            return
        if self.node.epoch != epoch or self.node.leader_id != self.node_id:
            return
        self._active_epoch, self._speculative = epoch, None
        for callback in self._activated:
            callback()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._every(task), name=f"controller-{self.node_id}-{task.name}")
            for task in self._periodic
        ]
        _log.info("controller %d: active in epoch %d", self.node_id, epoch)

    def _deactivate(self) -> None:
        if self._activation is not None:
            self._activation.cancel()
            self._activation = None
        if self._active_epoch is not None:
            _log.info("controller %d: no longer active", self.node_id)
        self._active_epoch, self._speculative = None, None
        for task in self._tasks:
            task.cancel()
        self._tasks = []

    async def _every(self, task: PeriodicTask) -> None:
        while True:
            await asyncio.sleep(task.interval_s)
            try:
                await task.run()
            except (NotController, TimeoutError, DecisionError) as e:
                _log.info("controller %d: %s skipped: %r", self.node_id, task.name, e)
            except Exception:  # a bug: say so loudly, and keep the duty running
                _log.exception("controller %d: %s failed", self.node_id, task.name)

    async def close(self) -> None:
        tasks = [t for t in (self._activation, *self._tasks) if t is not None]
        self._deactivate()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def not_controller_header(leader_id: int, address: str) -> cpb.ResponseHeader:
    return cpb.ResponseHeader(
        error=cpb.NOT_CONTROLLER,
        message=f"this node is not the active controller; try node {leader_id}",
        controller_id=leader_id,
        controller_address=address,
    )
