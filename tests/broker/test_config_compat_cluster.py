"""Kafka-compatibility details of the config and topic APIs against a real cluster (the
``kafka`` fixture: a controller and brokers 101 and 102 in their own processes).

* A BROKER resource named "0101" is broker 101 for describing and for altering alike, as
  Kafka reads it (Integer.parseInt on the broker and on the controller); what is altered is
  broker 101's own entry.
* confluent-kafka's AdminClient (librdkafka asks for synonyms) gets each config's synonyms:
  the topic's own value, then the broker layers, each with its source.
* ``__cluster_metadata`` is an unknown topic to Metadata and may not be created.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic
from kafka_cluster import WAIT_S, KafkaCluster, kafka
from raw_client import RawClient, SharedCluster, unique_topic
from test_local_cluster import wait_for

from broker.protocol import ApiKey, ErrorCode

__all__ = ["kafka"]  # the fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

BROKER_RESOURCE, TOPIC_RESOURCE = 4, 2  # Kafka's ConfigResource.Type codes
SET, DELETE = 0, 1  # Kafka's AlterConfigOp.OpType codes
DYNAMIC_BROKER = 2  # Kafka's ConfigSource code
# A broker config set to the value it has anyway, so the other tests sharing the cluster see
# no change: Kafka's "never" for log.flush.interval.messages.
HARMLESS = ("log.flush.interval.messages", str(2**63 - 1))


@pytest.fixture
def broker_101(kafka: KafkaCluster) -> Iterator[RawClient]:
    with SharedCluster.of(kafka).client(101) as client:
        yield client
        name, _ = HARMLESS
        forget = {"name": name, "config_operation": DELETE, "value": None}
        resource = {"resource_type": BROKER_RESOURCE, "resource_name": "101", "configs": [forget]}
        body = {"resources": [resource], "validate_only": False}
        client.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, body)


def describe_broker(client: RawClient, name: str) -> tuple[int, dict[str, tuple[str, int]]]:
    resource = {"resource_type": BROKER_RESOURCE, "resource_name": name, "configuration_keys": None}
    body = {"resources": [resource], "include_synonyms": False, "include_documentation": False}
    (result,) = client.request(ApiKey.DESCRIBE_CONFIGS, 4, body).results
    return result.error_code, {c.name: (c.value, c.config_source) for c in result.configs}


def test_a_broker_resource_named_0101_is_broker_101(broker_101: RawClient) -> None:
    assert describe_broker(broker_101, "0101") == describe_broker(broker_101, "101")
    assert describe_broker(broker_101, "0101")[0] == ErrorCode.NONE
    name, value = HARMLESS
    change = {"name": name, "config_operation": SET, "value": value}
    resource = {"resource_type": BROKER_RESOURCE, "resource_name": "0101", "configs": [change]}
    body = {"resources": [resource], "validate_only": False}
    (answer,) = broker_101.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, body).responses
    assert (answer.resource_name, answer.error_code) == ("0101", ErrorCode.NONE)
    assert describe_broker(broker_101, "101")[1][name] == (value, DYNAMIC_BROKER)


def test_confluent_kafka_gets_synonyms_nearest_first(kafka: KafkaCluster) -> None:
    topic = unique_topic("synonyms")
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    new = NewTopic(topic, 1, 1, config={"retention.ms": "3600000"})
    admin.create_topics([new])[topic].result(WAIT_S)
    resource = ConfigResource("TOPIC", topic)

    def described() -> dict[str, Any] | None:
        (future,) = admin.describe_configs([resource]).values()
        try:
            return dict(future.result(WAIT_S))
        except KafkaException:  # the broker asked may not have applied the topic yet
            return None

    retention = wait_for(f"{topic} to be described", described, WAIT_S)["retention.ms"]
    synonyms = [(s.name, s.value, s.source) for s in retention.synonyms.values()]
    assert synonyms == [
        ("retention.ms", "3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value),
        ("log.retention.ms", "604800000", ConfigSource.DEFAULT_CONFIG.value),
    ]
    assert (retention.value, retention.source) == (synonyms[0][1], synonyms[0][2])


def test_cluster_metadata_is_no_topic_and_cannot_be_created(kafka: KafkaCluster) -> None:
    name = "__cluster_metadata"
    with SharedCluster.of(kafka).client(101) as client:
        (listed,) = client.metadata([name]).topics
        assert listed.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    with pytest.raises(KafkaException) as raised:
        admin.create_topics([NewTopic(name, 1, 1)])[name].result(WAIT_S)
    error = raised.value.args[0]
    assert error.code() == KafkaError.INVALID_REQUEST, error
    assert f"Creation of internal topic {name} is prohibited." in error.str()
