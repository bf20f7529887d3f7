"""CreateTopics, DeleteTopics and CreatePartitions: forwarded to the active controller.

How this works. The request becomes the controller's gRPC request; its per-topic answers
become the Kafka response. A change is answered only once its records have committed (the
controller's rule) AND this broker's own image shows it, waited for up to the request's
timeout: so a client that creates a topic and then asks this broker for metadata sees it.
Manual replica assignments are not supported (the controller places replicas itself): such
a topic is refused with INVALID_REQUEST and a message saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from broker.context import BrokerContext
from broker.handlers.common import Reply, topic_uuid
from broker.protocol import ErrorCode, RequestHeader
from controller.client import ControllerUnavailable
from controller.image import MetadataImage
from proto import controller_pb2 as cpb

__all__ = ["create_partitions", "create_topics", "delete_topics", "wait_for_image"]

_log = logging.getLogger(__name__)
IMAGE_POLL_S = 0.02
NO_ASSIGNMENTS = "manual replica assignment is not supported; leave assignments empty"


def _timeout_s(context: BrokerContext, timeout_ms: int) -> float:
    limit = context.settings.controller_request_timeout_ms
    return max(0.0, min(timeout_ms if timeout_ms > 0 else limit, limit)) / 1000


async def wait_for_image(
    context: BrokerContext, done: Callable[[MetadataImage], bool], timeout_s: float
) -> bool:
    """Wait until this broker's image satisfies ``done`` (True) or the time passes."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            while not done(context.image()):
                await asyncio.sleep(IMAGE_POLL_S)
            return True
    return False


async def _call(context: BrokerContext, method: str, request: Any) -> Any:
    """The controller's answer, or None when no controller answered in time."""
    try:
        return await context.controller.call(method, request)
    except ControllerUnavailable as e:
        _log.warning("%s: %s", method, e)
        return None


def _missing(answer: Any) -> dict[str, Any]:
    """The answer for a topic the controller did not answer for: its request-level error,
    or a timeout if no controller answered."""
    if answer is not None and answer.header.error != cpb.NONE:
        return {"error_code": answer.header.error, "error_message": answer.header.message}
    return {"error_code": ErrorCode.REQUEST_TIMED_OUT, "error_message": "no controller answered"}


# -- CreateTopics ------------------------------------------------------------------------------


