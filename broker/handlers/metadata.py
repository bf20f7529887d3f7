"""ApiVersions, Metadata and DescribeCluster: what a client learns before anything else.

How this works. ApiVersions and Metadata come from the broker's metadata image (no controller
round trip), except a Metadata request for unknown topics when ``auto_create_topics_enable`` is
on: those are created through the controller and answered LEADER_NOT_AVAILABLE, as Kafka does,
so the client asks again; an unknown topic whose name is not legal is INVALID_TOPIC_EXCEPTION
and never created, and ``__cluster_metadata`` (the metadata log's name: legal, and no topic's)
is UNKNOWN_TOPIC_OR_PARTITION and never created, as Kafka answers it (its controller refuses
to create it). DescribeCluster is forwarded to the active controller. Brokers are listed with
their address on the listener the request came in on; fenced brokers are left out, except
that an answer never lists no broker while this one is registered: when the image has every
broker fenced (the controller lost them all, say behind a network partition, until their next
heartbeats unfence them), this broker is listed alone, as it is evidently answering. Kafka
lists none there, and librdkafka from 2.13 (2.16 here) then drops every broker and stops
reconnecting for good (confluentinc/librdkafka#5301, open): very probably what stalled the
nemesis test's producer (docs/compatibility.md). The controller id a client sees is this
broker's own id: clients cannot reach KRaft controllers, and this broker forwards admin
requests to the active one (as Kafka's brokers do). A topic asked for more than once (by
name, by id, or both) is answered once, at its first place, and created at most once:
Kafka's handleTopicMetadataRequest takes the names and the ids as sets, so repeating a name
in a request costs nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from broker.context import BrokerContext
from broker.handlers.common import Reply, broker_endpoint, topic_uuid
from broker.protocol import API_SPECS, ApiKey, ErrorCode, RequestHeader
from controller.client import ControllerUnavailable
from controller.image import NO_LEADER, MetadataImage, PartitionState
from controller.topic_names import topic_name_problem
from controller.topics import METADATA_TOPIC
from proto import controller_pb2 as cpb

__all__ = ["api_versions", "describe_cluster", "metadata", "supported_api_versions"]

_log = logging.getLogger(__name__)
UNSET_OPERATIONS = -(2**31)  # "not asked for" in Kafka's authorized-operations fields
# No authorizer: every operation is allowed. Bits by Kafka's AclOperation codes.
TOPIC_OPERATIONS = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
CLUSTER_OPERATIONS = sum(1 << op for op in (4, 5, 7, 8, 9, 10, 11, 12))
AUTO_CREATE_LIMIT = 100  # unknown topics one Metadata request may create
INVALID_NAME = ErrorCode.INVALID_TOPIC_EXCEPTION  # an unknown topic whose name is not legal
UNKNOWN_TOPIC = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


# Advertised below what is served: Produce v0-v2 (message formats v0 and v1). librdkafka
# 2.0 (kcat's) enables compression only if Produce v0 is listed; a request at those versions
# closes the connection, as Apache Kafka 4.0 does (KAFKA-18659).
ADVERTISED_MIN_VERSION: dict[int, int] = {ApiKey.PRODUCE: 0}


def supported_api_versions() -> list[dict[str, int]]:
    return [
        {
            "api_key": spec.key,
            "min_version": ADVERTISED_MIN_VERSION.get(spec.key, spec.min_version),
            "max_version": spec.max_version,
        }
        for spec in sorted(API_SPECS.values(), key=lambda s: s.key)
    ]


def api_versions(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    return {"error_code": ErrorCode.NONE, "api_keys": supported_api_versions()}


def _brokers(context: BrokerContext, image: MetadataImage) -> list[dict[str, Any]]:
    """The unfenced brokers; if that leaves none, this broker alone (see the module doc)."""
    name = context.settings.listener_name
    listed = (broker_endpoint(image, broker_id, name) for broker_id in sorted(image.brokers))
    unfenced = [broker for broker in listed if broker is not None]
    if unfenced:
        return unfenced
    me = broker_endpoint(image, context.settings.broker_id, name, fenced_too=True)
    return [me] if me is not None else []


def _partition(p: PartitionState, alive: set[int]) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.LEADER_NOT_AVAILABLE if p.leader == NO_LEADER else ErrorCode.NONE,
        "partition_index": p.partition_id,
        "leader_id": p.leader,
        "leader_epoch": p.leader_epoch,
        "replica_nodes": list(p.replicas),
        "isr_nodes": list(p.isr),
        "offline_replicas": [b for b in p.replicas if b not in alive],
    }


def _topic(
    image: MetadataImage, name: str, error: int, operations: int, alive: set[int]
) -> dict[str, Any]:
    topic = image.topic_by_name(name)
    if topic is None:
        return {"error_code": error, "name": name, "partitions": []}
    return {
        "error_code": ErrorCode.NONE,
        "name": name,
        "topic_id": topic_uuid(topic.topic_id),
        "is_internal": False,
        "partitions": [_partition(topic.partitions[i], alive) for i in sorted(topic.partitions)],
        "topic_authorized_operations": operations,
    }


def _requested_names(image: MetadataImage, request: Any) -> tuple[list[str] | None, list[Any]]:
    """Names asked for (None: every topic), and the ids asked for that name no topic here,
    each once, in the order first asked for. From v10 a topic may be named by id alone."""
    if request.topics is None:
        return None, []
    names, unknown_ids = [], []
    for item in request.topics:
        name = getattr(item, "name", None)
        if name is None:
            topic_id = getattr(item, "topic_id", None)
            found = image.topics.get(topic_id.bytes) if topic_id is not None else None
            if found is None:
                unknown_ids.append(topic_id)
                continue
            name = found.name
        names.append(name)
    return list(dict.fromkeys(names)), list(dict.fromkeys(unknown_ids))


def _unknown_id(topic_id: Any, operations: int) -> dict[str, Any]:
    """A topic asked for by an id no topic has: UNKNOWN_TOPIC_ID, as Kafka answers it."""
    return {
        "error_code": ErrorCode.UNKNOWN_TOPIC_ID,
        "name": None,
        "topic_id": topic_id,
        "is_internal": False,
        "partitions": [],
        "topic_authorized_operations": operations,
    }


def metadata(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    image = context.image()
    names, unknown_ids = _requested_names(image, request)
    operations = (
        TOPIC_OPERATIONS
        if getattr(request, "include_topic_authorized_operations", False)
        else UNSET_OPERATIONS
    )
    missing = [] if names is None else [n for n in names if n not in image.topic_ids]
    # Kafka answers an unknown topic with an illegal name INVALID_TOPIC_EXCEPTION, not
    # UNKNOWN_TOPIC_OR_PARTITION (KafkaApis.getTopicMetadata's Topic.validate), and never
    # tries to create it (AutoTopicCreationManager).
    invalid = {n for n in missing if topic_name_problem(n)}
    if invalid or METADATA_TOPIC in missing:  # the metadata log's: unknown, never created
        missing = [n for n in missing if n not in invalid and n != METADATA_TOPIC]
    allow = header.api_version < 4 or bool(getattr(request, "allow_auto_topic_creation", True))
    auto_create = bool(missing) and allow and context.settings.auto_create_topics_enable
    error = ErrorCode.LEADER_NOT_AVAILABLE if auto_create else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    errors = {n: INVALID_NAME for n in invalid} | {METADATA_TOPIC: UNKNOWN_TOPIC}
    listed = sorted(image.topic_ids) if names is None else names
    alive = {b for b, reg in image.brokers.items() if not reg.fenced}  # once per request
    response = {
        "brokers": _brokers(context, image),
        "cluster_id": context.settings.cluster_id,
        "controller_id": context.settings.broker_id,
        "topics": [
            _topic(image, name, errors.get(name, error), operations, alive) for name in listed
        ]
        + [_unknown_id(topic_id, operations) for topic_id in unknown_ids],
        "cluster_authorized_operations": CLUSTER_OPERATIONS
        if getattr(request, "include_cluster_authorized_operations", False)
        else UNSET_OPERATIONS,
    }
    if not auto_create:
        return response
    return _auto_create(context, missing[:AUTO_CREATE_LIMIT], response)


async def _auto_create(
    context: BrokerContext, names: Iterable[str], response: dict[str, Any]
) -> dict[str, Any]:
    request = cpb.CreateTopicsRequest(  # -1: the controller's num_partitions and factor
        topics=[cpb.CreatableTopic(name=n, num_partitions=-1, replication_factor=-1) for n in names]
    )
    try:
        answer = await context.controller.call("CreateTopics", request)
    except ControllerUnavailable as e:
        _log.warning("auto-creating topics %s failed: %s", list(names), e)
        return response
    created = {t.name: t.error for t in answer.topics}
    for topic in response["topics"]:
        code = created.get(topic["name"])
        if code not in (None, cpb.NONE, cpb.TOPIC_ALREADY_EXISTS):
            topic["error_code"] = code  # e.g. INVALID_TOPIC_EXCEPTION for a bad name
    return response


ENDPOINT_TYPES = {1: "BROKER", 2: "CONTROLLER"}  # KIP-919's; a broker serves BROKER only


def describe_cluster(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    endpoint_type = getattr(request, "endpoint_type", 1)
    if endpoint_type != 1:
        return _wrong_endpoint_type(header.api_version, endpoint_type)
    return _describe_cluster(context, request.include_cluster_authorized_operations)


def _wrong_endpoint_type(version: int, endpoint_type: int) -> dict[str, Any]:
    """Kafka's answer (AuthHelper.computeDescribeClusterResponse): an unknown type is
    UNSUPPORTED_ENDPOINT_TYPE, a controller one MISMATCHED_ENDPOINT_TYPE (INVALID_REQUEST
    for either in v0); every other field keeps its default."""
    wanted = ENDPOINT_TYPES.get(endpoint_type)
    if wanted is None:
        code = ErrorCode.UNSUPPORTED_ENDPOINT_TYPE
        message = f"Unsupported endpoint type {endpoint_type}"
    else:
        code = ErrorCode.MISMATCHED_ENDPOINT_TYPE
        message = (
            f"The request was sent to an endpoint of type {ENDPOINT_TYPES[1]}, "
            f"but we wanted an endpoint of type {wanted}"
        )
    return {
        "error_code": ErrorCode.INVALID_REQUEST if version == 0 else code,
        "error_message": message,
        "cluster_id": "",
    }


async def _describe_cluster(context: BrokerContext, operations: bool) -> dict[str, Any]:
    """The active controller's view of the brokers (forwarded: it knows who is fenced now)."""
    response: dict[str, Any] = {
        "endpoint_type": 1,
        "cluster_id": context.settings.cluster_id,
        "controller_id": context.settings.broker_id,
        "cluster_authorized_operations": CLUSTER_OPERATIONS if operations else UNSET_OPERATIONS,
    }
    try:
        answer = await context.controller.call("DescribeCluster", cpb.DescribeClusterRequest())
    except ControllerUnavailable as e:
        return response | {"error_code": ErrorCode.REQUEST_TIMED_OUT, "error_message": str(e)}
    if answer.header.error != cpb.NONE:
        return response | {
            "error_code": answer.header.error,
            "error_message": answer.header.message,
        }
    brokers = []
    for broker in answer.brokers:
        endpoint = next(
            (e for e in broker.listeners if e.name == context.settings.listener_name), None
        )
        if broker.fenced or endpoint is None:
            continue
        rack = broker.rack or None
        brokers.append(
            {
                "broker_id": broker.broker_id,
                "host": endpoint.host,
                "port": endpoint.port,
                "rack": rack,
            }
        )
    return response | {"error_code": ErrorCode.NONE, "brokers": brokers}
