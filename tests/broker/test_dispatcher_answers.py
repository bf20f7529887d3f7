"""What the handlers answer, through the real dispatcher and codec, for behaviours the other
tests do not reach: the cluster view a client gets (fenced brokers left out, racks, offline
replicas, each listener's addresses), the refusals of what runnel does not support
(manual replica assignments, transactions), the config requests' checks on this broker and
APPEND/SUBTRACT forwarded, broker DescribeConfigs, the effective configs of a CreateTopics
success, topics
named by id, read_committed fetches, the idempotent producer on the wire and the cap on an
acks=-1 wait.

The harness is ``test_dispatcher``'s (one broker, id 1, leading "orders" partition 0); other
metadata images are built by replaying records onto it, as the broker's image would be.
The controller is a stand-in that answers with the real controller's decisions and records
what it was asked; a request the stand-in is not made for fails the test.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import itertools
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from dispatch_leader import FETCH_V, DispatchLeader
from dispatch_leader import values as fetched_values
from support import make_batch
from test_dispatcher import CONNECTION, ME, TOPIC_ID, FakeController, Harness

import broker.handlers.produce as produce_handler
from broker.dispatcher import KafkaDispatcher
from broker.producer_ids import ProducerIdManager
from broker.protocol import ApiKey, ErrorCode, decode_response
from broker.server import ConnectionInfo
from controller import configs as controller_configs
from controller import records as rec
from controller import topics as controller_topics
from controller.configs import BROKER_CONFIGS, TOPIC_CONFIGS
from controller.image import MetadataDelta, MetadataImage
from controller.outcome import DecisionError, Outcome
from controller.records import ConfigResourceType
from proto import controller_pb2 as cpb
from storage.config import LogConfig

PEER, FENCED, UNREGISTERED = 2, 3, 4
INTERNAL = ConnectionInfo("10.0.0.9:5555", 2, "INTERNAL")
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4  # Kafka's ConfigResource.Type codes
TOPIC_CONFIG, DYNAMIC_BROKER, DYNAMIC_DEFAULT_BROKER, STATIC_BROKER, DEFAULT = 1, 2, 3, 4, 5
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # Kafka's AlterConfigOp.OpType codes


class Controller(FakeController):
    """Answers DescribeCluster (with the real controller's function, over the broker's
    current image) and the topic, config and producer-id requests with the real controller's
    decisions, their records replayed onto the broker's image at once (as once they reach
    it); anything else forwarded fails the test."""

    def __init__(self, harness: Harness) -> None:
        super().__init__()
        self.harness = harness
        topic_ids = (n.to_bytes(16, "big") for n in itertools.count(1))
        self.decisions: dict[str, Callable[[MetadataImage, Any], Outcome[Any]]] = {
            "CreateTopics": lambda image, request: controller_topics.create_topics(
                image, request, controller_topics.TopicDefaults(), lambda: next(topic_ids), 0
            ),
            "DeleteTopics": controller_topics.delete_topics,
            "CreatePartitions": lambda image, request: controller_topics.create_partitions(
                image, request, 0
            ),
            "AllocateProducerIds": controller_configs.allocate_producer_ids,
            "IncrementalAlterConfigs": controller_configs.incremental_alter_configs,
        }

    async def call(self, method: str, request: Any) -> Any:
        self.calls.append((method, request))
        image = self.harness.image
        if method == "DescribeCluster":
            return controller_configs.describe_cluster(image, {}, 1, image.offset)
        if method not in self.decisions:
            raise AssertionError(f"unexpected {method}: nothing else is forwarded in these tests")
        try:
            outcome = self.decisions[method](image, request)
        except DecisionError as e:  # as controller.service answers it
            header = cpb.ResponseHeader(error=e.code, message=e.message)  # type: ignore[arg-type]
            return getattr(cpb, f"{method}Response")(header=header)
        set_image(self.harness, replayed(image, outcome.records))
        return outcome.response


def replayed(base: MetadataImage, records: Sequence[rec.MetadataRecord]) -> MetadataImage:
    delta = MetadataDelta(base)
    for offset, record in enumerate(records, start=base.offset + 1):
        delta.replay(record, offset)
    return delta.apply()


def set_image(harness: Harness, image: MetadataImage) -> None:
    harness.image = image  # the context reads it through a lambda
    harness.dispatcher.context.replicas.apply(image)


def cluster_records() -> list[rec.MetadataRecord]:
    """Brokers 1 (this one; rack-a) and 2 (no rack) on two listeners, 3 fenced (rack-c);
    "orders" partition 0 on 1, 2, 3 and 4 (4 never registered), led here."""
    return [
        rec.register_broker(
            ME, 1, b"i" * 16,
            [("CLIENT", "127.0.0.1", 9092), ("INTERNAL", "10.0.0.1", 19092)],
            rack="rack-a", fenced=False,
        ),
        rec.register_broker(
            PEER, 1, b"j" * 16,
            [("CLIENT", "127.0.0.2", 9092), ("INTERNAL", "10.0.0.2", 19092)],
            fenced=False,
        ),
        rec.register_broker(
            FENCED, 1, b"k" * 16,
            [("CLIENT", "127.0.0.3", 9092), ("INTERNAL", "10.0.0.3", 19092)],
            rack="rack-c", fenced=False,
        ),
        rec.fence_broker(FENCED, 1),
        rec.partition(TOPIC_ID, 0, [ME, PEER, FENCED, UNREGISTERED], [ME, PEER], leader=ME),
    ]  # fmt: skip


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path / "data", auto_create=False)
    controller = Controller(harness)
    harness.controller = controller
    context = harness.dispatcher.context
    context.controller = controller  # type: ignore[assignment]
    context.producer_ids = ProducerIdManager(ME, controller, lambda: 0)
    yield harness
    harness.logs.shutdown()


@pytest.fixture
def cluster(broker: Harness) -> Harness:
    set_image(broker, replayed(broker.image, cluster_records()))
    return broker


def listener_dispatcher(harness: Harness, name: str) -> KafkaDispatcher:
    """The dispatcher of another listener of the same broker, made as broker.runtime makes
    it: the same context with that listener's name."""
    context = harness.dispatcher.context
    settings = dataclasses.replace(context.settings, listener_name=name)
    other = dataclasses.replace(context, settings=settings)
    other.fetch_sessions = context.fetch_sessions
    return KafkaDispatcher(other)


