"""A client of the controller quorum's gRPC API, for brokers and admin tools.

How this works. The client knows every controller's address (``controller_quorum_voters``)
and remembers which one was active last. A call goes there first; an answer whose header
says NOT_CONTROLLER names the active controller (or nobody, during an election), and a
controller that cannot be reached is skipped, so the call moves on through the quorum,
waiting ``retry_backoff_ms`` (doubling up to ``retry_backoff_max_ms``) after each full round,
until ``timeout_ms`` is spent. Every other answer, error or not, goes back to the caller:
what to do about TOPIC_ALREADY_EXISTS is the caller's business. A call may bring its own
policy (a broker's heartbeats: short attempts, so that a paused controller does not hold
them past the session timeout). The channels try a controller they lost again within
``retry_backoff_max_ms`` as well: gRPC's own reconnect backoff grows to two minutes, and a
controller back after a long outage would otherwise stay unreachable (its brokers unheard,
and fenced) long after it answers.

A change whose answer was lost (the controller died after committing it) may be retried by
the caller and then be refused as already done (TOPIC_ALREADY_EXISTS): requests are not
deduplicated here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from proto import controller_pb2 as cpb
from proto import controller_pb2_grpc

__all__ = ["ControllerClient", "ControllerUnavailable", "RetryPolicy"]

_log = logging.getLogger(__name__)


class ControllerUnavailable(Exception):
    """No active controller answered within the call's time limit."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    timeout_ms: int = 30_000  # a whole call, retries included
    rpc_timeout_ms: int = 5_000  # one attempt
    retry_backoff_ms: int = 50
    retry_backoff_max_ms: int = 1_000

    def __post_init__(self) -> None:
        for name in self.__slots__:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


class ControllerClient:
    """Calls the active controller among ``controllers`` (node id -> host:port)."""

    def __init__(self, controllers: Mapping[int, str], policy: RetryPolicy | None = None) -> None:
        if not controllers:
            raise ValueError("a controller client needs at least one controller address")
        self.policy = policy or RetryPolicy()
        self._addresses = dict(controllers)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._active: int | None = None

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close(None)

    async def call(self, method: str, request: Any, policy: RetryPolicy | None = None) -> Any:
        """``method`` is the RPC's name (``"CreateTopics"``); returns its response message.
        ``policy`` overrides the client's for this call. Raises ControllerUnavailable when no
        active controller answered in time."""
        policy = policy or self.policy
        loop = asyncio.get_running_loop()
        deadline = loop.time() + policy.timeout_ms / 1000
        backoff_s = policy.retry_backoff_ms / 1000
        last = "no attempt"
        while loop.time() < deadline:
            for node_id in self._order():
                response, last = await self._attempt(node_id, method, request, deadline, policy)
                if response is not None:
                    return response
            await asyncio.sleep(min(backoff_s, max(0.0, deadline - loop.time())))
            backoff_s = min(2 * backoff_s, policy.retry_backoff_max_ms / 1000)
        raise ControllerUnavailable(f"{method}: no active controller answered ({last})")

    def _order(self) -> list[int]:
        others = sorted(i for i in self._addresses if i != self._active)
        return [self._active, *others] if self._active in self._addresses else others

    async def _attempt(
        self, node_id: int, method: str, request: Any, deadline: float, policy: RetryPolicy
    ) -> tuple[Any | None, str]:
        remaining = deadline - asyncio.get_running_loop().time()
        timeout = min(policy.rpc_timeout_ms / 1000, remaining)
        if timeout <= 0:
            return None, "timed out"
        stub = controller_pb2_grpc.ControllerServiceStub(self._channel(node_id))
        try:
            response = await getattr(stub, method)(request, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            return None, f"node {node_id}: {e.code().name}"
        header: cpb.ResponseHeader = response.header
        if header.error != cpb.NOT_CONTROLLER:
            self._active = node_id
            return response, ""
        self._active = header.controller_id if header.controller_id >= 0 else None
        if self._active is not None and header.controller_address:
            self._addresses.setdefault(self._active, header.controller_address)
        return None, f"node {node_id}: not the controller"

    def _channel(self, node_id: int) -> grpc.aio.Channel:
        address = self._addresses[node_id]
        channel = self._channels.get(address)
        if channel is None:
            backoff_ms = self.policy.retry_backoff_max_ms
            options = [
                ("grpc.initial_reconnect_backoff_ms", min(100, backoff_ms)),
                ("grpc.min_reconnect_backoff_ms", min(100, backoff_ms)),
                ("grpc.max_reconnect_backoff_ms", backoff_ms),
            ]
            channel = grpc.aio.insecure_channel(address, options=options)
            self._channels[address] = channel
        return channel
