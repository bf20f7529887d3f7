"""Schemas of the cluster-discovery APIs: Metadata, ApiVersions, DescribeCluster,
InitProducerId.

Notation in ``schema.py``; inner structs are named first, then the messages that hold them.
Facts follow the Kafka message definitions (clients/src/main/resources/common/message).
ApiVersions responses always travel under response header v0, even in flexible versions, so
that a client can read the error of a version it does not share with the broker; that rule
lives in ``framing.py``.
"""

from __future__ import annotations

from broker.protocol.keys import ApiKey
from broker.protocol.schema import (
    BOOL,
    INT8,
    INT16,
    INT32,
    INT64,
    STRING,
    UUID,
    ApiSpec,
    array,
    field,
    struct,
)

__all__ = ["API_VERSIONS", "DESCRIBE_CLUSTER", "INIT_PRODUCER_ID", "METADATA"]

AUTHORIZED_OPERATIONS_UNKNOWN = -(2**31)

_METADATA_TOPIC = struct(
    "MetadataRequestTopic",
    field("topic_id", UUID, "10+"),
    field("name", STRING, nullable="10+"),
)
_METADATA_BROKER = struct(
    "MetadataResponseBroker",
    field("node_id", INT32),
    field("host", STRING),
    field("port", INT32),
    field("rack", STRING, "1+", nullable="1+", default=None),
)
_METADATA_PARTITION = struct(
    "MetadataResponsePartition",
    field("error_code", INT16),
    field("partition_index", INT32),
    field("leader_id", INT32),
    field("leader_epoch", INT32, "7+", default=-1),
    field("replica_nodes", array(INT32)),
    field("isr_nodes", array(INT32)),
    field("offline_replicas", array(INT32), "5+"),
)
_METADATA_RESPONSE_TOPIC = struct(
    "MetadataResponseTopic",
    field("error_code", INT16),
    field("name", STRING, nullable="12+"),
    field("topic_id", UUID, "10+"),
    field("is_internal", BOOL, "1+", default=False),
    field("partitions", array(_METADATA_PARTITION)),
    field("topic_authorized_operations", INT32, "8+", default=AUTHORIZED_OPERATIONS_UNKNOWN),
)

METADATA = ApiSpec(
    ApiKey.METADATA,
    "Metadata",
    min_version=1,
    max_version=12,
    flexible_from=9,
    request=struct(
        "MetadataRequest",
        field("topics", array(_METADATA_TOPIC), nullable="1+"),
        field("allow_auto_topic_creation", BOOL, "4+", default=True),
        field("include_cluster_authorized_operations", BOOL, "8-10"),
        field("include_topic_authorized_operations", BOOL, "8+"),
    ),
    response=struct(
        "MetadataResponse",
        field("throttle_time_ms", INT32, "3+"),
        field("brokers", array(_METADATA_BROKER)),
        field("cluster_id", STRING, "2+", nullable="2+", default=None),
        field("controller_id", INT32, "1+", default=-1),
        field("topics", array(_METADATA_RESPONSE_TOPIC)),
        field(
            "cluster_authorized_operations", INT32, "8-10", default=AUTHORIZED_OPERATIONS_UNKNOWN
        ),
    ),
)

_API_VERSION = struct(
    "ApiVersion",
    field("api_key", INT16),
    field("min_version", INT16),
    field("max_version", INT16),
)
_SUPPORTED_FEATURE = struct(
    "SupportedFeatureKey",
    field("name", STRING, "3+"),
    field("min_version", INT16, "3+"),
    field("max_version", INT16, "3+"),
)
_FINALIZED_FEATURE = struct(
    "FinalizedFeatureKey",
    field("name", STRING, "3+"),
    field("max_version_level", INT16, "3+"),
    field("min_version_level", INT16, "3+"),
)

API_VERSIONS = ApiSpec(
    ApiKey.API_VERSIONS,
    "ApiVersions",
    min_version=0,
    max_version=3,
    flexible_from=3,
    request=struct(
        "ApiVersionsRequest",
        field("client_software_name", STRING, "3+"),
        field("client_software_version", STRING, "3+"),
    ),
    response=struct(
        "ApiVersionsResponse",
        field("error_code", INT16),
        field("api_keys", array(_API_VERSION)),
        field("throttle_time_ms", INT32, "1+"),
        field("supported_features", array(_SUPPORTED_FEATURE), "3+", tag=0),
        field("finalized_features_epoch", INT64, "3+", tag=1, default=-1),
        field("finalized_features", array(_FINALIZED_FEATURE), "3+", tag=2),
        field("zk_migration_ready", BOOL, "3+", tag=3, default=False),
    ),
)

_CLUSTER_BROKER = struct(
    "DescribeClusterBroker",
    field("broker_id", INT32),
    field("host", STRING),
    field("port", INT32),
    field("rack", STRING, nullable="0+", default=None),
)

DESCRIBE_CLUSTER = ApiSpec(
    ApiKey.DESCRIBE_CLUSTER,
    "DescribeCluster",
    min_version=0,
    max_version=1,
    flexible_from=0,
    request=struct(
        "DescribeClusterRequest",
        field("include_cluster_authorized_operations", BOOL),
        field("endpoint_type", INT8, "1+", default=1),
    ),
    response=struct(
        "DescribeClusterResponse",
        field("throttle_time_ms", INT32),
        field("error_code", INT16),
        field("error_message", STRING, nullable="0+", default=None),
        field("endpoint_type", INT8, "1+", default=1),
        field("cluster_id", STRING),
        field("controller_id", INT32, default=-1),
        field("brokers", array(_CLUSTER_BROKER)),
        field("cluster_authorized_operations", INT32, default=AUTHORIZED_OPERATIONS_UNKNOWN),
    ),
)

INIT_PRODUCER_ID = ApiSpec(
    ApiKey.INIT_PRODUCER_ID,
    "InitProducerId",
    min_version=0,
    max_version=4,
    flexible_from=2,
    request=struct(
        "InitProducerIdRequest",
        field("transactional_id", STRING, nullable="0+"),
        field("transaction_timeout_ms", INT32),
        field("producer_id", INT64, "3+", default=-1),
        field("producer_epoch", INT16, "3+", default=-1),
    ),
    response=struct(
        "InitProducerIdResponse",
        field("throttle_time_ms", INT32),
        field("error_code", INT16),
        field("producer_id", INT64, default=-1),
        field("producer_epoch", INT16),
    ),
)
