"""The dispatcher and the handlers in one process, without sockets: frames in, frames out.

A broker context over real partition logs in a temp dir and a metadata image built from
records; the controller is a stand-in that records what was forwarded and answers as the
real one does (the controller's own behaviour is tested in tests/controller). These tests
cover what the real-cluster tests cannot reach cheaply: auto-creation on and off, the
answers to unsupported versions, Produce v0-v2 and FindCoordinator.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import make_batch

from broker.context import BrokerContext, BrokerSettings
from broker.dispatcher import KafkaDispatcher
from broker.handlers.metadata import AUTO_CREATE_LIMIT
from broker.producer_ids import ProducerIdManager
from broker.protocol import API_SPECS, ApiKey, ErrorCode, decode_response, encode_request
from broker.protocol.schema import RECORDS, Array, Struct
from broker.purgatory import FetchPurgatory
from broker.replica_manager import ReplicaManager
from broker.server import CloseConnection, ConnectionInfo
from controller import records as rec
from controller.image import MetadataDelta, MetadataImage
from proto import controller_pb2 as cpb
from storage.config import LogConfig
from storage.log_manager import LogManager

ME = 1
TOPIC_ID = bytes(range(16))
CONNECTION = ConnectionInfo("127.0.0.1:5555", 1, "CLIENT")


class FakeController:
    """Answers CreateTopics as the active controller would, and remembers the requests."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def call(self, method: str, request: Any) -> Any:
        self.calls.append((method, request))
        if method == "CreateTopics":
            return cpb.CreateTopicsResponse(
                topics=[cpb.CreatableTopicResult(name=t.name) for t in request.topics]
            )
        raise AssertionError(f"unexpected {method}")


def image() -> MetadataImage:
    records = [
        rec.register_broker(ME, 0, b"i" * 16, [("CLIENT", "127.0.0.1", 9092)], fenced=False),
        rec.topic("orders", TOPIC_ID),
        rec.partition(TOPIC_ID, 0, [ME], [ME], leader=ME),
    ]
    delta = MetadataDelta(MetadataImage.EMPTY)
    for offset, record in enumerate(records):
        delta.replay(record, offset)
    return delta.apply()


class Harness:
    def __init__(self, data_dir: Path, *, auto_create: bool) -> None:
        self.logs = LogManager([data_dir], LogConfig())
        self.logs.startup()
        self.controller = FakeController()
        purgatory = FetchPurgatory()
        replicas = ReplicaManager(ME, self.logs, purgatory=purgatory)
        self.image = image()
        replicas.apply(self.image)
        settings = BrokerSettings(ME, "cluster-x", "CLIENT", auto_create_topics_enable=auto_create)
        producer_ids = ProducerIdManager(ME, self.controller, lambda: 0)
        context = BrokerContext(
            settings, replicas, purgatory, producer_ids, self.controller, lambda: self.image
        )  # type: ignore[arg-type]
        self.dispatcher = KafkaDispatcher(context)
        self.correlation_id = 0

    def frame(self, api_key: int, version: int, body: dict[str, Any]) -> memoryview:
        self.correlation_id += 1
        parts = encode_request(api_key, version, self.correlation_id, "test", body)
        return memoryview(b"".join(bytes(p) for p in parts))[4:]  # type: ignore[arg-type]

    def raw(self, api_key: int, version: int, body: dict[str, Any]) -> bytes | None:
        frame = self.frame(api_key, version, body)

        async def answer() -> Any:  # in a running loop, as the listener calls it
            reply = self.dispatcher.handle(frame, CONNECTION)
            return await _wait(reply) if inspect.isawaitable(reply) else reply

        reply = asyncio.run(answer())
        if reply is None:
            return None
        assert isinstance(reply, list)
        return b"".join(p if isinstance(p, bytes | bytearray) else bytes(p) for p in reply)  # type: ignore[arg-type]

    def ask(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        data = self.raw(api_key, version, body)
        assert data is not None
        correlation_id, response = decode_response(api_key, version, memoryview(data)[4:])
        assert correlation_id == self.correlation_id
        return response


async def _wait(reply: Any) -> Any:
    return await asyncio.wait_for(reply, 10)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path / "data", auto_create=False)
    yield harness
    harness.logs.shutdown()


