"""What every Kafka API handler shares: its signature, the partition lookup with Kafka's
error rules, and how a typed error becomes an error code.

How this works. A handler is a plain function ``(context, header, request) -> Reply``: it
does its synchronous part at once (a log append happens before the next request of the
connection is read) and returns the response as a dict for the codec, ``None`` (no response:
acks=0) or an awaitable of either for work that waits (long-poll fetches, the controller).

A reply that only waits for one future and then computes synchronously is best a future made
by ``then``: nothing of it runs as a task, and cancelling it (the listener does when its
connection closes) cancels what it waits for at once. A coroutine cancelled before its task
first ran never runs at all, so whatever it registered before being returned stayed
registered (a parked fetch, until its timeout: so it was until 2026-11-24).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from broker.context import BrokerContext
from broker.protocol import ErrorCode, RequestHeader
from controller.image import MetadataImage
from replication.errors import ReplicationError
from replication.partition import Partition

__all__ = [
    "Handler",
    "Reply",
    "broker_endpoint",
    "current_leader",
    "error_code_of",
    "leader_endpoints",
    "lookup_partition",
    "then",
    "topic_uuid",
]

_log = logging.getLogger(__name__)

Response = dict[str, Any] | None
Reply = Response | Awaitable[Response]
Handler = Callable[[BrokerContext, RequestHeader, Any], Reply]
TOPIC_ID_ZERO = uuid.UUID(int=0)

_T = TypeVar("_T")
_U = TypeVar("_U")


def then(source: asyncio.Future[_T], compute: Callable[[_T], _U]) -> asyncio.Future[_U]:
    """A future of ``compute(source's result)``, computed in ``source``'s done callback
    (an exception of either is the new future's). Cancelling the new future cancels
    ``source``; ``source`` cancelled cancels it."""
    result: asyncio.Future[_U] = source.get_loop().create_future()

    def settle(done: asyncio.Future[_T]) -> None:
        if result.done():
            return
        if done.cancelled():
            result.cancel()
            return
        try:
            result.set_result(compute(done.result()))
        except Exception as exc:
            result.set_exception(exc)

    def cancelled(done: asyncio.Future[_U]) -> None:
        if done.cancelled():
            source.cancel()

    source.add_done_callback(settle)
    result.add_done_callback(cancelled)
    return result


def lookup_partition(
    context: BrokerContext, image: MetadataImage, topic: str, index: int
) -> Partition | ErrorCode:
    """This broker's replica of ``topic``/``index``, or why there is none: the partition
    does not exist (UNKNOWN_TOPIC_OR_PARTITION) or lives on other brokers
    (NOT_LEADER_OR_FOLLOWER, so the client refreshes its metadata)."""
    partition = context.replicas.get(topic, index)
    if partition is not None:
        return partition
    found = image.topic_by_name(topic)
    if found is None or index not in found.partitions:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return ErrorCode.NOT_LEADER_OR_FOLLOWER


def current_leader(image: MetadataImage, topic: str, index: int) -> dict[str, int] | None:
    """The partition's leader and leader epoch as ``image`` has them (leader -1: none), for
    an answer that says NOT_LEADER_OR_FOLLOWER (Fetch v12's and Produce v10's
    ``current_leader``, KIP-951); None if the image does not have the partition."""
    found = image.topic_by_name(topic)
    state = found.partitions.get(index) if found is not None else None
    if state is None:
        return None
    return {"leader_id": state.leader, "leader_epoch": state.leader_epoch}


def broker_endpoint(
    image: MetadataImage, broker_id: int, listener: str, *, fenced_too: bool = False
) -> dict[str, Any] | None:
    """A broker as Metadata lists it (id, host and port on ``listener``, rack); None if it is
    not registered, fenced (Metadata leaves those out, unless ``fenced_too``) or has no such
    listener."""
    registration = image.brokers.get(broker_id)
    if registration is None or (registration.fenced and not fenced_too):
        return None
    endpoint = next((e for e in registration.listeners if e.name == listener), None)
    if endpoint is None:
        return None
    return {
        "node_id": broker_id,
        "host": endpoint.host,
        "port": endpoint.port,
        "rack": registration.rack,
    }


def leader_endpoints(
    image: MetadataImage, leaders: Iterable[int], listener: str
) -> list[dict[str, Any]]:
    """KIP-951's ``node_endpoints``: of the leaders an answer names (-1: none), those that
    Metadata would list, by id."""
    endpoints = (broker_endpoint(image, b, listener) for b in sorted(set(leaders)) if b >= 0)
    return [e for e in endpoints if e is not None]


def error_code_of(error: Exception) -> int:
    """The Kafka error code of an operating error; anything else is a bug, logged with its
    traceback and answered UNKNOWN_SERVER_ERROR (the broker goes on serving)."""
    if isinstance(error, ReplicationError):
        return error.code
    _log.error("unexpected error handling a request", exc_info=error)
    return ErrorCode.UNKNOWN_SERVER_ERROR


def topic_uuid(topic_id: bytes | None) -> uuid.UUID:
    return TOPIC_ID_ZERO if topic_id is None else uuid.UUID(bytes=topic_id)
