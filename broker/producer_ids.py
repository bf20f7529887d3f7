"""Producer ids for InitProducerId, handed out from blocks the active controller allocates.

How this works. The controller owns the producer-id space: ``AllocateProducerIds`` (broker
id and broker epoch in; the first id and the block's length out) commits a record that
moves the cluster's next id past the block, so no two brokers, and no two blocks, ever share
an id. This manager hands out the current block's ids one by one; once 90% of it is used it
asks for the next block in the background (as Kafka's RPCProducerIdManager does), so a
steady stream of InitProducerId rarely waits on the controller. When a block runs out before
the next one arrived, callers wait for that one request (they share it).

Errors. An answer with an error, an answer that makes no sense (an empty block, or one that
does not lie above the previous block), or no controller answering at all surface from
``next_id`` as typed errors carrying the Kafka code (``code``) of what went wrong. Kafka
answers InitProducerId with COORDINATOR_LOAD_IN_PROGRESS while it has no block, and clients
retry that; the handler may do the same for the ``retriable`` ones. A failed background
prefetch is logged and tried again when the block runs out (then its error is raised).

Concurrency: asyncio, one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from controller.client import ControllerUnavailable
from proto import controller_pb2 as cpb
from replication.errors import ReplicationError

__all__ = [
    "BrokerIdNotRegistered",
    "ControllerCaller",
    "ProducerIdBlock",
    "ProducerIdBlockError",
    "ProducerIdManager",
    "ProducerIdsExhausted",
    "ProducerIdsUnavailable",
    "StaleBrokerEpoch",
]

_log = logging.getLogger(__name__)

PREFETCH_AT = 0.9  # fraction of a block used when the next one is requested


class ControllerCaller(Protocol):
    """What the manager needs of ``controller.client.ControllerClient``."""

    async def call(self, method: str, request: Any) -> Any: ...


class ProducerIdBlockError(ReplicationError):
    """No producer id block could be had from the controller. Its subclasses name the
    common causes; for another controller error ``code`` is that error's code."""

    code = -1  # UNKNOWN_SERVER_ERROR

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class ProducerIdsUnavailable(ProducerIdBlockError):
    """No active controller answered in time (or it answered REQUEST_TIMED_OUT)."""

    code = 7  # REQUEST_TIMED_OUT
    retriable = True


class StaleBrokerEpoch(ProducerIdBlockError):
    """The controller knows this broker at another epoch (it is registering again)."""

    code = 77
    retriable = True


class BrokerIdNotRegistered(ProducerIdBlockError):
    code = 102
    retriable = True


class ProducerIdsExhausted(ProducerIdBlockError):
    """The controller has no ids left, or answered with a block that is not usable."""

    code = -1


_CONTROLLER_ERRORS: dict[int, type[ProducerIdBlockError]] = {
    cpb.REQUEST_TIMED_OUT: ProducerIdsUnavailable,
    cpb.STALE_BROKER_EPOCH: StaleBrokerEpoch,
    cpb.BROKER_ID_NOT_REGISTERED: BrokerIdNotRegistered,
}


class ProducerIdBlock(NamedTuple):
    first_id: int
    length: int

    @property
    def end_id(self) -> int:
        """One past the last id of the block."""
        return self.first_id + self.length


class ProducerIdManager:
    """Producer ids for ``broker_id`` from controller-allocated blocks (module doc).

    ``broker_epoch`` is read at each request: it changes when the broker registers again."""

    def __init__(
        self,
        broker_id: int,
        client: ControllerCaller,
        broker_epoch: Callable[[], int],
        *,
        prefetch_at: float = PREFETCH_AT,
    ) -> None:
        if not 0.0 < prefetch_at <= 1.0:
            raise ValueError(f"prefetch_at must lie in (0, 1], got {prefetch_at}")
        self._client = client
        self.broker_id = broker_id
        self._broker_epoch = broker_epoch
        self._prefetch_at = prefetch_at
        self._block: ProducerIdBlock | None = None
        self._next_id = 0
        self._prefetch_from = 0  # the id whose hand-out triggers the next block's request
        self._next_block: ProducerIdBlock | None = None
        self._request: asyncio.Task[None] | None = None
        self.blocks_requested = 0

    @property
    def current_block(self) -> ProducerIdBlock | None:
        return self._block

    async def next_id(self) -> int:
        """The next unused producer id; waits for a block from the controller if none is
        left. Raises a ``ProducerIdBlockError`` if the controller does not provide one."""
        while True:
            block = self._block
            if block is not None and self._next_id < block.end_id:
                producer_id = self._next_id
                self._next_id += 1
                if producer_id >= self._prefetch_from and self._next_block is None:
                    self._request_block()
                return producer_id
            if self._next_block is not None:
                self._install(self._next_block)
                continue
            # Shielded: one caller giving up must not cancel the request the others share.
            # On success the request has stored its block in ``_next_block``.
            await asyncio.shield(self._request_block())

    async def close(self) -> None:
        """Cancel a request in flight (broker shutdown)."""
        request, self._request = self._request, None
        if request is not None:
            request.cancel()
            with contextlib.suppress(asyncio.CancelledError, ReplicationError):
                await request

    # -- internals ---------------------------------------------------------------------------
    def _install(self, block: ProducerIdBlock) -> None:
        self._block, self._next_block = block, None
        self._next_id = block.first_id
        used = min(max(1, math.ceil(block.length * self._prefetch_at)), block.length)
        self._prefetch_from = block.first_id + used - 1

    def _request_block(self) -> asyncio.Task[None]:
        """The request in flight, or a new one. Only one is ever in flight."""
        if self._request is None:
            self._request = asyncio.get_running_loop().create_task(
                self._fetch(), name=f"broker-{self.broker_id}-allocate-producer-ids"
            )
            self._request.add_done_callback(self._fetched)
        return self._request

    async def _fetch(self) -> None:
        try:
            block = await self._allocate()
            if self._next_block is None:  # (a request only starts without a next block)
                self._next_block = block
        finally:
            # Cleared as the request ends (not in a done callback, which runs a loop turn
            # later), so a caller arriving after a failure starts a new request.
            if self._request is asyncio.current_task():
                self._request = None

    def _fetched(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            # Logged here for a background prefetch nobody awaits; waiters get it raised.
            _log.warning("broker %d: no producer id block: %s", self.broker_id, task.exception())

    async def _allocate(self) -> ProducerIdBlock:
        self.blocks_requested += 1
        request = cpb.AllocateProducerIdsRequest(
            broker_id=self.broker_id, broker_epoch=self._broker_epoch()
        )
        try:
            response = await self._client.call("AllocateProducerIds", request)
        except ControllerUnavailable as e:
            raise ProducerIdsUnavailable(f"AllocateProducerIds: {e}") from e
        error = response.header.error
        if error != cpb.NONE:
            name = cpb.ErrorCode.Name(error) if error in cpb.ErrorCode.values() else str(error)
            message = f"AllocateProducerIds: {name}: {response.header.message}"
            kind = _CONTROLLER_ERRORS.get(error)
            raise kind(message) if kind is not None else ProducerIdBlockError(message, error)
        block = ProducerIdBlock(response.producer_id_start, response.producer_id_len)
        floor = self._floor()
        if block.first_id < 0 or block.length <= 0 or block.first_id < floor:
            raise ProducerIdsExhausted(
                f"AllocateProducerIds answered ids {block.first_id}..+{block.length}, "
                f"not a block above {floor}"
            )
        return block

    def _floor(self) -> int:
        """Every new block lies above the ids this manager has had already."""
        return max((b.end_id for b in (self._block, self._next_block) if b is not None), default=0)
