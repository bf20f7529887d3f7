"""Schemas of the group-coordination APIs runnel answers today: FindCoordinator.

Consumer groups come with a later issue; until then FindCoordinator is served (every key is
answered COORDINATOR_NOT_AVAILABLE) because librdkafka enables lz4 only for brokers that
advertise it (see docs/compatibility.md). Facts follow the Kafka message definitions.
"""

from __future__ import annotations

from broker.protocol.keys import ApiKey
from broker.protocol.schema import INT8, INT16, INT32, STRING, ApiSpec, array, field, struct

__all__ = ["FIND_COORDINATOR"]

_COORDINATOR = struct(
    "Coordinator",
    field("key", STRING),
    field("node_id", INT32),
    field("host", STRING),
    field("port", INT32),
    field("error_code", INT16),
    field("error_message", STRING, nullable="0+", default=None),
)

FIND_COORDINATOR = ApiSpec(
    ApiKey.FIND_COORDINATOR,
    "FindCoordinator",
    min_version=0,
    max_version=4,
    flexible_from=3,
    request=struct(
        "FindCoordinatorRequest",
        field("key", STRING, "0-3"),
        field("key_type", INT8, "1+"),
        field("coordinator_keys", array(STRING), "4+"),
    ),
    response=struct(
        "FindCoordinatorResponse",
        field("throttle_time_ms", INT32, "1+"),
        field("error_code", INT16, "0-3"),
        field("error_message", STRING, "1-3", nullable="1-3", default=None),
        field("node_id", INT32, "0-3"),
        field("host", STRING, "0-3"),
        field("port", INT32, "0-3"),
        field("coordinators", array(_COORDINATOR), "4+"),
    ),
)
