"""The registry of implemented APIs: ``API_SPECS`` maps an API key to its ``ApiSpec``.

The version ranges here are exactly what the broker serves; its ApiVersions response
advertises them, but Produce from v0 (``broker.handlers.metadata.ADVERTISED_MIN_VERSION``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from broker.protocol.schema import ApiSpec
from broker.protocol.schemas_admin import (
    ALTER_CONFIGS,
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_RECORDS,
    DELETE_TOPICS,
    DESCRIBE_CONFIGS,
    ELECT_LEADERS,
    INCREMENTAL_ALTER_CONFIGS,
)
from broker.protocol.schemas_cluster import (
    API_VERSIONS,
    DESCRIBE_CLUSTER,
    INIT_PRODUCER_ID,
    METADATA,
)
from broker.protocol.schemas_data import FETCH, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH, PRODUCE
from broker.protocol.schemas_groups import FIND_COORDINATOR

__all__ = ["API_SPECS"]

API_SPECS: Mapping[int, ApiSpec] = MappingProxyType(
    {
        spec.key: spec
        for spec in (
            PRODUCE,
            FETCH,
            LIST_OFFSETS,
            METADATA,
            API_VERSIONS,
            CREATE_TOPICS,
            DELETE_TOPICS,
            DELETE_RECORDS,
            INIT_PRODUCER_ID,
            OFFSET_FOR_LEADER_EPOCH,
            DESCRIBE_CONFIGS,
            ALTER_CONFIGS,
            CREATE_PARTITIONS,
            ELECT_LEADERS,
            INCREMENTAL_ALTER_CONFIGS,
            DESCRIBE_CLUSTER,
            FIND_COORDINATOR,
        )
    }
)