def create_topics(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    return _create_topics(context, request)


async def _create_topics(context: BrokerContext, request: Any) -> dict[str, Any]:
    refused = {t.name for t in request.topics if t.assignments}
    forward = cpb.CreateTopicsRequest(
        topics=[
            cpb.CreatableTopic(
                name=t.name,
                num_partitions=t.num_partitions,
                replication_factor=t.replication_factor,
                configs=[cpb.ConfigEntry(name=c.name, value=c.value or "") for c in t.configs],
            )
            for t in request.topics
            if t.name not in refused
        ],
        validate_only=bool(getattr(request, "validate_only", False)),
    )
    answer = await _call(context, "CreateTopics", forward) if forward.topics else None
    results = {r.name: r for r in answer.topics} if answer is not None else {}
    created = [(r.name, r.topic_id) for r in results.values() if r.error == cpb.NONE and r.topic_id]
    if created and not forward.validate_only:
        await wait_for_image(
            context,
            lambda image: all(image.topic_ids.get(n) == i for n, i in created),
            _timeout_s(context, request.timeout_ms),
        )
    missing = _missing(answer)
    topics = [_created(t, results, refused, missing) for t in request.topics]
    return {"throttle_time_ms": 0, "topics": topics}


def _created(
    topic: Any, results: dict[str, Any], refused: set[str], missing: dict[str, Any]
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": topic.name, "num_partitions": -1, "replication_factor": -1}
    if topic.name in refused:
        return out | {"error_code": ErrorCode.INVALID_REQUEST, "error_message": NO_ASSIGNMENTS}
    result = results.get(topic.name)
    if result is None:
        return out | missing
    if result.error != cpb.NONE:
        return out | {"error_code": result.error, "error_message": result.message or None}
    return out | {
        "error_code": ErrorCode.NONE,
        "topic_id": topic_uuid(result.topic_id),
        "num_partitions": result.num_partitions,
        "replication_factor": result.replication_factor,
        "configs": [
            {"name": c.name, "value": c.value, "read_only": False, "config_source": 1}
            for c in topic.configs
        ],
    }


# -- DeleteTopics ------------------------------------------------------------------------------


def _names_to_delete(image: MetadataImage, request: Any) -> list[tuple[str | None, Any]]:
    """(name or None if unknown, topic id or None) of each topic named (by name before v6)."""
    if getattr(request, "topics", None):
        out = []
        for t in request.topics:
            if t.name is not None:
                out.append((t.name, None))
            else:
                found = image.topics.get(t.topic_id.bytes)
                out.append((found.name if found is not None else None, t.topic_id))
        return out
    return [(name, None) for name in request.topic_names]


def delete_topics(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    return _delete_topics(context, request)


async def _delete_topics(context: BrokerContext, request: Any) -> dict[str, Any]:
    wanted = _names_to_delete(context.image(), request)
    names = [n for n, _ in wanted if n is not None]
    answer = await _call(context, "DeleteTopics", cpb.DeleteTopicsRequest(names=names))
    results = {r.name: r for r in answer.topics} if answer is not None else {}
    deleted = [n for n, r in results.items() if r.error == cpb.NONE]
    if deleted:
        await wait_for_image(
            context,
            lambda image: not any(n in image.topic_ids for n in deleted),
            _timeout_s(context, request.timeout_ms),
        )
    responses = []
    for name, topic_id in wanted:
        out: dict[str, Any] = {"name": name, "topic_id": topic_id or topic_uuid(None)}
        result = results.get(name) if name is not None else None
        if name is None:
            out |= {"error_code": ErrorCode.UNKNOWN_TOPIC_ID, "error_message": "unknown topic id"}
        elif result is None:
            out |= _missing(answer)
        else:
            out |= {"error_code": result.error, "error_message": result.message or None}
        responses.append(out)
    return {"throttle_time_ms": 0, "responses": responses}


# -- CreatePartitions --------------------------------------------------------------------------


def create_partitions(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    return _create_partitions(context, request)


async def _create_partitions(context: BrokerContext, request: Any) -> dict[str, Any]:
    refused = {t.name for t in request.topics if t.assignments is not None}
    forward = cpb.CreatePartitionsRequest(
        topics=[
            cpb.CreatePartitionsTopic(name=t.name, count=t.count)
            for t in request.topics
            if t.name not in refused
        ],
        validate_only=bool(request.validate_only),
    )
    answer = await _call(context, "CreatePartitions", forward) if forward.topics else None
    results = {r.name: r for r in answer.topics} if answer is not None else {}
    grown = {t.name: t.count for t in forward.topics if _ok(results.get(t.name))}
    if grown and not forward.validate_only:

        def done(image: MetadataImage) -> bool:
            return all(
                (topic := image.topic_by_name(n)) is not None and len(topic.partitions) >= c
                for n, c in grown.items()
            )

        await wait_for_image(context, done, _timeout_s(context, request.timeout_ms))
    out = []
    for t in request.topics:
        result = results.get(t.name)
        if t.name in refused:
            error = {"error_code": ErrorCode.INVALID_REQUEST, "error_message": NO_ASSIGNMENTS}
        elif result is None:
            error = _missing(answer)
        else:
            error = {"error_code": result.error, "error_message": result.message or None}
        out.append({"name": t.name} | error)
    return {"throttle_time_ms": 0, "results": out}


def _ok(result: Any) -> bool:
    return result is not None and result.error == cpb.NONE