@pytest.fixture
def auto_creating(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path / "data", auto_create=True)
    yield harness
    harness.logs.shutdown()


def metadata_of(harness: Harness, names: list[str], *, allow: bool = True) -> Any:
    topics = [{"name": n} for n in names]
    return harness.ask(ApiKey.METADATA, 12, {"topics": topics, "allow_auto_topic_creation": allow})


def test_metadata_lists_this_broker_and_the_topic(broker: Harness) -> None:
    response = metadata_of(broker, ["orders"])
    assert [(b.node_id, b.host, b.port) for b in response.brokers] == [(ME, "127.0.0.1", 9092)]
    assert response.cluster_id == "cluster-x" and response.controller_id == ME
    (topic,) = response.topics
    assert topic.error_code == ErrorCode.NONE and topic.topic_id.bytes == TOPIC_ID
    (partition,) = topic.partitions
    assert (partition.leader_id, partition.replica_nodes, partition.isr_nodes) == (ME, [ME], [ME])


def test_unknown_topics_are_not_created_when_auto_create_is_off(broker: Harness) -> None:
    (topic,) = metadata_of(broker, ["ghost"]).topics
    assert topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert broker.controller.calls == []


def test_auto_create_asks_the_controller_and_answers_leader_not_available(
    auto_creating: Harness,
) -> None:
    (topic,) = metadata_of(auto_creating, ["fresh"]).topics
    assert topic.error_code == ErrorCode.LEADER_NOT_AVAILABLE  # as Kafka: the client retries
    ((method, request),) = auto_creating.controller.calls
    assert method == "CreateTopics"
    assert [(t.name, t.num_partitions, t.replication_factor) for t in request.topics] == [
        ("fresh", -1, -1)  # the controller's defaults
    ]


def test_one_request_creates_at_most_the_limit_and_a_failed_creation_answers_its_error(
    auto_creating: Harness,
) -> None:
    names = [f"t{i:03}" for i in range(AUTO_CREATE_LIMIT + 50)]
    response = metadata_of(auto_creating, names)
    assert {t.error_code for t in response.topics} == {ErrorCode.LEADER_NOT_AVAILABLE}
    ((_, request),) = auto_creating.controller.calls
    assert [t.name for t in request.topics] == names[:AUTO_CREATE_LIMIT]  # the rest next time

    async def refuse(method: str, request: Any) -> Any:
        return cpb.CreateTopicsResponse(
            topics=[
                cpb.CreatableTopicResult(name=t.name, error=cpb.INVALID_REPLICATION_FACTOR)
                for t in request.topics
            ]
        )

    auto_creating.controller.call = refuse  # type: ignore[method-assign]
    (topic,) = metadata_of(auto_creating, ["too-wide"]).topics
    assert topic.error_code == ErrorCode.INVALID_REPLICATION_FACTOR


