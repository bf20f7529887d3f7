"""Schemas of the data-path APIs: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch.

Each API is described once, for every version runnel serves (see ``schema.py`` for the
notation). Fields that only exist in versions above runnel's maximum are left out; adding a
version means adding its fields here and raising ``max_version``. Facts (names, types,
versions, defaults, tags) follow the Kafka message definitions in
clients/src/main/resources/common/message of Apache Kafka.
"""

from __future__ import annotations

from broker.protocol.keys import ApiKey
from broker.protocol.schema import (
    INT8,
    INT16,
    INT32,
    INT64,
    RECORDS,
    STRING,
    UUID,
    ApiSpec,
    Field,
    Struct,
    array,
    field,
    struct,
)

__all__ = ["FETCH", "LIST_OFFSETS", "OFFSET_FOR_LEADER_EPOCH", "PRODUCE"]


def _leader_id_and_epoch(versions: str) -> Struct:
    """A partition's current leader as an answer names it (-1: unknown)."""
    return struct(
        "LeaderIdAndEpoch",
        field("leader_id", INT32, versions, default=-1),
        field("leader_epoch", INT32, versions, default=-1),
    )


def _node_endpoints(versions: str) -> Field:
    """KIP-951: the brokers an answer's current leaders name, as Metadata lists them."""
    return field(
        "node_endpoints",
        array(
            struct(
                "NodeEndpoint",
                field("node_id", INT32, versions),
                field("host", STRING, versions),
                field("port", INT32, versions),
                field("rack", STRING, versions, nullable=versions, default=None),
            )
        ),
        versions,
        tag=0,
    )


PRODUCE = ApiSpec(
    ApiKey.PRODUCE,
    "Produce",
    min_version=3,
    max_version=10,  # v10 (KIP-951): the answer may name a partition's current leader
    flexible_from=9,
    request=struct(
        "ProduceRequest",
        field("transactional_id", STRING, "3+", nullable="3+", default=None),
        field("acks", INT16),
        field("timeout_ms", INT32),
        field(
            "topic_data",
            array(
                struct(
                    "TopicProduceData",
                    field("name", STRING, "0-12"),
                    field(
                        "partition_data",
                        array(
                            struct(
                                "PartitionProduceData",
                                field("index", INT32),
                                field("records", RECORDS, nullable="0+"),
                            )
                        ),
                    ),
                )
            ),
        ),
    ),
    response=struct(
        "ProduceResponse",
        field(
            "responses",
            array(
                struct(
                    "TopicProduceResponse",
                    field("name", STRING, "0-12"),
                    field(
                        "partition_responses",
                        array(
                            struct(
                                "PartitionProduceResponse",
                                field("index", INT32),
                                field("error_code", INT16),
                                field("base_offset", INT64),
                                field("log_append_time_ms", INT64, "2+", default=-1),
                                field("log_start_offset", INT64, "5+", default=-1),
                                field(
                                    "record_errors",
                                    array(
                                        struct(
                                            "BatchIndexAndErrorMessage",
                                            field("batch_index", INT32, "8+"),
                                            field(
                                                "batch_index_error_message",
                                                STRING,
                                                "8+",
                                                nullable="8+",
                                                default=None,
                                            ),
                                        )
                                    ),
                                    "8+",
                                ),
                                field("error_message", STRING, "8+", nullable="8+", default=None),
                                field("current_leader", _leader_id_and_epoch("10+"), "10+", tag=0),
                            )
                        ),
                    ),
                )
            ),
        ),
        field("throttle_time_ms", INT32, "1+"),
        _node_endpoints("10+"),
    ),
)

_EPOCH_END_OFFSET = struct(
    "EpochEndOffset",
    field("epoch", INT32, "12+", default=-1),
    field("end_offset", INT64, "12+", default=-1),
)
_LEADER_ID_AND_EPOCH = _leader_id_and_epoch("12+")
_SNAPSHOT_ID = struct(
    "SnapshotId",
    field("end_offset", INT64, default=-1),
    field("epoch", INT32, default=-1),
)

