"""Schemas of the admin APIs: CreateTopics, DeleteTopics, DeleteRecords, CreatePartitions,
DescribeConfigs, AlterConfigs, IncrementalAlterConfigs, ElectLeaders.

Notation in ``schema.py``; inner structs are named first, then the messages that hold them.
Facts follow the Kafka message definitions (clients/src/main/resources/common/message).
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
    Struct,
    array,
    field,
    struct,
)

__all__ = [
    "ALTER_CONFIGS",
    "CREATE_PARTITIONS",
    "CREATE_TOPICS",
    "DELETE_RECORDS",
    "DELETE_TOPICS",
    "DESCRIBE_CONFIGS",
    "ELECT_LEADERS",
    "INCREMENTAL_ALTER_CONFIGS",
]

_CREATABLE_TOPIC = struct(
    "CreatableTopic",
    field("name", STRING),
    field("num_partitions", INT32),
    field("replication_factor", INT16),
    field(
        "assignments",
        array(
            struct(
                "CreatableReplicaAssignment",
                field("partition_index", INT32),
                field("broker_ids", array(INT32)),
            )
        ),
    ),
    field(
        "configs",
        array(
            struct(
                "CreatableTopicConfig",
                field("name", STRING),
                field("value", STRING, nullable="0+"),
            )
        ),
    ),
)
_CREATABLE_TOPIC_CONFIGS = struct(
    "CreatableTopicConfigs",
    field("name", STRING, "5+"),
    field("value", STRING, "5+", nullable="5+"),
    field("read_only", BOOL, "5+"),
    field("config_source", INT8, "5+", default=-1),
    field("is_sensitive", BOOL, "5+"),
)
_CREATABLE_TOPIC_RESULT = struct(
    "CreatableTopicResult",
    field("name", STRING),
    field("topic_id", UUID, "7+"),
    field("error_code", INT16),
    field("error_message", STRING, "1+", nullable="0+"),
    field("topic_config_error_code", INT16, "5+", tag=0),
    field("num_partitions", INT32, "5+", default=-1),
    field("replication_factor", INT16, "5+", default=-1),
    field("configs", array(_CREATABLE_TOPIC_CONFIGS), "5+", nullable="5+"),
)

CREATE_TOPICS = ApiSpec(
    ApiKey.CREATE_TOPICS,
    "CreateTopics",
    min_version=2,
    max_version=7,
    flexible_from=5,
    request=struct(
        "CreateTopicsRequest",
        field("topics", array(_CREATABLE_TOPIC)),
        field("timeout_ms", INT32, default=60000),
        field("validate_only", BOOL, "1+", default=False),
    ),
    response=struct(
        "CreateTopicsResponse",
        field("throttle_time_ms", INT32, "2+"),
        field("topics", array(_CREATABLE_TOPIC_RESULT)),
    ),
)

DELETE_TOPICS = ApiSpec(
    ApiKey.DELETE_TOPICS,
    "DeleteTopics",
    min_version=1,
    max_version=6,
    flexible_from=4,
    request=struct(
        "DeleteTopicsRequest",
        field(
            "topics",
            array(
                struct(
                    "DeleteTopicState",
                    field("name", STRING, "6+", nullable="6+", default=None),
                    field("topic_id", UUID, "6+"),
                )
            ),
            "6+",
        ),
        field("topic_names", array(STRING), "0-5"),
        field("timeout_ms", INT32),
    ),
    response=struct(
        "DeleteTopicsResponse",
        field("throttle_time_ms", INT32, "1+"),
        field(
            "responses",
            array(
                struct(
                    "DeletableTopicResult",
                    field("name", STRING, nullable="6+"),
                    field("topic_id", UUID, "6+"),
                    field("error_code", INT16),
                    field("error_message", STRING, "5+", nullable="5+", default=None),
                )
            ),
        ),
    ),
)

DELETE_RECORDS = ApiSpec(
    ApiKey.DELETE_RECORDS,
    "DeleteRecords",
    min_version=0,
    max_version=2,
    flexible_from=2,
    request=struct(
        "DeleteRecordsRequest",
        field(
            "topics",
            array(
                struct(
                    "DeleteRecordsTopic",
                    field("name", STRING),
                    field(
                        "partitions",
                        array(
                            struct(
                                "DeleteRecordsPartition",
                                field("partition_index", INT32),
                                field("offset", INT64),  # -1: the high watermark
                            )
                        ),
                    ),
                )
            ),
        ),
        field("timeout_ms", INT32),
    ),
    response=struct(
        "DeleteRecordsResponse",
        field("throttle_time_ms", INT32),
        field(
            "topics",
            array(
                struct(
                    "DeleteRecordsTopicResult",
                    field("name", STRING),
                    field(
                        "partitions",
                        array(
                            struct(
                                "DeleteRecordsPartitionResult",
                                field("partition_index", INT32),
                                field("low_watermark", INT64),
                                field("error_code", INT16),
                            )
                        ),
                    ),
                )
            ),
        ),
    ),
)

CREATE_PARTITIONS = ApiSpec(
    ApiKey.CREATE_PARTITIONS,
    "CreatePartitions",
    min_version=0,
    max_version=3,
    flexible_from=2,
    request=struct(
        "CreatePartitionsRequest",
        field(
            "topics",
            array(
                struct(
                    "CreatePartitionsTopic",
                    field("name", STRING),
                    field("count", INT32),
                    field(
                        "assignments",
                        array(
                            struct(
                                "CreatePartitionsAssignment",
                                field("broker_ids", array(INT32)),
                            )
                        ),
                        nullable="0+",
                    ),
                )
            ),
        ),
        field("timeout_ms", INT32),
        field("validate_only", BOOL),
    ),
    response=struct(
        "CreatePartitionsResponse",
        field("throttle_time_ms", INT32),
        field(
            "results",
            array(
                struct(
                    "CreatePartitionsTopicResult",
                    field("name", STRING),
                    field("error_code", INT16),
                    field("error_message", STRING, nullable="0+", default=None),
                )
            ),
        ),
    ),
)

_CONFIG_SYNONYM = struct(
    "DescribeConfigsSynonym",
    field("name", STRING, "1+"),
    field("value", STRING, "1+", nullable="0+"),
    field("source", INT8, "1+"),
)
_DESCRIBED_CONFIG = struct(
    "DescribeConfigsResourceResult",
    field("name", STRING),
    field("value", STRING, nullable="0+"),
    field("read_only", BOOL),
    field("config_source", INT8, "1+", default=-1),
    field("is_sensitive", BOOL),
    field("synonyms", array(_CONFIG_SYNONYM), "1+"),
    field("config_type", INT8, "3+", default=0),
    field("documentation", STRING, "3+", nullable="0+"),
)

DESCRIBE_CONFIGS = ApiSpec(
    ApiKey.DESCRIBE_CONFIGS,
    "DescribeConfigs",
    min_version=1,
    max_version=4,
    flexible_from=4,
    request=struct(
        "DescribeConfigsRequest",
        field(
            "resources",
            array(
                struct(
                    "DescribeConfigsResource",
                    field("resource_type", INT8),
                    field("resource_name", STRING),
                    field("configuration_keys", array(STRING), nullable="0+"),
                )
            ),
        ),
        field("include_synonyms", BOOL, "1+", default=False),
        field("include_documentation", BOOL, "3+", default=False),
    ),
    response=struct(
        "DescribeConfigsResponse",
        field("throttle_time_ms", INT32),
        field(
            "results",
            array(
                struct(
                    "DescribeConfigsResult",
                    field("error_code", INT16),
                    field("error_message", STRING, nullable="0+"),
                    field("resource_type", INT8),
                    field("resource_name", STRING),
                    field("configs", array(_DESCRIBED_CONFIG)),
                )
            ),
        ),
    ),
)


def _alter_configs_response(name: str) -> Struct:
    return struct(
        name,
        field("throttle_time_ms", INT32),
        field(
            "responses",
            array(
                struct(
                    "AlterConfigsResourceResponse",
                    field("error_code", INT16),
                    field("error_message", STRING, nullable="0+"),
                    field("resource_type", INT8),
                    field("resource_name", STRING),
                )
            ),
        ),
    )


ALTER_CONFIGS = ApiSpec(
    ApiKey.ALTER_CONFIGS,
    "AlterConfigs",
    min_version=0,
    max_version=2,
    flexible_from=2,
    request=struct(
        "AlterConfigsRequest",
        field(
            "resources",
            array(
                struct(
                    "AlterConfigsResource",
                    field("resource_type", INT8),
                    field("resource_name", STRING),
                    field(
                        "configs",
                        array(
                            struct(
                                "AlterableConfig",
                                field("name", STRING),
                                field("value", STRING, nullable="0+"),
                            )
                        ),
                    ),
                )
            ),
        ),
        field("validate_only", BOOL),
    ),
    response=_alter_configs_response("AlterConfigsResponse"),
)

INCREMENTAL_ALTER_CONFIGS = ApiSpec(
    ApiKey.INCREMENTAL_ALTER_CONFIGS,
    "IncrementalAlterConfigs",
    min_version=0,
    max_version=1,
    flexible_from=1,
    request=struct(
        "IncrementalAlterConfigsRequest",
        field(
            "resources",
            array(
                struct(
                    "AlterConfigsResource",
                    field("resource_type", INT8),
                    field("resource_name", STRING),
                    field(
                        "configs",
                        array(
                            struct(
                                "AlterableConfig",
                                field("name", STRING),
                                field("config_operation", INT8),
                                field("value", STRING, nullable="0+"),
                            )
                        ),
                    ),
                )
            ),
        ),
        field("validate_only", BOOL),
    ),
    response=_alter_configs_response("IncrementalAlterConfigsResponse"),
)

ELECT_LEADERS = ApiSpec(
    ApiKey.ELECT_LEADERS,
    "ElectLeaders",
    min_version=0,
    max_version=2,
    flexible_from=2,
    request=struct(
        "ElectLeadersRequest",
        field("election_type", INT8, "1+"),  # before v1: 0, PREFERRED
        field(
            "topic_partitions",
            array(
                struct(
                    "TopicPartitions",
                    field("topic", STRING),
                    field("partitions", array(INT32)),
                )
            ),
            nullable="0+",  # null: every partition
        ),
        field("timeout_ms", INT32, default=60000),
    ),
    response=struct(
        "ElectLeadersResponse",
        field("throttle_time_ms", INT32),
        field("error_code", INT16, "1+"),
        field(
            "replica_election_results",
            array(
                struct(
                    "ReplicaElectionResult",
                    field("topic", STRING),
                    field(
                        "partition_result",
                        array(
                            struct(
                                "PartitionResult",
                                field("partition_id", INT32),
                                field("error_code", INT16),
                                field("error_message", STRING, nullable="0+"),
                            )
                        ),
                    ),
                )
            ),
        ),
    ),
)