@pytest.mark.parametrize("harness", ["broker", "auto_creating"])
def test_an_unknown_topic_with_an_illegal_name_is_invalid_topic_and_never_created(
    harness: str, request: pytest.FixtureRequest
) -> None:
    """Kafka validates the name of a topic it does not have (Topic.validate in
    KafkaApis.getTopicMetadata; AutoTopicCreationManager sends no such name on)."""
    broker: Harness = request.getfixturevalue(harness)
    names = ["bad name!", "x" * 300, "..", "orders", "fine-name"]
    response = metadata_of(broker, names)
    fine = (
        ErrorCode.LEADER_NOT_AVAILABLE
        if harness == "auto_creating"
        else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )
    assert [(t.name, t.error_code) for t in response.topics] == [
        ("bad name!", ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("x" * 300, ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("..", ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("orders", ErrorCode.NONE),
        ("fine-name", fine),
    ]
    created = [t.name for _, r in broker.controller.calls for t in r.topics]
    assert created == (["fine-name"] if harness == "auto_creating" else [])


def test_a_topic_asked_for_more_than_once_is_answered_and_created_once(
    auto_creating: Harness,
) -> None:
    """Kafka's handleTopicMetadataRequest takes names and ids as sets: one answer per topic,
    however often a request names it (a 180 KB request naming one topic 60,000 times built a
    16 MB answer before)."""
    known = uuid.UUID(bytes=TOPIC_ID)
    ghost = uuid.UUID(int=7)
    topics = [{"name": "orders"}, {"name": "fresh"}] * 1000 + [
        {"name": None, "topic_id": known},
        {"name": None, "topic_id": ghost},
        {"name": None, "topic_id": ghost},
    ]
    body = {"topics": topics, "allow_auto_topic_creation": True}
    response = auto_creating.ask(ApiKey.METADATA, 12, body)
    assert [(t.name, t.error_code) for t in response.topics] == [
        ("orders", ErrorCode.NONE),
        ("fresh", ErrorCode.LEADER_NOT_AVAILABLE),
        (None, ErrorCode.UNKNOWN_TOPIC_ID),
    ]
    assert response.topics[-1].topic_id == ghost
    created = [t.name for _, r in auto_creating.controller.calls for t in r.topics]
    assert created == ["fresh"]


def test_a_client_that_forbids_auto_create_is_obeyed(auto_creating: Harness) -> None:
    (topic,) = metadata_of(auto_creating, ["fresh"], allow=False).topics
    assert topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert auto_creating.controller.calls == []


def test_an_unsupported_api_versions_version_gets_a_v0_list(broker: Harness) -> None:
    frame = broker.frame(ApiKey.API_VERSIONS, 3, {})
    frame_bytes = bytearray(frame)
    frame_bytes[2:4] = (99).to_bytes(2, "big")  # ask for ApiVersions v99
    reply = broker.dispatcher.handle(memoryview(frame_bytes), CONNECTION)
    assert isinstance(reply, list)
    data = b"".join(bytes(p) for p in reply)  # type: ignore[arg-type]
    _, response = decode_response(ApiKey.API_VERSIONS, 0, memoryview(data)[4:])
    assert response.error_code == ErrorCode.UNSUPPORTED_VERSION
    versions = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert versions[ApiKey.PRODUCE] == (0, 10)  # v0-v2 advertised for old librdkafka (below)
    assert versions[ApiKey.FETCH] == (4, 16) and versions[ApiKey.FIND_COORDINATOR] == (0, 4)


def test_an_unknown_api_gets_unsupported_version_and_the_connection_goes_on(
    broker: Harness,
) -> None:
    frame = bytearray(broker.frame(ApiKey.METADATA, 12, {"topics": None}))
    frame[0:2] = (1000).to_bytes(2, "big")
    reply = broker.dispatcher.handle(memoryview(frame), CONNECTION)
    assert reply == [
        (6).to_bytes(4, "big")
        + broker.correlation_id.to_bytes(4, "big")
        + int(ErrorCode.UNSUPPORTED_VERSION).to_bytes(2, "big")
    ]
    assert metadata_of(broker, ["orders"]).topics[0].error_code == ErrorCode.NONE


def test_produce_below_v3_closes_the_connection(broker: Harness) -> None:
    frame = bytearray(broker.frame(ApiKey.PRODUCE, 3, {"acks": 1, "topic_data": []}))
    frame[2:4] = (2).to_bytes(2, "big")
    with pytest.raises(CloseConnection, match="message format v0/v1"):
        broker.dispatcher.handle(memoryview(frame), CONNECTION)


def test_produce_appends_and_acks_zero_sends_nothing(broker: Harness) -> None:
    batch = make_batch([b"a", b"b"])
    body = {
        "acks": 1,
        "timeout_ms": 1000,
        "topic_data": [{"name": "orders", "partition_data": [{"index": 0, "records": batch}]}],
    }
    response = broker.ask(ApiKey.PRODUCE, 9, body)
    (partition,) = response.responses[0].partition_responses
    assert (partition.error_code, partition.base_offset) == (ErrorCode.NONE, 0)
    assert broker.raw(ApiKey.PRODUCE, 9, body | {"acks": 0}) is None
    response = broker.ask(ApiKey.PRODUCE, 9, body | {"acks": 2})
    assert response.responses[0].partition_responses[0].error_code == (
        ErrorCode.INVALID_REQUIRED_ACKS
    )
    assert broker.ask(ApiKey.LIST_OFFSETS, 7, _latest("orders")).topics[0].partitions[0].offset == 4


def _latest(topic: str) -> dict[str, Any]:
    partitions = [{"partition_index": 0, "timestamp": -1}]
    return {"replica_id": -1, "topics": [{"name": topic, "partitions": partitions}]}


def test_an_acks_zero_failure_closes_the_connection(broker: Harness) -> None:
    body = {
        "acks": 0,
        "topic_data": [{"name": "ghost", "partition_data": [{"index": 0, "records": b""}]}],
    }
    with pytest.raises(CloseConnection, match="acks=0"):
        broker.dispatcher.handle(broker.frame(ApiKey.PRODUCE, 9, body), CONNECTION)


def test_find_coordinator_says_no_coordinator_at_every_version(broker: Harness) -> None:
    for version in range(4):
        response = broker.ask(ApiKey.FIND_COORDINATOR, version, {"key": "group", "key_type": 0})
        assert response.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
    response = broker.ask(ApiKey.FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["a"]})
    assert [(c.key, c.error_code) for c in response.coordinators] == [
        ("a", ErrorCode.COORDINATOR_NOT_AVAILABLE)
    ]


def test_fetch_sessions_open_and_refuse_unknown_sessions(broker: Harness) -> None:
    def fetch(session_id: int, epoch: int, partitions: list[int], version: int = 12) -> Any:
        body = {
            "replica_id": -1,
            "max_wait_ms": 0,
            "min_bytes": 0,
            "max_bytes": 1 << 20,
            "session_id": session_id,
            "session_epoch": epoch,
            "topics": [
                {
                    "topic": "orders",
                    "partitions": [
                        {"partition": p, "fetch_offset": 0, "partition_max_bytes": 1 << 20}
                        for p in partitions
                    ],
                }
            ],
        }
        return broker.ask(ApiKey.FETCH, version, body)

    empty = fetch(0, 0, [])  # nothing to cache: no session
    assert (empty.error_code, empty.session_id) == (ErrorCode.NONE, 0)
    opened = fetch(0, 0, [0])
    assert opened.error_code == ErrorCode.NONE and opened.session_id > 0
    assert [p.partition_index for p in opened.responses[0].partitions] == [0]
    again = fetch(opened.session_id, 1, [])
    assert (again.error_code, again.session_id, again.responses) == (0, opened.session_id, [])
    assert fetch(opened.session_id, 1, []).error_code == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    assert fetch(7, 1, []).error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert fetch(0, 3, []).error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND  # 0: no session
    old = fetch(0, 0, [0], version=6)  # before sessions: always sessionless, in full
    assert [p.partition_index for p in old.responses[0].partitions] == [0]


def _struct_types(struct: Struct) -> Iterator[object]:
    for f in struct.fields:
        item = f.type.item if isinstance(f.type, Array) else f.type
        if isinstance(item, Struct):
            yield from _struct_types(item)
        else:
            yield item


def test_only_produce_requests_keep_views_of_their_frame() -> None:
    """The dispatcher says it is done with a frame when handle returns (the listener then
    reuses its memory while the request waits): the decoder copies every field but records,
    and Produce, the only request carrying them, appends them before it returns."""
    assert KafkaDispatcher.frames_in_flight is False
    with_records = {k for k, spec in API_SPECS.items() if RECORDS in _struct_types(spec.request)}
    assert with_records == {ApiKey.PRODUCE}


# -- ElectLeaders ------------------------------------------------------------------------------


def answer_elections(
    harness: Harness, answer: cpb.ElectLeadersResponse
) -> list[cpb.ElectLeadersRequest]:
    """The stand-in controller answers every ElectLeaders with ``answer``; the list fills with
    what was forwarded."""
    forwarded: list[cpb.ElectLeadersRequest] = []

    async def call(method: str, request: Any) -> Any:
        assert method == "ElectLeaders", method
        forwarded.append(request)
        return answer

    harness.controller.call = call  # type: ignore[method-assign]
    return forwarded


def election_results(response: Any) -> list[tuple[str, list[tuple[int, int, str | None]]]]:
    return [
        (t.topic, [(p.partition_id, p.error_code, p.error_message) for p in t.partition_result])
        for t in response.replica_election_results
    ]


UNKNOWN_PARTITION = "no partition 5 of topic orders"


@pytest.mark.parametrize("version", [0, 1, 2])
def test_elect_leaders_forwards_the_type_and_answers_each_partition_by_topic(
    broker: Harness, version: int
) -> None:
    answer = cpb.ElectLeadersResponse(
        partitions=[
            cpb.PartitionResult(topic="orders", partition=0),
            cpb.PartitionResult(
                topic="orders",
                partition=5,
                error=cpb.UNKNOWN_TOPIC_OR_PARTITION,
                message=UNKNOWN_PARTITION,
            ),
            cpb.PartitionResult(topic="nope", partition=0, error=cpb.UNKNOWN_TOPIC_OR_PARTITION),
        ]
    )
    forwarded = answer_elections(broker, answer)
    body = {
        "election_type": 1,  # UNCLEAN; not in v0, which is PREFERRED
        "topic_partitions": [
            {"topic": "orders", "partitions": [0, 5, 0]},
            {"topic": "nope", "partitions": [0]},
            {"topic": "bare", "partitions": []},
        ],
        "timeout_ms": 5000,
    }
    response = broker.ask(ApiKey.ELECT_LEADERS, version, body)
    ((request),) = forwarded
    assert request.election_type == (cpb.PREFERRED if version == 0 else cpb.UNCLEAN)
    assert [(t.topic, list(t.partitions)) for t in request.partitions] == [
        ("orders", [0, 5, 0]),
        ("nope", [0]),
        ("bare", []),
    ]
    assert response.error_code == ErrorCode.NONE
    assert election_results(response) == [
        ("orders", [(0, ErrorCode.NONE, None), (5, 3, UNKNOWN_PARTITION)]),
        ("nope", [(0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None)]),
        ("bare", []),
    ]


def test_elect_leaders_of_every_partition_and_of_none(broker: Harness) -> None:
    answer = cpb.ElectLeadersResponse(
        partitions=[
            cpb.PartitionResult(topic="orders", partition=0),
            cpb.PartitionResult(
                topic="other", partition=2, error=cpb.ELIGIBLE_LEADERS_NOT_AVAILABLE
            ),
        ]
    )
    forwarded = answer_elections(broker, answer)
    every = broker.ask(ApiKey.ELECT_LEADERS, 2, {"election_type": 1, "topic_partitions": None})
    ((request),) = forwarded
    assert list(request.partitions) == [] and request.election_type == cpb.UNCLEAN
    assert election_results(every) == [
        ("orders", [(0, ErrorCode.NONE, None)]),
        ("other", [(2, ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, None)]),
    ]
    none = broker.ask(ApiKey.ELECT_LEADERS, 2, {"election_type": 0, "topic_partitions": []})
    assert (none.error_code, none.replica_election_results) == (ErrorCode.NONE, [])
    assert len(forwarded) == 1  # an empty list elects nothing: not forwarded


@pytest.mark.parametrize("version", [0, 1, 2])
def test_elect_leaders_refused_as_a_whole_answers_every_partition_named(
    broker: Harness, version: int
) -> None:
    """Kafka's ElectLeadersRequest.getErrorResponse: the error at the top (v1+) and for
    each partition named."""
    refusal = cpb.ResponseHeader(error=cpb.INVALID_REQUEST, message="Unknown election type 7")
    answer_elections(broker, cpb.ElectLeadersResponse(header=refusal))
    body = {
        "election_type": 7,
        "topic_partitions": [{"topic": "orders", "partitions": [0, 1]}],
        "timeout_ms": 5000,
    }
    response = broker.ask(ApiKey.ELECT_LEADERS, version, body)
    if version >= 1:
        assert response.error_code == ErrorCode.INVALID_REQUEST
    refused = (ErrorCode.INVALID_REQUEST, "Unknown election type 7")
    assert election_results(response) == [("orders", [(0, *refused), (1, *refused)])]


def test_api_versions_lists_elect_leaders_v0_to_v2(broker: Harness) -> None:
    response = broker.ask(ApiKey.API_VERSIONS, 3, {})
    versions = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert versions[ApiKey.ELECT_LEADERS] == (0, 2)  # librdkafka 2.16 asks up to v2