FETCH = ApiSpec(
    ApiKey.FETCH,
    "Fetch",
    min_version=4,
    max_version=16,
    flexible_from=12,
    request=struct(
        "FetchRequest",
        field("cluster_id", STRING, "12+", nullable="12+", tag=0, default=None),
        field("replica_id", INT32, "0-14", default=-1),
        field(
            "replica_state",
            struct(
                "ReplicaState",
                field("replica_id", INT32, "15+", default=-1),
                field("replica_epoch", INT64, "15+", default=-1),
            ),
            "15+",
            tag=1,
        ),
        field("max_wait_ms", INT32),
        field("min_bytes", INT32),
        field("max_bytes", INT32, "3+", default=0x7FFFFFFF),
        field("isolation_level", INT8, "4+", default=0),
        field("session_id", INT32, "7+", default=0),
        field("session_epoch", INT32, "7+", default=-1),
        field(
            "topics",
            array(
                struct(
                    "FetchTopic",
                    field("topic", STRING, "0-12"),
                    field("topic_id", UUID, "13+"),
                    field(
                        "partitions",
                        array(
                            struct(
                                "FetchPartition",
                                field("partition", INT32),
                                field("current_leader_epoch", INT32, "9+", default=-1),
                                field("fetch_offset", INT64),
                                field("last_fetched_epoch", INT32, "12+", default=-1),
                                field("log_start_offset", INT64, "5+", default=-1),
                                field("partition_max_bytes", INT32),
                            )
                        ),
                    ),
                )
            ),
        ),
        field(
            "forgotten_topics_data",
            array(
                struct(
                    "ForgottenTopic",
                    field("topic", STRING, "7-12"),
                    field("topic_id", UUID, "13+"),
                    field("partitions", array(INT32), "7+"),
                )
            ),
            "7+",
        ),
        field("rack_id", STRING, "11+"),
    ),
    response=struct(
        "FetchResponse",
        field("throttle_time_ms", INT32, "1+"),
        field("error_code", INT16, "7+"),
        field("session_id", INT32, "7+", default=0),
        field(
            "responses",
            array(
                struct(
                    "FetchableTopicResponse",
                    field("topic", STRING, "0-12"),
                    field("topic_id", UUID, "13+"),
                    field(
                        "partitions",
                        array(
                            struct(
                                "PartitionData",
                                field("partition_index", INT32),
                                field("error_code", INT16),
                                field("high_watermark", INT64),
                                field("last_stable_offset", INT64, "4+", default=-1),
                                field("log_start_offset", INT64, "5+", default=-1),
                                field("diverging_epoch", _EPOCH_END_OFFSET, "12+", tag=0),
                                field("current_leader", _LEADER_ID_AND_EPOCH, "12+", tag=1),
                                field("snapshot_id", _SNAPSHOT_ID, "12+", tag=2),
                                field(
                                    "aborted_transactions",
                                    array(
                                        struct(
                                            "AbortedTransaction",
                                            field("producer_id", INT64, "4+"),
                                            field("first_offset", INT64, "4+"),
                                        )
                                    ),
                                    "4+",
                                    nullable="4+",
                                ),
                                field("preferred_read_replica", INT32, "11+", default=-1),
                                field("records", RECORDS, nullable="0+"),
                            )
                        ),
                    ),
                )
            ),
        ),
        _node_endpoints("16+"),
    ),
)

LIST_OFFSETS = ApiSpec(
    ApiKey.LIST_OFFSETS,
    "ListOffsets",
    min_version=1,
    max_version=7,
    flexible_from=6,
    request=struct(
        "ListOffsetsRequest",
        field("replica_id", INT32),
        field("isolation_level", INT8, "2+"),
        field(
            "topics",
            array(
                struct(
                    "ListOffsetsTopic",
                    field("name", STRING),
                    field(
                        "partitions",
                        array(
                            struct(
                                "ListOffsetsPartition",
                                field("partition_index", INT32),
                                field("current_leader_epoch", INT32, "4+", default=-1),
                                field("timestamp", INT64),
                            )
                        ),
                    ),
                )
            ),
        ),
    ),
    response=struct(
        "ListOffsetsResponse",
        field("throttle_time_ms", INT32, "2+"),
        field(
            "topics",
            array(
                struct(
                    "ListOffsetsTopicResponse",
                    field("name", STRING),
                    field(
                        "partitions",
                        array(
                            struct(
                                "ListOffsetsPartitionResponse",
                                field("partition_index", INT32),
                                field("error_code", INT16),
                                field("timestamp", INT64, "1+", default=-1),
                                field("offset", INT64, "1+", default=-1),
                                field("leader_epoch", INT32, "4+", default=-1),
                            )
                        ),
                    ),
                )
            ),
        ),
    ),
)

OFFSET_FOR_LEADER_EPOCH = ApiSpec(
    ApiKey.OFFSET_FOR_LEADER_EPOCH,
    "OffsetForLeaderEpoch",
    min_version=2,
    max_version=4,
    flexible_from=4,
    request=struct(
        "OffsetForLeaderEpochRequest",
        field("replica_id", INT32, "3+", default=-2),
        field(
            "topics",
            array(
                struct(
                    "OffsetForLeaderTopic",
                    field("topic", STRING),
                    field(
                        "partitions",
                        array(
                            struct(
                                "OffsetForLeaderPartition",
                                field("partition", INT32),
                                field("current_leader_epoch", INT32, "2+", default=-1),
                                field("leader_epoch", INT32),
                            )
                        ),
                    ),
                )
            ),
        ),
    ),
    response=struct(
        "OffsetForLeaderEpochResponse",
        field("throttle_time_ms", INT32, "2+"),
        field(
            "topics",
            array(
                struct(
                    "OffsetForLeaderTopicResult",
                    field("topic", STRING),
                    field(
                        "partitions",
                        array(
                            struct(
                                "EpochEndOffset",
                                field("error_code", INT16),
                                field("partition", INT32),
                                field("leader_epoch", INT32, "1+", default=-1),
                                field("end_offset", INT64, default=-1),
                            )
                        ),
                    ),
                )
            ),
        ),
    ),
)