def ask_on(
    harness: Harness,
    dispatcher: KafkaDispatcher,
    connection: ConnectionInfo,
    api_key: int,
    version: int,
    body: dict[str, Any],
) -> Any:
    frame = harness.frame(api_key, version, body)

    async def answer() -> Any:  # in a running loop, as the listener calls it
        reply = dispatcher.handle(frame, connection)
        return await _bounded(reply) if inspect.isawaitable(reply) else reply

    reply = asyncio.run(answer())
    assert isinstance(reply, list)
    data = b"".join(bytes(p) for p in reply)  # type: ignore[arg-type]
    correlation_id, response = decode_response(api_key, version, memoryview(data)[4:])
    assert correlation_id == harness.correlation_id
    return response


async def _bounded(reply: Any) -> Any:
    return await asyncio.wait_for(reply, 10)


def latest_offset(harness: Harness) -> int:
    partitions = [{"partition_index": 0, "timestamp": -1}]
    body = {"replica_id": -1, "topics": [{"name": "orders", "partitions": partitions}]}
    offset: int = harness.ask(ApiKey.LIST_OFFSETS, 7, body).topics[0].partitions[0].offset
    return offset


# -- the cluster view: Metadata and DescribeCluster --------------------------------------------


def _metadata(harness: Harness, dispatcher: KafkaDispatcher, connection: ConnectionInfo) -> Any:
    body = {"topics": [{"name": "orders"}], "allow_auto_topic_creation": False}
    return ask_on(harness, dispatcher, connection, ApiKey.METADATA, 12, body)


def test_metadata_leaves_fenced_brokers_out_and_answers_racks(cluster: Harness) -> None:
    response = _metadata(cluster, cluster.dispatcher, CONNECTION)
    assert [(b.node_id, b.host, b.port, b.rack) for b in response.brokers] == [
        (ME, "127.0.0.1", 9092, "rack-a"),
        (PEER, "127.0.0.2", 9092, None),
    ]


def test_metadata_with_every_broker_fenced_lists_this_broker_alone(cluster: Harness) -> None:
    """Never an answer with no broker: librdkafka 2.13-2.16 would drop every broker for good
    (confluentinc/librdkafka#5301)."""
    set_image(cluster, replayed(cluster.image, [rec.fence_broker(ME, 1)]))
    brokers = _metadata(cluster, cluster.dispatcher, CONNECTION).brokers
    assert [b.node_id for b in brokers] == [PEER]  # another is unfenced: this one left out
    set_image(cluster, replayed(cluster.image, [rec.fence_broker(PEER, 1)]))
    response = _metadata(cluster, cluster.dispatcher, CONNECTION)
    assert [(b.node_id, b.host, b.port, b.rack) for b in response.brokers] == [
        (ME, "127.0.0.1", 9092, "rack-a")
    ]
    (partition,) = response.topics[0].partitions
    assert partition.offline_replicas == [ME, PEER, FENCED, UNREGISTERED]  # still fenced


def test_metadata_lists_replicas_on_fenced_or_unregistered_brokers_as_offline(
    cluster: Harness,
) -> None:
    (topic,) = _metadata(cluster, cluster.dispatcher, CONNECTION).topics
    (partition,) = topic.partitions
    assert partition.replica_nodes == [ME, PEER, FENCED, UNREGISTERED]
    assert partition.isr_nodes == [ME, PEER]
    assert partition.offline_replicas == [FENCED, UNREGISTERED]


