"""``__cluster_metadata``, the metadata log's name, as every API that names a topic answers it.

Kafka: the name is legal (Topic.validate) and no topic has it (the metadata log is not in the
metadata image), so Metadata answers it UNKNOWN_TOPIC_OR_PARTITION whether or not topics are
auto-created (KafkaApis.getTopicMetadata; its controller refuses to create it); CreateTopics
is INVALID_REQUEST "Creation of internal topic __cluster_metadata is prohibited."
(ControllerApis.createTopics); Produce, ListOffsets, DescribeConfigs, IncrementalAlterConfigs,
DeleteTopics and CreatePartitions find no such topic. In process, through the real dispatcher
and codec, the controller's real decisions behind it (test_dispatcher_answers.py's harness).
"""

from __future__ import annotations

import dataclasses

from support import make_batch
from test_dispatcher import Harness
from test_dispatcher_answers import broker

from broker.protocol import ApiKey, ErrorCode

__all__ = ["broker"]  # the fixture

NAME = "__cluster_metadata"
UNKNOWN = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def auto_creating(harness: Harness) -> None:
    context = harness.dispatcher.context
    context.settings = dataclasses.replace(context.settings, auto_create_topics_enable=True)


def metadata(harness: Harness, *names: str) -> list[tuple[str, int]]:
    body = {"topics": [{"name": n} for n in names], "allow_auto_topic_creation": True}
    return [(t.name, t.error_code) for t in harness.ask(ApiKey.METADATA, 12, body).topics]


def forwarded_creations(harness: Harness) -> list[str]:
    return [t.name for m, r in harness.controller.calls if m == "CreateTopics" for t in r.topics]


def test_metadata_answers_unknown_topic_and_never_creates_it(broker: Harness) -> None:
    assert metadata(broker, NAME) == [(NAME, UNKNOWN)]
    auto_creating(broker)
    assert metadata(broker, NAME, "fresh") == [
        (NAME, UNKNOWN),
        ("fresh", ErrorCode.LEADER_NOT_AVAILABLE),  # being created, as Kafka answers it
    ]
    assert metadata(broker, NAME) == [(NAME, UNKNOWN)]
    assert forwarded_creations(broker) == ["fresh"]


def test_create_topics_refuses_it_as_kafka_s_controller_does(broker: Harness) -> None:
    topics = [
        {"name": n, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}
        for n in (NAME, "__cluster.metadata")  # no collision: Kafka takes NAME out first
    ]
    answer = broker.ask(ApiKey.CREATE_TOPICS, 7, {"topics": topics, "timeout_ms": 5000})
    assert [(t.name, t.error_code, t.error_message) for t in answer.topics] == [
        (NAME, ErrorCode.INVALID_REQUEST, f"Creation of internal topic {NAME} is prohibited."),
        ("__cluster.metadata", ErrorCode.NONE, None),
    ]
    assert NAME not in broker.image.topic_ids


def test_the_other_apis_find_no_such_topic(broker: Harness) -> None:
    produce = {
        "transactional_id": None,
        "acks": 1,
        "timeout_ms": 1000,
        "topic_data": [
            {"name": NAME, "partition_data": [{"index": 0, "records": make_batch([b"x"])}]}
        ],
    }
    (topic,) = broker.ask(ApiKey.PRODUCE, 9, produce).responses
    assert [p.error_code for p in topic.partition_responses] == [UNKNOWN]
    offsets = {
        "replica_id": -1,
        "topics": [{"name": NAME, "partitions": [{"partition_index": 0, "timestamp": -1}]}],
    }
    (topic,) = broker.ask(ApiKey.LIST_OFFSETS, 7, offsets).topics
    assert [p.error_code for p in topic.partitions] == [UNKNOWN]
    resource = {"resource_type": 2, "resource_name": NAME, "configuration_keys": None}
    (described,) = broker.ask(ApiKey.DESCRIBE_CONFIGS, 4, {"resources": [resource]}).results
    assert described.error_code == UNKNOWN
    change = {"name": "retention.ms", "config_operation": 0, "value": "1000"}
    altered = {"resource_type": 2, "resource_name": NAME, "configs": [change]}
    body = {"resources": [altered], "validate_only": False}
    (result,) = broker.ask(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, body).responses
    assert result.error_code == UNKNOWN
    deleted = broker.ask(ApiKey.DELETE_TOPICS, 6, {"topics": [{"name": NAME}], "timeout_ms": 5000})
    assert [r.error_code for r in deleted.responses] == [UNKNOWN]
    grow = {"topics": [{"name": NAME, "count": 2, "assignments": None}], "timeout_ms": 5000}
    grown = broker.ask(ApiKey.CREATE_PARTITIONS, 3, grow | {"validate_only": False})
    assert [r.error_code for r in grown.results] == [UNKNOWN]
