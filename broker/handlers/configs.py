"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs.

How this works. DescribeConfigs reads this broker's image: a topic's configs are every topic
config runnel knows (controller/configs.py), each with the value in force and where it comes
from, in the order its replicas here resolve it (``broker.replica_manager.topic_settings``):
set on the topic, else this broker's dynamic broker config, else the cluster-wide one, else
the node's ``[log]`` section or the built-in default. ``unclean.leader.election.enable`` skips
this broker's own value, as the controller's elections do (``controller.elections``); the
controller's static ``unclean_leader_election_enable`` is not known here, so where nothing
dynamic sets it the answer is Kafka's default, false. A broker's configs are the broker
configs the controller accepts, dynamic where set. Both alter requests go to
the active controller as one IncrementalAlterConfigs: AlterConfigs replaces a resource's
whole set, so it becomes SET for each entry given and DELETE for each entry not given.
APPEND and SUBTRACT (list-valued configs) are refused with INVALID_REQUEST.
"""

from __future__ import annotations

from typing import Any

from broker.context import BrokerContext
from broker.handlers.admin import wait_for_image
from broker.handlers.common import Reply
from broker.protocol import ErrorCode, RequestHeader
from controller.client import ControllerUnavailable
from controller.configs import (
    BROKER_CONFIGS,
    broker_entries_as_topic,
    canonical_value,
    describe_topic_configs,
)
from controller.elections import UNCLEAN_CONFIG
from controller.image import MetadataImage
from controller.records import ConfigResourceType
from proto import controller_pb2 as cpb
from storage.config import LogConfig

__all__ = ["alter_configs", "describe_configs", "incremental_alter_configs"]

TOPIC = int(ConfigResourceType.TOPIC)
BROKER = int(ConfigResourceType.BROKER)
# Kafka's ConfigSource codes
TOPIC_CONFIG, DYNAMIC_BROKER, DYNAMIC_DEFAULT_BROKER, STATIC_BROKER, DEFAULT = 1, 2, 3, 4, 5
SET, DELETE = 0, 1
CONFIG_WAIT_S = 5.0


def _entry(name: str, value: str | None, source: int) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "read_only": False,
        "is_default": source in (STATIC_BROKER, DEFAULT),
        "config_source": source,
        "is_sensitive": False,
        "synonyms": [],
    }


def _topic_configs(context: BrokerContext, image: MetadataImage, name: str) -> list[dict[str, Any]]:
    entries = image.configs.get((TOPIC, name), {})
    described = describe_topic_configs(entries, context.settings.log_defaults)
    layers = (  # the dynamic broker configs, as topic configs: the nearest first
        (DYNAMIC_BROKER, broker_entries_as_topic(image, str(context.settings.broker_id))),
        (DYNAMIC_DEFAULT_BROKER, broker_entries_as_topic(image, "")),
    )
    out = []
    for n, v, own in described:
        source = TOPIC_CONFIG if own else _default_source(n, v)
        if not own:
            for layer, values in layers:
                if n in values and not (layer == DYNAMIC_BROKER and n == UNCLEAN_CONFIG):
                    v, source = values[n], layer
                    break
        out.append(_entry(n, v, source))
    return out


def _default_source(name: str, value: str) -> int:
    """DEFAULT_CONFIG where the value is runnel's own default, STATIC_BROKER_CONFIG where the
    node's ``[log]`` section changed it (as Kafka tells its defaults from server.properties)."""
    return DEFAULT if _BUILT_IN.get(name) == value else STATIC_BROKER


_BUILT_IN = {n: v for n, v, _ in describe_topic_configs({}, LogConfig())}


def _broker_configs(
    context: BrokerContext, image: MetadataImage, name: str
) -> list[dict[str, Any]]:
    own = image.configs.get((BROKER, name), {})
    cluster = image.configs.get((BROKER, ""), {})
    statics = {n: v for n, v, _ in describe_topic_configs({}, context.settings.log_defaults)}
    out = []
    for config in sorted(BROKER_CONFIGS):
        topic_name = BROKER_CONFIGS[config]
        if config in own:
            out.append(
                _entry(config, own[config], DYNAMIC_BROKER if name else DYNAMIC_DEFAULT_BROKER)
            )
        elif config in cluster:
            out.append(_entry(config, cluster[config], DYNAMIC_DEFAULT_BROKER))
        else:
            static = statics[topic_name]
            out.append(_entry(config, static, _default_source(topic_name, static)))
    return out


def _describe_one(context: BrokerContext, image: MetadataImage, resource: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "resource_type": resource.resource_type,
        "resource_name": resource.resource_name,
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "configs": [],
    }
    name = resource.resource_name
    if resource.resource_type == TOPIC:
        if name not in image.topic_ids:
            return out | {
                "error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                "error_message": f"no topic {name!r}",
            }
        configs = _topic_configs(context, image, name)
    elif resource.resource_type == BROKER:
        if name and (not name.isdigit() or int(name) not in image.brokers):
            return out | {
                "error_code": ErrorCode.INVALID_REQUEST,
                "error_message": f"no broker {name!r}",
            }
        configs = _broker_configs(context, image, name)
    else:
        message = f"resource type {resource.resource_type} is not supported (topics 2, brokers 4)"
        return out | {"error_code": ErrorCode.INVALID_REQUEST, "error_message": message}
    keys = resource.configuration_keys
    if keys is not None:
        configs = [c for c in configs if c["name"] in set(keys)]
    return out | {"configs": configs}


def describe_configs(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    image = context.image()
    return {
        "throttle_time_ms": 0,
        "results": [_describe_one(context, image, r) for r in request.resources],
    }


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
            for c in resource.configs:
                value = canonical_value(c.name, c.value, kind) if c.op == cpb.SET else None
                wanted.append((key, c.name, value))

    def done(image: MetadataImage) -> bool:
        return all(image.configs.get(k, {}).get(n) == v for k, n, v in wanted)

    if wanted:
        await wait_for_image(context, done, CONFIG_WAIT_S)


def incremental_alter_configs(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    changes: list[cpb.AlterConfigsResource | dict[str, Any]] = []
    for resource in request.resources:
        ops = {c.config_operation for c in resource.configs}
        if not ops <= {SET, DELETE}:
            message = "only SET (0) and DELETE (1) are supported, not APPEND or SUBTRACT"
            changes.append(_result(resource, ErrorCode.INVALID_REQUEST, message))
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
        given = {c.name: c.value or "" for c in resource.configs}
        current = image.configs.get((resource.resource_type, resource.resource_name), {})
        configs = [cpb.AlterableConfig(name=n, op=cpb.SET, value=v) for n, v in given.items()]
        configs += [cpb.AlterableConfig(name=n, op=cpb.DELETE) for n in current if n not in given]
        changes.append(_alter_resource(resource, configs))
    return _forward(context, request, changes)


def _alter_resource(resource: Any, configs: list[cpb.AlterableConfig]) -> cpb.AlterConfigsResource:
    return cpb.AlterConfigsResource(
        resource_type=resource.resource_type,
        resource_name=resource.resource_name,
        configs=configs,
    )