def test_metadata_answers_each_listener_with_the_addresses_on_that_listener(
    cluster: Harness,
) -> None:
    internal = listener_dispatcher(cluster, "INTERNAL")
    on_client = _metadata(cluster, cluster.dispatcher, CONNECTION).brokers
    on_internal = _metadata(cluster, internal, INTERNAL).brokers
    assert [(b.node_id, b.host, b.port) for b in on_client] == [
        (ME, "127.0.0.1", 9092),
        (PEER, "127.0.0.2", 9092),
    ]
    assert [(b.node_id, b.host, b.port) for b in on_internal] == [
        (ME, "10.0.0.1", 19092),
        (PEER, "10.0.0.2", 19092),
    ]


def test_describe_cluster_asks_the_controller_and_answers_unfenced_brokers_with_racks(
    cluster: Harness,
) -> None:
    body = {"include_cluster_authorized_operations": False, "endpoint_type": 1}
    internal = listener_dispatcher(cluster, "INTERNAL")
    for dispatcher, connection, hosts in [
        (cluster.dispatcher, CONNECTION, [("127.0.0.1", 9092), ("127.0.0.2", 9092)]),
        (internal, INTERNAL, [("10.0.0.1", 19092), ("10.0.0.2", 19092)]),
    ]:
        response = ask_on(cluster, dispatcher, connection, ApiKey.DESCRIBE_CLUSTER, 1, body)
        assert response.error_code == ErrorCode.NONE and response.cluster_id == "cluster-x"
        assert [(b.broker_id, b.host, b.port, b.rack) for b in response.brokers] == [
            (ME, *hosts[0], "rack-a"),
            (PEER, *hosts[1], None),
        ]
    assert [method for method, _ in cluster.controller.calls] == ["DescribeCluster"] * 2


# -- refusals of what runnel does not support ---------------------------------------------------


def config_resource(kind: int, name: str, *configs: tuple[str, int, str | None]) -> dict[str, Any]:
    return {
        "resource_type": kind,
        "resource_name": name,
        "configs": [{"name": n, "config_operation": op, "value": v} for n, op, v in configs],
    }


def alter_incrementally(broker: Harness, *resources: dict[str, Any]) -> list[tuple[str, int, str]]:
    body = {"resources": list(resources), "validate_only": False}
    response = broker.ask(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, body)
    return [(r.resource_name, r.error_code, r.error_message) for r in response.responses]


def alter_legacy(broker: Harness, *resources: dict[str, Any]) -> list[tuple[str, int, str]]:
    for resource in resources:  # AlterConfigs entries have no operation
        resource["configs"] = [
            {"name": c["name"], "value": c["value"]} for c in resource["configs"]
        ]
    body = {"resources": list(resources), "validate_only": False}
    response = broker.ask(ApiKey.ALTER_CONFIGS, 2, body)
    return [(r.resource_name, r.error_code, r.error_message) for r in response.responses]


