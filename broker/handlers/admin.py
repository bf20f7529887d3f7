"""CreateTopics, DeleteTopics, CreatePartitions and ElectLeaders: forwarded to the active
controller.

How this works. The request becomes the controller's gRPC request; its per-topic answers
become the Kafka response. A change is answered only once its records have committed (the
controller's rule) AND this broker's own image shows it, waited for up to the request's
timeout: so a client that creates a topic and then asks this broker for metadata sees it.
Manual replica assignments are not supported (the controller places replicas itself): such
a topic is refused with INVALID_REQUEST and a message saying so. A topic created (or, with
``validate_only``, that would be) is answered (v5+) with its whole effective config set, as
DescribeConfigs lists it (``broker.handlers.topic_configs``), from the entries the request
sets: Kafka's buildCreatableTopicResult.

A name given more than once is answered once (the controller's INVALID_REQUEST "Duplicate
topic name.", controller/topics.py), as Kafka's ControllerApis answers it; a CreateTopics the
controller refuses as a whole (e.g. too many partitions in all) answers that error for every
entry of the request. DeleteTopics v6 entries are checked here, where the names of topic ids
are known, as Kafka's ControllerApis.deleteTopics checks them: both a name and an id, or
neither, or a repeated id, or a name whose id is also given, is INVALID_REQUEST; an unknown id
is UNKNOWN_TOPIC_ID; a deleted topic is answered with its id.

ElectLeaders (PREFERRED or UNCLEAN) is answered per partition, grouped by topic, each named
partition once; an empty list of partitions elects nothing (Kafka's QuorumController answers
it at once), a null one every partition (the controller answers only those that needed an
election). A request the controller refuses as a whole (an unknown election type), or that
no controller answered, gets that error at the top (v1+) and for every partition named, as
Kafka's ElectLeadersRequest.getErrorResponse answers. An elected partition is answered once
this broker's image shows it elected: led by its first replica (PREFERRED), led at all
(UNCLEAN).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from broker.context import BrokerContext
from broker.handlers.common import Reply, topic_uuid
from broker.handlers.topic_configs import effective_topic_configs
from broker.protocol import ErrorCode, RequestHeader
from controller.client import ControllerUnavailable
from controller.configs import canonical_value
from controller.image import NO_LEADER, MetadataImage
from controller.outcome import DecisionError
from controller.records import ConfigResourceType
from controller.topics import DUPLICATE_NAME, repeated
from proto import controller_pb2 as cpb

__all__ = ["create_partitions", "create_topics", "delete_topics", "elect_leaders", "wait_for_image"]

_log = logging.getLogger(__name__)
IMAGE_POLL_S = 0.02
NO_ASSIGNMENTS = "manual replica assignment is not supported; leave assignments empty"
# Kafka's ControllerApis.deleteTopics messages
BOTH_NAME_AND_ID = "You may not specify both topic name and topic id."
NEITHER_NAME_NOR_ID = "Neither topic name nor id were specified."
DUPLICATE_ID = "Duplicate topic id."
NAME_OF_GIVEN_ID = "The provided topic name maps to an ID that was already supplied."


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
    twice = repeated(t.name for t in request.topics)  # forwarded: the controller answers
    refused = {t.name for t in request.topics if t.assignments and t.name not in twice}
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
    if forward.topics and not results:  # refused as a whole: every entry says so (Kafka's)
        blank = {"num_partitions": -1, "replication_factor": -1} | missing
        return {"throttle_time_ms": 0, "topics": [{"name": t.name} | blank for t in request.topics]}
    image = context.image()
    topics = [
        _created(t, results, refused, missing) | _effective_configs(context, image, t, results)
        for t in _first_of_each(request.topics)
    ]
    return {"throttle_time_ms": 0, "topics": topics}


def _first_of_each(topics: Iterable[Any]) -> list[Any]:
    """The first entry of each name, in request order: one answer per name."""
    firsts: dict[str, Any] = {}
    for t in topics:
        firsts.setdefault(t.name, t)
    return list(firsts.values())


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
        "error_message": None,  # null, as Kafka answers a success
        "topic_id": topic_uuid(result.topic_id),
        "num_partitions": result.num_partitions,
        "replication_factor": result.replication_factor,
    }


def _effective_configs(
    context: BrokerContext, image: MetadataImage, topic: Any, results: dict[str, Any]
) -> dict[str, Any]:
    """A created (or, validate_only, creatable) topic's whole effective config set, as
    DescribeConfigs would list it, from the entries the request sets, as the controller
    commits them (Kafka's buildCreatableTopicResult: ``computeEffectiveTopicConfigs`` of the
    creation configs); nothing for a topic not created."""
    result = results.get(topic.name)
    if result is None or result.error != cpb.NONE:
        return {}
    entries = {c.name: _committed(c.name, c.value or "") for c in topic.configs}
    described = effective_topic_configs(context, image, entries)
    return {"configs": [{k: c[k] for k in _CREATABLE_TOPIC_CONFIG} for c in described]}


_CREATABLE_TOPIC_CONFIG = ("name", "value", "read_only", "config_source", "is_sensitive")


def _committed(name: str, value: str) -> str:
    """The text the controller commits for a topic config it accepted."""
    try:
        return canonical_value(name, value, ConfigResourceType.TOPIC)
    except DecisionError:  # not expected: the controller accepted it
        return value


# -- DeleteTopics ------------------------------------------------------------------------------


class _Deletion(NamedTuple):
    """A DeleteTopics request checked against this broker's image: the entries answered here,
    and the topics to ask the controller to delete: by name, and by id (their names here ->
    the ids given, which the controller checks: this broker's image may lag)."""

    answered: list[dict[str, Any]]
    by_name: list[str]
    by_id: dict[str, bytes]


def _deletion_entry(
    name: str | None, topic_id: bytes | None, code: int, message: str | None
) -> dict[str, Any]:
    return {
        "name": name,
        "topic_id": topic_uuid(topic_id),
        "error_code": code,
        "error_message": message,
    }


def _plan_deletion(image: MetadataImage, request: Any) -> _Deletion:
    """Kafka's ControllerApis.deleteTopics checks, in its order."""
    answered, names, ids = _sort_entries(request)
    repeated_names, repeated_ids = repeated(names), repeated(ids)
    answered += [  # one each, in request order
        _deletion_entry(n, None, ErrorCode.INVALID_REQUEST, DUPLICATE_NAME)
        for n in dict.fromkeys(names)
        if n in repeated_names
    ]
    answered += [
        _deletion_entry(None, i, ErrorCode.INVALID_REQUEST, DUPLICATE_ID)
        for i in dict.fromkeys(ids)
        if i in repeated_ids
    ]
    by_id: dict[bytes, str] = {}
    for i in (i for i in dict.fromkeys(ids) if i not in repeated_ids):
        topic = image.topics.get(i)
        if topic is None:
            answered.append(
                _deletion_entry(None, i, ErrorCode.UNKNOWN_TOPIC_ID, "unknown topic id")
            )
        else:
            by_id[i] = topic.name
    by_name: list[str] = []
    for n in (n for n in dict.fromkeys(names) if n not in repeated_names):
        known = image.topic_ids.get(n)
        if known is not None and (known in by_id or known in repeated_ids):
            by_id.pop(known, None)  # neither entry is carried out
            answered.append(_deletion_entry(n, known, ErrorCode.INVALID_REQUEST, NAME_OF_GIVEN_ID))
        else:
            by_name.append(n)
    return _Deletion(answered, by_name, {name: i for i, name in by_id.items()})


def _sort_entries(request: Any) -> tuple[list[dict[str, Any]], list[str], list[bytes]]:
    """The entries refused for what they give (both a name and an id, or neither), and the
    names and the ids given alone, repeats kept."""
    refused: list[dict[str, Any]] = []
    names = list(getattr(request, "topic_names", None) or ())  # before v6
    ids: list[bytes] = []
    for t in getattr(request, "topics", None) or ():  # v6
        topic_id = t.topic_id.bytes if t.topic_id is not None and t.topic_id.int else None
        if t.name is not None and topic_id is not None:
            refused.append(
                _deletion_entry(t.name, topic_id, ErrorCode.INVALID_REQUEST, BOTH_NAME_AND_ID)
            )
        elif t.name is not None:
            names.append(t.name)
        elif topic_id is not None:
            ids.append(topic_id)
        else:
            refused.append(
                _deletion_entry(None, None, ErrorCode.INVALID_REQUEST, NEITHER_NAME_NOR_ID)
            )
    return refused, names, ids


def delete_topics(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    return _delete_topics(context, request)


async def _delete_topics(context: BrokerContext, request: Any) -> dict[str, Any]:
    plan = _plan_deletion(context.image(), request)
    names = [*plan.by_name, *plan.by_id]
    forward = cpb.DeleteTopicsRequest(names=names, topic_ids=plan.by_id)
    answer = await _call(context, "DeleteTopics", forward) if names else None
    results = {r.name: r for r in answer.topics} if answer is not None else {}
    deleted = [n for n, r in results.items() if r.error == cpb.NONE]
    if deleted:
        await wait_for_image(
            context,
            lambda image: not any(n in image.topic_ids for n in deleted),
            _timeout_s(context, request.timeout_ms),
        )
    responses = list(plan.answered)
    for name in names:
        result = results.get(name)
        topic_id = plan.by_id.get(name)
        if result is None:
            responses.append({"name": name, "topic_id": topic_uuid(topic_id)} | _missing(answer))
        else:
            topic_id = result.topic_id or topic_id
            responses.append(_deletion_entry(name, topic_id, result.error, result.message or None))
    return {"throttle_time_ms": 0, "responses": responses}


# -- CreatePartitions --------------------------------------------------------------------------


def create_partitions(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    return _create_partitions(context, request)


async def _create_partitions(context: BrokerContext, request: Any) -> dict[str, Any]:
    twice = repeated(t.name for t in request.topics)  # forwarded: the controller answers
    refused = {t.name for t in request.topics if t.assignments is not None}
    refused -= twice
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
    for t in _first_of_each(request.topics):
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


# -- ElectLeaders ------------------------------------------------------------------------------


def elect_leaders(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    return _elect_leaders(context, request)


async def _elect_leaders(context: BrokerContext, request: Any) -> dict[str, Any]:
    named = request.topic_partitions  # None: every partition
    if named is not None and not named:
        return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "replica_election_results": []}
    forward = cpb.ElectLeadersRequest(
        partitions=[
            cpb.TopicPartitions(topic=t.topic, partitions=t.partitions) for t in named or ()
        ],
        election_type=request.election_type,  # v0: 0, PREFERRED
    )
    answer = await _call(context, "ElectLeaders", forward)
    refused = answer is None or answer.header.error != cpb.NONE
    results = {} if refused else {(r.topic, r.partition): r for r in answer.partitions}
    elected = [key for key, r in results.items() if r.error == cpb.NONE]
    if elected:
        preferred = request.election_type == cpb.PREFERRED
        await wait_for_image(
            context,
            lambda image: all(_elected(image, t, p, preferred) for t, p in elected),
            _timeout_s(context, request.timeout_ms),
        )
    missing = _missing(answer)
    top = missing["error_code"] if refused else ErrorCode.NONE
    topics = _election_results(named, results, missing)
    return {"throttle_time_ms": 0, "error_code": top, "replica_election_results": topics}


def _election_results(
    named: Any, results: dict[tuple[str, int], Any], missing: dict[str, Any]
) -> list[dict[str, Any]]:
    """The answer by topic: each partition named (every one answered, for a null list)
    once, in the order asked; ``missing`` for those the controller did not answer."""
    wanted = results if named is None else {(t.topic, p): 0 for t in named for p in t.partitions}
    by_topic: dict[str, list[dict[str, Any]]] = {t.topic: [] for t in named or ()}
    for topic, partition in wanted:
        result = results.get((topic, partition))
        outcome = missing if result is None else _election_outcome(result)
        by_topic.setdefault(topic, []).append({"partition_id": partition} | outcome)
    return [{"topic": t, "partition_result": answers} for t, answers in by_topic.items()]


def _election_outcome(result: Any) -> dict[str, Any]:
    if result.error == cpb.NONE:
        return {"error_code": ErrorCode.NONE, "error_message": None}
    return {"error_code": result.error, "error_message": result.message or None}


def _elected(image: MetadataImage, topic: str, partition: int, preferred: bool) -> bool:
    """Whether ``image`` shows the partition elected: led by its first replica (PREFERRED)
    or led at all (UNCLEAN)."""
    found = image.topic_by_name(topic)
    p = None if found is None else found.partitions.get(partition)
    if p is None:
        return True  # deleted meanwhile: nothing to wait for
    return p.leader == p.replicas[0] if preferred else p.leader != NO_LEADER
