"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs.

How this works. DescribeConfigs reads this broker's image: a topic's configs are every topic
config runnel knows, each with the value in force and where it comes from
(``broker.handlers.topic_configs``, which CreateTopics answers with too); the controller's
static ``unclean_leader_election_enable`` is not known here, so where nothing dynamic sets it
the answer is Kafka's default, false. A topic name is checked against Kafka's
rules before it is looked up (INVALID_TOPIC_EXCEPTION, as Kafka's ConfigHelper). A broker's
configs are the broker configs the controller accepts, dynamic where set; the resource ""
(the cluster-wide defaults) lists only the entries set on it, as Kafka does, and a broker id
other than this broker's is INVALID_REQUEST. A broker id is read as Kafka reads it, by Java's
Integer.parseInt (``controller.configs.broker_id_of``, the controller's rule too): "0101" is
broker 101. Every entry has its type; its documentation and synonyms come when the request
asks for them (include_documentation, include_synonyms). An empty list of keys, like none,
asks for all. A resource named again in the same request (the same type and name, "0101"
and "101" being one broker) is described at its first place only; each later place is
INVALID_REQUEST, with no configs. Kafka's ConfigHelper.describeConfigs describes every copy,
so one request of a few MB naming a topic a million times would build an answer of tens of
GB; here an answer holds each resource's configs once.

Both alter requests are first checked here as Kafka's ConfigAdminManager.preprocess does (a
name given twice, a null value, a BROKER resource naming another broker: INVALID_REQUEST), then
go to the active controller as one IncrementalAlterConfigs, a broker's resource under the name
its entries are kept by ("101" for "0101"; the answer keeps the name asked): AlterConfigs
replaces a resource's whole set, so it becomes SET for each entry given and DELETE for each
entry not given. APPEND and SUBTRACT go to the controller as they are (controller/configs.py:
list-typed configs only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.context import BrokerContext
from broker.handlers.admin import wait_for_image
from broker.handlers.common import Reply
from broker.handlers.topic_configs import (
    Detail,
    broker_configs,
    cluster_default_configs,
    effective_topic_configs,
)
from broker.protocol import ErrorCode, RequestHeader
from controller.client import ControllerUnavailable
from controller.configs import broker_id_of, canonical_value, stored_resource_name
from controller.image import MetadataImage
from controller.records import ConfigResourceType
from controller.topic_names import topic_name_problem
from controller.topics import repeated
from proto import controller_pb2 as cpb

__all__ = ["alter_configs", "describe_configs", "incremental_alter_configs"]

TOPIC = int(ConfigResourceType.TOPIC)
BROKER = int(ConfigResourceType.BROKER)
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # Kafka's AlterConfigOp.OpType ids
CONFIG_WAIT_S = 5.0
DUPLICATE = (
    "Duplicate resource: this request names it more than once; it is described at its first place"
)


def _describe_one(
    context: BrokerContext, image: MetadataImage, resource: Any, detail: Detail
) -> dict[str, Any]:
    out = _result(resource, ErrorCode.NONE, None) | {"configs": []}
    name = resource.resource_name
    if resource.resource_type == TOPIC:
        problem = topic_name_problem(name)  # __cluster_metadata passes: no topic has it
        if problem:
            return out | {"error_code": ErrorCode.INVALID_TOPIC_EXCEPTION, "error_message": problem}
        if name not in image.topic_ids:
            return out | {
                "error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                "error_message": f"no topic {name!r}",
            }
        entries = image.configs.get((TOPIC, name), {})
        configs = effective_topic_configs(context, image, entries, detail)
    elif resource.resource_type == BROKER:
        me = context.settings.broker_id
        if not name:
            configs = cluster_default_configs(image, detail)
        elif (broker_id := broker_id_of(name)) is None:
            message = f"Broker id must be an integer, but it is: {name}"
            return out | {"error_code": ErrorCode.INVALID_REQUEST, "error_message": message}
        elif broker_id != me:
            message = f"Unexpected broker id, expected {me} or empty string, but received {name}"
            return out | {"error_code": ErrorCode.INVALID_REQUEST, "error_message": message}
        else:
            configs = broker_configs(context, image, detail)
    else:
        message = f"resource type {resource.resource_type} is not supported (topics 2, brokers 4)"
        return out | {"error_code": ErrorCode.INVALID_REQUEST, "error_message": message}
    keys = resource.configuration_keys
    if keys:  # None or empty: every config (Kafka's ConfigHelperUtils.createResponseConfig)
        configs = [c for c in configs if c["name"] in set(keys)]
    return out | {"configs": configs}


def describe_configs(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    image = context.image()
    detail = Detail(
        synonyms=bool(getattr(request, "include_synonyms", False)),
        documentation=bool(getattr(request, "include_documentation", False)),
    )
    described: set[tuple[int, str]] = set()
    results = []
    for resource in request.resources:
        kind = resource.resource_type
        key = (kind, stored_resource_name(kind, resource.resource_name))
        if key in described:  # not described twice (module doc: Kafka would, without bound)
            results.append(
                _result(resource, ErrorCode.INVALID_REQUEST, DUPLICATE) | {"configs": []}
            )
        else:
            described.add(key)
            results.append(_describe_one(context, image, resource, detail))
    return {"throttle_time_ms": 0, "results": results}


# -- altering ----------------------------------------------------------------------------------


def _result(resource: Any, code: int, message: str | None) -> dict[str, Any]:
    return {
        "resource_type": resource.resource_type,
        "resource_name": resource.resource_name,
        "error_code": code,
        "error_message": message,
    }


async def _forward(
    context: BrokerContext, request: Any, changes: list[cpb.AlterConfigsResource | dict[str, Any]]
) -> dict[str, Any]:
    """Send the resources that are requests (not answers already) to the controller."""
    forward = [c for c in changes if isinstance(c, cpb.AlterConfigsResource)]
    answers: dict[tuple[int, str], Any] = {}
    failure: tuple[int, str] | None = None
    if forward:
        validate_only = bool(request.validate_only)
        message = cpb.IncrementalAlterConfigsRequest(resources=forward, validate_only=validate_only)
        try:
            answer = await context.controller.call("IncrementalAlterConfigs", message)
        except ControllerUnavailable as e:
            failure = (ErrorCode.REQUEST_TIMED_OUT, str(e))
        else:
            if answer.header.error != cpb.NONE:
                failure = (answer.header.error, answer.header.message)
            answers = {(r.resource_type, r.resource_name): r for r in answer.resources}
            if not validate_only:
                await _wait_applied(context, forward, answers)
    out = []
    for resource, change in zip(request.resources, changes, strict=True):
        if isinstance(change, dict):
            out.append(change)
            continue
        found = answers.get((change.resource_type, change.resource_name))
        if found is not None:
            out.append(_result(resource, found.error, found.message or None))
        else:
            code, text = failure or (ErrorCode.UNKNOWN_SERVER_ERROR, "no answer")
            out.append(_result(resource, code, text))
    return {"throttle_time_ms": 0, "responses": out}


async def _wait_applied(
    context: BrokerContext,
    sent: list[cpb.AlterConfigsResource],
    answers: dict[tuple[int, str], Any],
) -> None:
    """Until this broker's image holds the changes that succeeded (so a DescribeConfigs right
    after sees them); bounded."""
    wanted = []
    for resource in sent:
        answer = answers.get((resource.resource_type, resource.resource_name))
        if answer is not None and answer.error == cpb.NONE:
            key = (resource.resource_type, resource.resource_name)
            kind = ConfigResourceType(resource.resource_type)
            wanted += [(key, c.name, _applied(c, kind)) for c in resource.configs]

    def done(image: MetadataImage) -> bool:
        return all(test(image.configs.get(k, {}).get(n)) for k, n, test in wanted)

    if wanted:
        await wait_for_image(context, done, CONFIG_WAIT_S)


def _applied(change: cpb.AlterableConfig, kind: ConfigResourceType) -> Callable[[str | None], bool]:
    """Whether an entry's committed value shows ``change`` (which the controller accepted).
    APPEND and SUBTRACT always leave an entry; its items are known, not its whole value."""
    if change.op == SET:
        value = canonical_value(change.name, change.value, kind)
        return lambda now: now == value
    if change.op == DELETE:
        return lambda now: now is None
    items = {item.strip() for item in change.value.split(",")} - {""}
    if change.op == APPEND:
        return lambda now: now is not None and items <= set(now.split(","))
    return lambda now: now is not None and not items & set(now.split(","))


def _preprocess(
    context: BrokerContext, resource: Any, null_values: list[str]
) -> dict[str, Any] | None:
    """The answer for a resource refused before it reaches the controller, as Kafka's
    ConfigAdminManager.preprocess refuses it, in its order; None to forward it."""
    message = None
    if repeated(c.name for c in resource.configs):
        message = "Error due to duplicate config keys"
    elif null_values:
        message = f"Null value not supported for : {', '.join(null_values)}"
    elif resource.resource_type == BROKER and resource.resource_name:
        me, name = context.settings.broker_id, resource.resource_name
        if (broker_id := broker_id_of(name)) is None:
            message = f"Node id must be an integer, but it is: {name}"
        elif broker_id != me:
            message = f"Unexpected broker id, expected {me}, but received {name}"
    return None if message is None else _result(resource, ErrorCode.INVALID_REQUEST, message)


def incremental_alter_configs(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    changes: list[cpb.AlterConfigsResource | dict[str, Any]] = []
    for resource in request.resources:
        nulls = [
            c.name for c in resource.configs if c.config_operation != DELETE and c.value is None
        ]
        refused = _preprocess(context, resource, nulls)
        if refused is not None:
            changes.append(refused)
            continue
        configs = [
            cpb.AlterableConfig(name=c.name, op=c.config_operation, value=c.value or "")
            for c in resource.configs
        ]
        changes.append(_alter_resource(resource, configs))
    return _forward(context, request, changes)


def alter_configs(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    image = context.image()
    changes: list[cpb.AlterConfigsResource | dict[str, Any]] = []
    for resource in request.resources:
        refused = _preprocess(
            context, resource, [c.name for c in resource.configs if c.value is None]
        )
        if refused is not None:
            changes.append(refused)
            continue
        given = {c.name: c.value for c in resource.configs}
        current = image.configs.get((resource.resource_type, _stored_name(resource)), {})
        configs = [cpb.AlterableConfig(name=n, op=cpb.SET, value=v) for n, v in given.items()]
        configs += [cpb.AlterableConfig(name=n, op=cpb.DELETE) for n in current if n not in given]
        changes.append(_alter_resource(resource, configs))
    return _forward(context, request, changes)


def _alter_resource(resource: Any, configs: list[cpb.AlterableConfig]) -> cpb.AlterConfigsResource:
    return cpb.AlterConfigsResource(
        resource_type=resource.resource_type,
        resource_name=_stored_name(resource),
        configs=configs,
    )


def _stored_name(resource: Any) -> str:
    return stored_resource_name(resource.resource_type, resource.resource_name)