def test_an_illegal_topic_name_in_an_alter_is_invalid_topic_exception(broker: Harness) -> None:
    """As DescribeConfigs answers it, and as Kafka's controller checks it before the lookup
    (both alter APIs); a legal name no topic has stays UNKNOWN_TOPIC_OR_PARTITION."""
    for alter in (alter_incrementally, alter_legacy):
        bad = config_resource(TOPIC_RESOURCE, "bad name!", ("retention.ms", SET, "5"))
        absent = config_resource(TOPIC_RESOURCE, "absent", ("retention.ms", SET, "5"))
        got = [(name, code) for name, code, _ in alter(broker, bad, absent)]
        assert got == [
            ("bad name!", ErrorCode.INVALID_TOPIC_EXCEPTION),
            ("absent", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ], alter.__name__


def test_append_and_subtract_are_forwarded_and_change_list_configs(broker: Harness) -> None:
    topic = ConfigResourceType.TOPIC
    append = config_resource(TOPIC_RESOURCE, "orders", ("cleanup.policy", APPEND, "compact"))
    assert alter_incrementally(broker, append) == [("orders", ErrorCode.NONE, None)]
    assert broker.image.configs[(topic, "orders")] == {"cleanup.policy": "compact,delete"}
    subtract = config_resource(TOPIC_RESOURCE, "orders", ("cleanup.policy", SUBTRACT, "delete"))
    assert alter_incrementally(broker, subtract) == [("orders", ErrorCode.NONE, None)]
    assert broker.image.configs[(topic, "orders")] == {"cleanup.policy": "compact"}
    not_a_list = config_resource(TOPIC_RESOURCE, "orders", ("retention.ms", APPEND, "5"))
    assert alter_incrementally(broker, not_a_list) == [
        (
            "orders",
            ErrorCode.INVALID_CONFIG,
            "Can't APPEND to key retention.ms because its type is not LIST.",
        )
    ]
    assert [m for m, _ in broker.controller.calls] == ["IncrementalAlterConfigs"] * 3


def test_alter_configs_of_another_broker_is_refused_without_forwarding(broker: Harness) -> None:
    def resources() -> list[dict[str, Any]]:
        return [
            config_resource(BROKER_RESOURCE, name, ("log.retention.ms", SET, "1000"))
            for name in ("999", "x")
        ]

    expected = [
        (
            "999",
            ErrorCode.INVALID_REQUEST,
            f"Unexpected broker id, expected {ME}, but received 999",
        ),
        ("x", ErrorCode.INVALID_REQUEST, "Node id must be an integer, but it is: x"),
    ]
    assert alter_incrementally(broker, *resources()) == expected
    assert alter_legacy(broker, *resources()) == expected
    assert broker.controller.calls == []
    mine = config_resource(BROKER_RESOURCE, str(ME), ("log.retention.ms", SET, "1000"))
    cluster_wide = config_resource(BROKER_RESOURCE, "", ("log.retention.ms", SET, "2000"))
    assert [code for _, code, _ in alter_incrementally(broker, mine, cluster_wide)] == [0, 0]


def test_a_config_named_twice_is_refused_without_forwarding(broker: Harness) -> None:
    def twice() -> dict[str, Any]:
        return config_resource(
            TOPIC_RESOURCE, "orders", ("retention.ms", SET, "1000"), ("retention.ms", SET, "2000")
        )

    expected = [("orders", ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")]
    assert alter_legacy(broker, twice()) == expected
    assert alter_incrementally(broker, twice()) == expected
    assert broker.controller.calls == []


def test_a_null_value_is_refused_without_forwarding_except_in_a_delete(broker: Harness) -> None:
    def with_nulls(*ops: int) -> dict[str, Any]:
        names = ("retention.ms", "segment.ms", "cleanup.policy", "flush.ms")
        return config_resource(
            TOPIC_RESOURCE, "orders", *((n, op, None) for n, op in zip(names, ops, strict=False))
        )

    message = "Null value not supported for : retention.ms, segment.ms"
    assert alter_legacy(broker, with_nulls(SET, SET)) == [
        ("orders", ErrorCode.INVALID_REQUEST, message)
    ]
    message = "Null value not supported for : retention.ms, cleanup.policy, flush.ms"
    assert alter_incrementally(broker, with_nulls(SET, DELETE, APPEND, SUBTRACT)) == [
        ("orders", ErrorCode.INVALID_REQUEST, message)
    ]
    assert broker.controller.calls == []


def test_create_topics_with_manual_assignments_is_refused_without_forwarding(
    broker: Harness,
) -> None:
    topic = {
        "name": "manual",
        "num_partitions": -1,
        "replication_factor": -1,
        "assignments": [{"partition_index": 0, "broker_ids": [ME]}],
        "configs": [],
    }
    response = broker.ask(ApiKey.CREATE_TOPICS, 7, {"topics": [topic], "timeout_ms": 1000})
    (result,) = response.topics
    assert (result.name, result.error_code) == ("manual", ErrorCode.INVALID_REQUEST)
    assert "assignment" in result.error_message
    assert broker.controller.calls == []


def test_create_partitions_with_assignments_is_refused_without_forwarding(broker: Harness) -> None:
    topic = {"name": "orders", "count": 2, "assignments": [{"broker_ids": [ME]}]}
    body = {"topics": [topic], "timeout_ms": 1000, "validate_only": False}
    (result,) = broker.ask(ApiKey.CREATE_PARTITIONS, 3, body).results
    assert (result.name, result.error_code) == ("orders", ErrorCode.INVALID_REQUEST)
    assert "assignment" in result.error_message
    assert broker.controller.calls == []


def test_init_producer_id_refuses_a_transactional_id(broker: Harness) -> None:
    body = {"transactional_id": "tx-1", "transaction_timeout_ms": 60_000}
    response = broker.ask(ApiKey.INIT_PRODUCER_ID, 4, body)
    assert response.error_code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert (response.producer_id, response.producer_epoch) == (-1, -1)
    assert broker.controller.calls == []  # no producer id block asked for


def test_produce_with_a_transactional_id_is_refused_per_partition_and_not_appended(
    broker: Harness,
) -> None:
    partitions = [{"index": i, "records": make_batch([b"t"])} for i in (0, 1)]
    body = {
        "transactional_id": "tx-1",
        "acks": 1,
        "timeout_ms": 1000,
        "topic_data": [{"name": "orders", "partition_data": partitions}],
    }
    (topic,) = broker.ask(ApiKey.PRODUCE, 9, body).responses
    assert [(p.index, p.error_code, p.base_offset) for p in topic.partition_responses] == [
        (0, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1),
        (1, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1),
    ]
    assert latest_offset(broker) == 0


# -- DescribeConfigs of a broker ----------------------------------------------------------------


def test_describe_configs_of_a_broker_lists_its_configs_and_where_dynamic_ones_come_from(
    broker: Harness,
) -> None:
    kind = ConfigResourceType.BROKER
    set_image(
        broker,
        replayed(
            broker.image,
            [
                rec.config(kind, "", "log.retention.ms", "2000"),
                rec.config(kind, "", "log.segment.bytes", "1048576"),
                rec.config(kind, str(ME), "log.retention.ms", "1000"),
            ],
        ),
    )
    resources = [
        {"resource_type": BROKER_RESOURCE, "resource_name": name, "configuration_keys": None}
        for name in ("", str(ME), "7", "x")
    ]
    body = {"resources": resources, "include_synonyms": False, "include_documentation": False}
    cluster_wide, mine, other, bad = broker.ask(ApiKey.DESCRIBE_CONFIGS, 4, body).results

    def dynamic(result: Any) -> dict[str, tuple[str, int]]:
        return {
            c.name: (c.value, c.config_source)
            for c in result.configs
            if c.config_source in (DYNAMIC_BROKER, DYNAMIC_DEFAULT_BROKER)
        }

    assert (mine.error_code, [c.name for c in mine.configs]) == (0, sorted(BROKER_CONFIGS))
    assert dynamic(mine) == {
        "log.retention.ms": ("1000", DYNAMIC_BROKER),  # its own value before the cluster's
        "log.segment.bytes": ("1048576", DYNAMIC_DEFAULT_BROKER),
    }
    # "": only the cluster-wide entries set, as Kafka's currentDynamicDefaultConfigs
    assert cluster_wide.error_code == ErrorCode.NONE
    assert [(c.name, c.value, c.config_source) for c in cluster_wide.configs] == [
        ("log.retention.ms", "2000", DYNAMIC_DEFAULT_BROKER),
        ("log.segment.bytes", "1048576", DYNAMIC_DEFAULT_BROKER),
    ]
    assert [(r.resource_name, r.error_code, r.error_message, r.configs) for r in (other, bad)] == [
        (
            "7",
            ErrorCode.INVALID_REQUEST,
            f"Unexpected broker id, expected {ME} or empty string, but received 7",
            [],
        ),
        ("x", ErrorCode.INVALID_REQUEST, "Broker id must be an integer, but it is: x", []),
    ]


def test_describe_configs_of_another_registered_broker_is_invalid_request(cluster: Harness) -> None:
    resource = {
        "resource_type": BROKER_RESOURCE,
        "resource_name": str(PEER),
        "configuration_keys": None,
    }
    body = {"resources": [resource], "include_synonyms": False, "include_documentation": False}
    (result,) = cluster.ask(ApiKey.DESCRIBE_CONFIGS, 4, body).results
    assert (result.error_code, result.configs) == (ErrorCode.INVALID_REQUEST, [])


# -- topics named by id -------------------------------------------------------------------------


def test_metadata_v12_answers_a_topic_named_by_id(broker: Harness) -> None:
    body = {"topics": [{"topic_id": uuid.UUID(bytes=TOPIC_ID), "name": None}]}
    (topic,) = broker.ask(ApiKey.METADATA, 12, body | {"allow_auto_topic_creation": False}).topics
    assert (topic.error_code, topic.name, topic.topic_id.bytes) == (
        ErrorCode.NONE,
        "orders",
        TOPIC_ID,
    )
    assert [p.partition_index for p in topic.partitions] == [0]


def test_metadata_v12_answers_an_unknown_topic_id_with_unknown_topic_id(broker: Harness) -> None:
    unknown = uuid.UUID(bytes=b"\xee" * 16)
    topics = [
        {"topic_id": unknown, "name": None},
        {"topic_id": uuid.UUID(bytes=TOPIC_ID), "name": None},
    ]
    body = {"topics": topics, "allow_auto_topic_creation": False}
    answered = broker.ask(ApiKey.METADATA, 12, body).topics
    assert [(t.error_code, t.name, t.topic_id) for t in answered] == [
        (ErrorCode.NONE, "orders", uuid.UUID(bytes=TOPIC_ID)),
        (ErrorCode.UNKNOWN_TOPIC_ID, None, unknown),
    ]


def test_delete_topics_v6_by_id_forwards_the_topic_s_name(broker: Harness) -> None:
    unknown = uuid.UUID(bytes=b"\xff" * 16)
    topics = [
        {"name": None, "topic_id": uuid.UUID(bytes=TOPIC_ID)},
        {"name": None, "topic_id": unknown},
    ]
    response = broker.ask(ApiKey.DELETE_TOPICS, 6, {"topics": topics, "timeout_ms": 5000})
    ((method, request),) = broker.controller.calls
    assert (method, list(request.names)) == ("DeleteTopics", ["orders"])
    # the controller deletes "orders" only if it still has that id (this image may lag)
    assert dict(request.topic_ids) == {"orders": TOPIC_ID}
    assert {(r.name, r.topic_id, r.error_code) for r in response.responses} == {
        ("orders", uuid.UUID(bytes=TOPIC_ID), ErrorCode.NONE),
        (None, unknown, ErrorCode.UNKNOWN_TOPIC_ID),
    }  # in no promised order: Kafka shuffles them
    assert "orders" not in broker.image.topic_ids


# -- Kafka's checks of admin requests, DescribeCluster and InitProducerId ------------------------

ZERO_ID = uuid.UUID(int=0)


def with_topics(harness: Harness, *names: str) -> dict[str, uuid.UUID]:
    """Adds one-partition topics (ids 0x70, 0x71, ...) to the broker's image; their ids."""
    ids = {name: bytes([0x70 + i]) * 16 for i, name in enumerate(names)}
    records = [rec.topic(name, i) for name, i in ids.items()]
    records += [rec.partition(i, 0, [ME], [ME], leader=ME) for i in ids.values()]
    set_image(harness, replayed(harness.image, records))
    return {name: uuid.UUID(bytes=i) for name, i in ids.items()}


def deleted(harness: Harness, version: int, body: dict[str, Any]) -> set[tuple[Any, ...]]:
    response = harness.ask(ApiKey.DELETE_TOPICS, version, body | {"timeout_ms": 5000})
    return {(r.name, r.topic_id, r.error_code, r.error_message) for r in response.responses}


def test_delete_topics_v6_refuses_an_entry_with_both_a_name_and_an_id_or_neither(
    broker: Harness,
) -> None:
    unknown = uuid.UUID(bytes=b"\xee" * 16)
    topics = [{"name": "orders", "topic_id": unknown}, {"name": None, "topic_id": ZERO_ID}]
    assert deleted(broker, 6, {"topics": topics}) == {
        ("orders", unknown, ErrorCode.INVALID_REQUEST,
         "You may not specify both topic name and topic id."),
        (None, ZERO_ID, ErrorCode.INVALID_REQUEST, "Neither topic name nor id were specified."),
    }  # fmt: skip
    assert broker.controller.calls == [] and "orders" in broker.image.topic_ids


def test_delete_topics_by_name_answers_the_topic_s_id(broker: Harness) -> None:
    topics = [{"name": "orders", "topic_id": ZERO_ID}]
    assert deleted(broker, 6, {"topics": topics}) == {
        ("orders", uuid.UUID(bytes=TOPIC_ID), ErrorCode.NONE, None)
    }
    assert "orders" not in broker.image.topic_ids


def test_delete_topics_answers_each_repeated_name_or_id_once_and_deletes_none_of_them(
    broker: Harness,
) -> None:
    ids = with_topics(broker, "payments", "audit", "spare")
    topics = [
        {"name": "orders", "topic_id": ZERO_ID},
        {"name": None, "topic_id": ids["payments"]},
        {"name": "orders", "topic_id": ZERO_ID},
        {"name": None, "topic_id": ids["payments"]},
        {"name": None, "topic_id": ids["audit"]},
        {"name": "audit", "topic_id": ZERO_ID},  # the name of an id given too
        {"name": "spare", "topic_id": ZERO_ID},
    ]
    assert deleted(broker, 6, {"topics": topics}) == {
        ("orders", ZERO_ID, ErrorCode.INVALID_REQUEST, "Duplicate topic name."),
        (None, ids["payments"], ErrorCode.INVALID_REQUEST, "Duplicate topic id."),
        ("audit", ids["audit"], ErrorCode.INVALID_REQUEST,
         "The provided topic name maps to an ID that was already supplied."),
        ("spare", ids["spare"], ErrorCode.NONE, None),
    }  # fmt: skip
    assert [list(r.names) for _, r in broker.controller.calls] == [["spare"]]
    assert sorted(broker.image.topic_ids) == ["audit", "orders", "payments"]
    (v5,) = deleted(broker, 5, {"topic_names": ["orders", "orders"]})
    assert v5[0::2] == ("orders", ErrorCode.INVALID_REQUEST)


def test_create_topics_answers_a_repeated_name_once_even_with_assignments(broker: Harness) -> None:
    def topic(name: str, *assigned: int) -> dict[str, Any]:
        assignments = [{"partition_index": 0, "broker_ids": [b]} for b in assigned]
        return {
            "name": name, "num_partitions": 1 if not assigned else -1, "replication_factor": 1,
            "assignments": assignments, "configs": [],
        }  # fmt: skip

    topics = [topic("twice"), topic("fresh"), topic("twice", ME)]
    response = broker.ask(ApiKey.CREATE_TOPICS, 7, {"topics": topics, "timeout_ms": 5000})
    assert [(t.name, t.error_code, t.error_message) for t in response.topics] == [
        ("twice", ErrorCode.INVALID_REQUEST, "Duplicate topic name."),
        ("fresh", ErrorCode.NONE, None),
    ]
    assert "fresh" in broker.image.topic_ids and "twice" not in broker.image.topic_ids


def test_create_topics_answers_the_topic_s_whole_effective_config_set(broker: Harness) -> None:
    """Kafka's buildCreatableTopicResult: every topic config, by name, with its value and
    source as DescribeConfigs then lists them (set in the request: TOPIC_CONFIG, as the
    controller commits it; else this broker's dynamic config, the cluster-wide one, the
    node's [log] section, or the default); validate_only answers the same, creating nothing."""
    context = broker.dispatcher.context
    context.settings = dataclasses.replace(
        context.settings, log_defaults=LogConfig(index_interval_bytes=8192)
    )
    kind = ConfigResourceType.BROKER
    dynamic = [
        rec.config(kind, str(ME), "log.segment.bytes", "2097152"),
        rec.config(kind, "", "log.retention.bytes", "5000"),
        rec.config(kind, "", "log.retention.ms", "2000"),
    ]
    set_image(broker, replayed(broker.image, dynamic))
    configs = [
        {"name": "retention.ms", "value": "1000"},
        {"name": "unclean.leader.election.enable", "value": "TRUE"},
    ]

    def shown(entries: Any) -> list[tuple[str, str, bool, int, bool]]:
        return [(c.name, c.value, c.read_only, c.config_source, c.is_sensitive) for c in entries]

    def create(name: str, validate_only: bool) -> list[tuple[str, str, bool, int, bool]]:
        topic = {
            "name": name, "num_partitions": 1, "replication_factor": 1,
            "assignments": [], "configs": configs,
        }  # fmt: skip
        body = {"topics": [topic], "timeout_ms": 5000, "validate_only": validate_only}
        (answer,) = broker.ask(ApiKey.CREATE_TOPICS, 7, body).topics
        assert (answer.name, answer.error_code) == (name, ErrorCode.NONE)
        return shown(answer.configs)

    created = create("audit", validate_only=False)
    assert [c[0] for c in created] == sorted(TOPIC_CONFIGS)
    not_default = {c[0]: (c[1], c[3]) for c in created if c[3] != DEFAULT}
    assert not_default == {
        "retention.ms": ("1000", TOPIC_CONFIG),
        "unclean.leader.election.enable": ("true", TOPIC_CONFIG),
        "segment.bytes": ("2097152", DYNAMIC_BROKER),
        "retention.bytes": ("5000", DYNAMIC_DEFAULT_BROKER),
        "index.interval.bytes": ("8192", STATIC_BROKER),
    }
    assert not any(c[2] or c[4] for c in created)  # none read-only or sensitive
    resource = {"resource_type": TOPIC_RESOURCE, "resource_name": "audit"}
    body = {
        "resources": [resource | {"configuration_keys": None}],
        "include_synonyms": False,
        "include_documentation": False,
    }
    (described,) = broker.ask(ApiKey.DESCRIBE_CONFIGS, 4, body).results
    assert created == shown(described.configs)
    assert create("dry", validate_only=True) == created
    assert "dry" not in broker.image.topic_ids


def test_create_topics_asking_over_10000_partitions_in_all_is_refused_for_every_entry(
    broker: Harness,
) -> None:
    def topic(name: str, partitions: int) -> dict[str, Any]:
        return {
            "name": name, "num_partitions": partitions, "replication_factor": 1,
            "assignments": [], "configs": [],
        }  # fmt: skip

    # 10,001 in all; a repeated name counts nothing, but is answered at each entry
    topics = [topic("a", 6000), topic("b", 4000), topic("d", 9), topic("c", 1), topic("d", 1)]
    response = broker.ask(ApiKey.CREATE_TOPICS, 7, {"topics": topics, "timeout_ms": 5000})
    message = "Excessively large number of partitions per request."
    assert [(t.name, t.error_code, t.error_message) for t in response.topics] == [
        (n, ErrorCode.POLICY_VIOLATION, message) for n in ("a", "b", "d", "c", "d")
    ]
    assert [(t.num_partitions, t.replication_factor) for t in response.topics] == [(-1, -1)] * 5
    assert sorted(broker.image.topic_ids) == ["orders"]


def test_create_partitions_answers_a_repeated_name_once(broker: Harness) -> None:
    topics = [{"name": "orders", "count": 2, "assignments": None}] * 2
    body = {"topics": topics, "timeout_ms": 5000, "validate_only": False}
    results = broker.ask(ApiKey.CREATE_PARTITIONS, 3, body).results
    assert [(r.name, r.error_code, r.error_message) for r in results] == [
        ("orders", ErrorCode.INVALID_REQUEST, "Duplicate topic name.")
    ]
    assert len(broker.image.topics[TOPIC_ID].partitions) == 1


def test_describe_cluster_of_controllers_is_a_mismatched_endpoint_type_and_unknown_unsupported(
    broker: Harness,
) -> None:
    def ask(endpoint_type: int) -> tuple[int, str, str, int]:
        body = {"include_cluster_authorized_operations": False, "endpoint_type": endpoint_type}
        r = broker.ask(ApiKey.DESCRIBE_CLUSTER, 1, body)
        return (r.error_code, r.error_message, r.cluster_id, r.controller_id)

    assert ask(2) == (
        ErrorCode.MISMATCHED_ENDPOINT_TYPE,
        "The request was sent to an endpoint of type BROKER, "
        "but we wanted an endpoint of type CONTROLLER",
        "",
        -1,
    )
    for unknown in (0, 3):
        assert ask(unknown) == (
            ErrorCode.UNSUPPORTED_ENDPOINT_TYPE,
            f"Unsupported endpoint type {unknown}",
            "",
            -1,
        )
    assert broker.controller.calls == []


@pytest.mark.parametrize(
    ("transactional_id", "producer_id", "producer_epoch"),
    [("", -1, -1), (None, 5, -1), (None, -1, 3), ("tx-1", 5, -1)],
)
def test_init_producer_id_refuses_an_empty_transactional_id_or_half_a_producer(
    broker: Harness, transactional_id: str | None, producer_id: int, producer_epoch: int
) -> None:
    body = {
        "transactional_id": transactional_id,
        "transaction_timeout_ms": 60_000,
        "producer_id": producer_id,
        "producer_epoch": producer_epoch,
    }
    response = broker.ask(ApiKey.INIT_PRODUCER_ID, 4, body)
    assert (response.error_code, response.producer_id, response.producer_epoch) == (
        ErrorCode.INVALID_REQUEST,
        -1,
        -1,
    )
    assert broker.controller.calls == []


def test_init_producer_id_with_an_idempotent_producer_s_id_and_epoch_gets_a_new_id(
    broker: Harness,
) -> None:
    body = {"transactional_id": None, "transaction_timeout_ms": 60_000}
    response = broker.ask(
        ApiKey.INIT_PRODUCER_ID, 4, body | {"producer_id": 5, "producer_epoch": 3}
    )
    assert (response.error_code, response.producer_epoch) == (ErrorCode.NONE, 0)
    assert response.producer_id >= 0 and response.producer_id != 5


# -- Fetch isolation levels ---------------------------------------------------------------------


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[DispatchLeader]:
    made = DispatchLeader(tmp_path / "leader")  # "orders" 0: replicas 1 (here) and 2, ISR both
    yield made
    made.logs.shutdown()


def test_read_committed_answers_no_aborted_transactions_and_the_high_watermark_as_lso(
    leader: DispatchLeader,
) -> None:
    def fetch(replica_id: int, offset: int, isolation_level: int = 0) -> Any:
        body = leader.fetch_body({0: {"fetch_offset": offset}}, replica_id=replica_id)
        response = leader.send(ApiKey.FETCH, FETCH_V, body | {"isolation_level": isolation_level})
        return response.responses[0].partitions[0]

    async def main() -> None:
        for value in (b"a", b"b", b"c"):
            leader.produce([value], acks=1)
        fetch(2, 0)  # the follower reads everything
        assert fetch(2, 2).high_watermark == 2  # and says it has the first two
        (partition,) = leader.replicas.partitions()
        assert partition.log_end_offset == 3
        committed = fetch(-1, 0, isolation_level=1)
        assert committed.error_code == ErrorCode.NONE
        assert (committed.high_watermark, committed.last_stable_offset) == (2, 2)
        assert committed.aborted_transactions == []
        assert fetched_values(committed.records) == [b"a", b"b"]
        uncommitted = fetch(-1, 0, isolation_level=0)
        assert uncommitted.error_code == ErrorCode.NONE
        assert uncommitted.aborted_transactions is None
        assert fetched_values(uncommitted.records) == [b"a", b"b"]

    asyncio.run(main())


# -- the idempotent producer on the wire --------------------------------------------------------


def test_idempotent_produce_answers_a_duplicate_with_its_offsets_and_refuses_a_gap(
    broker: Harness,
) -> None:
    def produce(values: list[bytes], sequence: int) -> Any:
        batch = make_batch(values, producer_id=4000, producer_epoch=0, base_sequence=sequence)
        body = {
            "transactional_id": None,
            "acks": -1,
            "timeout_ms": 1000,
            "topic_data": [{"name": "orders", "partition_data": [{"index": 0, "records": batch}]}],
        }
        (partition,) = broker.ask(ApiKey.PRODUCE, 9, body).responses[0].partition_responses
        return partition

    first = produce([b"a", b"b"], 0)
    assert (first.error_code, first.base_offset) == (ErrorCode.NONE, 0)
    again = produce([b"a", b"b"], 0)  # a retry of the same batch
    assert (again.error_code, again.base_offset) == (ErrorCode.NONE, 0)
    assert latest_offset(broker) == 2  # written once
    gap = produce([b"d"], 3)  # sequence 2 never sent
    assert (gap.error_code, gap.base_offset) == (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    assert latest_offset(broker) == 2
    following = produce([b"c"], 2)
    assert (following.error_code, following.base_offset) == (ErrorCode.NONE, 2)


# -- the acks=-1 wait cap -----------------------------------------------------------------------


def test_acks_all_waits_at_most_the_cap_whatever_timeout_it_asks(
    leader: DispatchLeader, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(produce_handler, "MAX_ACKS_TIMEOUT_MS", 50)

    async def main() -> None:
        reply = leader.produce([b"a"], acks=-1, timeout_ms=10**9)  # the follower never fetches
        assert inspect.isawaitable(reply)
        response = await asyncio.wait_for(reply, 5)
        (partition,) = response.responses[0].partition_responses
        assert (partition.error_code, partition.base_offset) == (ErrorCode.REQUEST_TIMED_OUT, -1)
        (replica,) = leader.replicas.partitions()
        assert replica.log_end_offset == 1 and not replica._waiting

    asyncio.run(main())
