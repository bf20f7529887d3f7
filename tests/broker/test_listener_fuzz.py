"""Hostile traffic against a real broker's listener and handlers (the codec alone is fuzzed in
test_protocol_fuzz.py).

How this works. Hypothesis builds one example at a time and sends it on a fresh connection
to broker 101 or 102 of the ``kafka`` fixture's real cluster (kafka_cluster.py), while a
control connection to each broker, opened before the run, must be answered after every
example. An example is one of:

* a well-formed request of any API and version in ``API_SPECS``, with field values drawn to
  be awkward (negative partitions, huge byte limits, odd epochs and timestamps) and aimed at
  real topics: it must be answered, with its correlation id, in a response that decodes at
  its version, and the connection must stay open. Produce payloads are always invalid
  batches (bad CRC, magic, lengths, random bytes), so no example may append;
* a header naming an API or version the broker does not advertise: it must be answered
  UNSUPPORTED_VERSION (ApiVersions: with a v0 body) and the connection must serve on;
* random bytes, or a well-formed request damaged (bits flipped, truncated, length fields set
  huge or negative, bytes inserted or deleted, the size prefix or API key and version
  rewritten): the client then closes its side, and the broker must close the connection
  within a bounded time, whatever it answered before.

State-changing admin requests are aimed at scratch names and carry ``validate_only`` where
the API has it. After the run: both broker processes are alive and answer ApiVersions and
Metadata, the data topics' earliest and latest offsets are what they were, and no node
(controllers included) logged an ERROR.

The examples are seeded (``LISTENER_FUZZ_SEED``, printed with any failure) so a run can be
replayed; shrinking is off, as each example costs a round trip to the cluster.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, note, seed, settings
from hypothesis import strategies as st
from kafka_cluster import KafkaCluster, kafka
from raw_client import (
    BROKERS,
    ConnectionClosed,
    LogWatch,
    RawClient,
    SharedCluster,
    unique_topic,
)
from support import make_batch

from broker.protocol import API_SPECS, ApiKey, ErrorCode, decode_response, encode_request
from broker.protocol.schema import (
    BOOL,
    BYTES,
    FLOAT64,
    INT8,
    INT16,
    INT32,
    INT64,
    RECORDS,
    STRING,
    UINT16,
    UUID,
    Array,
    Field,
    FieldType,
    Struct,
)

__all__ = ["kafka"]  # the fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

# Not RUNNEL_*: the nodes inherit the environment and read RUNNEL_* as their config.
FUZZ_SEED = int(os.environ.get("LISTENER_FUZZ_SEED", "20261122"))
FUZZ_EXAMPLES = int(os.environ.get("LISTENER_FUZZ_EXAMPLES", "250"))
ANSWER_TIMEOUT_S = 10.0  # a well-formed request's answer (the broker takes milliseconds)
CLOSE_TIMEOUT_S = 10.0  # the broker closing a connection whose client has closed its side
NODES = (1, *BROKERS)

# Which APIs only read (aimed at the real topics) and which change cluster state (aimed at
# scratch names, validate_only where the API has it). An API in neither is new to this
# test: it is fuzzed as a state-changer, to be safe.
READ_ONLY = {
    ApiKey.PRODUCE,  # with invalid payloads only
    ApiKey.FETCH,
    ApiKey.LIST_OFFSETS,
    ApiKey.METADATA,
    ApiKey.API_VERSIONS,
    ApiKey.INIT_PRODUCER_ID,
    ApiKey.OFFSET_FOR_LEADER_EPOCH,
    ApiKey.DESCRIBE_CONFIGS,
    ApiKey.DESCRIBE_CLUSTER,
    ApiKey.FIND_COORDINATOR,
}
SCRATCH = "fuzz-scratch-"

_INT_RANGES = {
    INT8: (-(2**7), 2**7 - 1),
    INT16: (-(2**15), 2**15 - 1),
    INT32: (-(2**31), 2**31 - 1),
    INT64: (-(2**63), 2**63 - 1),
    UINT16: (0, 2**16 - 1),
}
_HOSTILE_WORDS = [
    b"\x7f\xff\xff\xff",  # int32 max
    b"\xff\xff\xff\xff",  # -1
    b"\x80\x00\x00\x00",  # int32 min
    b"\x7f\xff",
    b"\xff\xfe",
    b"\xff\xff\xff\xff\x0f",  # the largest 5-byte varint
    b"\xff\xff\xff\xff\xff\x01",  # a 6-byte varint
    b"\x00\x00\x00\x00",
]


@pytest.fixture
def cluster(kafka: KafkaCluster) -> SharedCluster:
    return SharedCluster.of(kafka)


# -- values ------------------------------------------------------------------------------------

_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


def _ints(type_: str, *likely: int) -> st.SearchStrategy[int]:
    low, high = _INT_RANGES[type_]
    edges = [v for v in (low, high, -1, 0, 1) if low <= v <= high]
    return st.sampled_from([*likely, *edges]) | st.integers(low, high)


def _bad_records(topic_batch: bytes) -> st.SearchStrategy[bytes | None]:
    """Produce payloads no broker may append."""

    def damage(kind: str, position: int) -> bytes:
        out = bytearray(topic_batch)
        if kind == "crc":
            out[17:21] = bytes(b ^ 0xFF for b in out[17:21])  # every CRC bit: no flip undoes it
        elif kind == "magic":
            out[16] = position % 2
        elif kind == "length":
            struct.pack_into(">i", out, 8, len(out) - 12 + (position % 40) + 1)
        elif kind == "truncated":
            del out[position % (len(out) - 1) + 1 :]
        return bytes(out)

    return st.one_of(
        st.none(),
        st.just(b""),
        st.binary(max_size=80),
        st.builds(
            damage, st.sampled_from(["crc", "magic", "length", "truncated"]), st.integers(0, 1000)
        ),
    )


@dataclass(frozen=True)
class Targets:
    """What well-formed requests aim at."""

    topics: tuple[str, ...]  # real topics (read-only APIs)
    batch: bytes  # a valid batch, damaged before it is sent


def _field(f: Field, version: int, targets: Targets, read_only: bool) -> st.SearchStrategy[Any]:
    type_ = f.type
    if isinstance(type_, Array):
        item = _typed(f.name, type_.item, version, targets, read_only)
        return st.lists(item, max_size=3)
    return _typed(f.name, type_, version, targets, read_only)


def _typed(
    name: str, type_: FieldType, version: int, targets: Targets, read_only: bool
) -> st.SearchStrategy[Any]:
    if isinstance(type_, Struct):
        return _struct(type_, version, targets, read_only)
    if name == "validate_only":
        return st.just(True)
    if type_ == RECORDS:
        return _bad_records(targets.batch)
    if type_ == STRING and name in ("name", "topic", "topic_names", "resource_name"):
        scratch = st.builds(lambda s: SCRATCH + s, _TEXT)
        if not read_only:
            return scratch
        return st.sampled_from([*targets.topics, "", "101", "102"]) | scratch
    if type_ in _INT_RANGES:
        return _ints(type_, *_LIKELY.get(name, ()))
    return {
        BOOL: st.booleans(),
        FLOAT64: st.floats(allow_nan=False),
        UUID: st.uuids(),
        STRING: _TEXT,
        BYTES: st.binary(max_size=16),
    }[type_]


_LIKELY: dict[str, tuple[int, ...]] = {
    "partition": (0, 1, 2, 3),
    "partition_index": (0, 1, 2, 3),
    "index": (0, 1, 2, 3),
    "acks": (-1, 0, 1, 2, -2),
    "fetch_offset": (0, 1, 2, 3, 4, 1 << 40),
    "timestamp": (-1, -2, -3, -4, -5, 0, 1_700_000_000_000),
    "current_leader_epoch": (0, 1, 2),
    "leader_epoch": (0, 1, 2),
    "last_fetched_epoch": (0, 1),
    "replica_id": (101, 102, -2),
    "num_partitions": (1, 2, 3),
    "count": (1, 2, 3),
    "replication_factor": (1, 2, 3),
    "resource_type": (2, 4, 8, 16),
    "session_id": (0,),
    "session_epoch": (0, -1),
    "min_bytes": (0, 1, 1 << 20),
    "max_bytes": (0, 100, 1 << 20),
    "partition_max_bytes": (0, 100, 1 << 20),
    "endpoint_type": (1, 2),
    "isolation_level": (0, 1),
}


def _struct(s: Struct, version: int, targets: Targets, read_only: bool) -> st.SearchStrategy[Any]:
    strategies = {}
    for f in s.fields:
        if not f.present(version):
            continue
        base = _field(f, version, targets, read_only)
        if f.name == "max_wait_ms":  # waits are bounded so an answer comes quickly
            base = st.integers(-1, 100)
        elif f.name == "timeout_ms":
            base = st.integers(-1, 2000)
        if version in f.nullable and f.name != "validate_only":
            base = st.none() | base
        strategies[f.name] = base
    return st.fixed_dictionaries(strategies)


def _request_frame(
    api_key: int, version: int, body: dict[str, Any], correlation_id: int, client_id: str | None
) -> bytes:
    return b"".join(
        bytes(p) for p in encode_request(api_key, version, correlation_id, client_id, body)
    )


# -- examples ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    kind: str  # "valid" | "unsupported" | "damaged"
    broker: int
    data: bytes
    api_key: int = -1
    version: int = -1
    correlation_id: int = -1
    body: Any = None

    def __repr__(self) -> str:  # what Hypothesis prints for a failure: enough to replay
        return (
            f"Example({self.kind}, broker {self.broker}, api {self.api_key} "
            f"v{self.version}, correlation {self.correlation_id}, {len(self.data)} bytes: "
            f"{self.data[:400].hex()})"
        )


_SPECS = sorted(API_SPECS.values(), key=lambda s: s.key)


@st.composite
def _valid(draw: st.DrawFn, targets: Targets) -> Example:
    spec = draw(st.sampled_from(_SPECS))
    version = draw(st.integers(spec.min_version, spec.max_version))
    body = draw(_struct(spec.request, version, targets, spec.key in READ_ONLY))
    correlation_id = draw(_ints(INT32))
    client_id = draw(st.none() | _TEXT)
    frame = _request_frame(spec.key, version, body, correlation_id, client_id)
    broker = draw(st.sampled_from(BROKERS))
    return Example("valid", broker, frame, spec.key, version, correlation_id, body)


@st.composite
def _unsupported(draw: st.DrawFn, advertised: dict[int, tuple[int, int]]) -> Example:
    api_key = draw(_ints(INT16, 1000, 17, 21, 67, 68))
    low, high = advertised.get(api_key, (1, 0))
    version = draw(_ints(INT16, low - 1, high + 1, 99).filter(lambda v: not low <= v <= high))
    correlation_id = draw(_ints(INT32))
    client_id = draw(st.binary(max_size=10).map(lambda b: b.hex()))
    head = (
        struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id.encode()
    )
    frame = head + draw(st.binary(max_size=40))
    data = struct.pack(">i", len(frame)) + frame
    broker = draw(st.sampled_from(BROKERS))
    return Example("unsupported", broker, data, api_key, version, correlation_id)


@st.composite
def _damage(draw: st.DrawFn, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(
            st.sampled_from(
                ["flip", "truncate", "word", "insert", "delete", "size", "api", "version"]
            )
        )
        at = draw(st.integers(0, max(len(out) - 1, 0)))
        if kind == "flip" and out:
            out[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del out[at:]
        elif kind == "word":
            word = draw(st.sampled_from(_HOSTILE_WORDS))
            out[at : at + len(word)] = word
        elif kind == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del out[at : at + draw(st.integers(1, 8))]
        elif kind == "size" and len(out) >= 4:
            size = draw(
                st.sampled_from([-1, -(2**31), 2**31 - 1, 100 * 1024 * 1024 + 1, 0])
                | st.integers(0, len(out) + 16)
            )
            struct.pack_into(">i", out, 0, size)
        elif kind == "api" and len(out) >= 6:
            struct.pack_into(">h", out, 4, draw(_ints(INT16, *API_SPECS)))
        elif kind == "version" and len(out) >= 8:
            struct.pack_into(">h", out, 6, draw(_ints(INT16, 0, 1, 3, 9, 12, 99)))
    return bytes(out)


@st.composite
def _damaged(draw: st.DrawFn, targets: Targets) -> Example:
    choice = draw(st.sampled_from(["mutated", "mutated", "random", "pipelined"]))
    broker = draw(st.sampled_from(BROKERS))
    if choice == "random":
        data = draw(st.binary(min_size=1, max_size=200))
        if draw(st.booleans()):
            data = struct.pack(">i", len(data)) + data
        return Example("damaged", broker, data)
    valid = draw(_valid(targets))
    data = draw(_damage(valid.data))
    if choice == "pipelined":  # a good request, then the damaged one, in one write
        data = draw(_valid(targets)).data + data
    return Example("damaged", broker, data, valid.api_key, valid.version, valid.correlation_id)


def _examples(
    targets: Targets, advertised: dict[int, tuple[int, int]]
) -> st.SearchStrategy[Example]:
    return st.one_of(
        _valid(targets), _unsupported(advertised), _damaged(targets), _damaged(targets)
    )


# -- checking one example --------------------------------------------------------------------


def _produce_partitions(body: dict[str, Any]) -> int:
    return sum(len(t["partition_data"]) for t in body["topic_data"])


def _check_valid(client: RawClient, ex: Example) -> None:
    if ex.api_key == ApiKey.PRODUCE and ex.body["acks"] == 0:
        # No answer at acks=0; a failed partition (all of them: the payloads are invalid)
        # closes the connection instead, the only way such a producer can learn of it.
        if _produce_partitions(ex.body):
            assert client.closed_by_peer(CLOSE_TIMEOUT_S), "acks=0 failure left it open"
            return
    else:
        correlation_id, answer = decode_response(
            ex.api_key, ex.version, client.read_frame(ANSWER_TIMEOUT_S)
        )
        assert correlation_id == ex.correlation_id
        if ex.api_key == ApiKey.PRODUCE:
            appended = [
                p
                for t in answer.responses
                for p in t.partition_responses
                if p.error_code == ErrorCode.NONE
            ]
            assert not appended, f"an invalid payload was appended: {appended}"
    assert client.api_versions().error_code == ErrorCode.NONE  # the connection serves on


def _check_unsupported(client: RawClient, ex: Example) -> None:
    frame = client.read_frame(ANSWER_TIMEOUT_S)
    if ex.api_key == ApiKey.API_VERSIONS:
        correlation_id, answer = decode_response(ApiKey.API_VERSIONS, 0, frame)
        assert (correlation_id, answer.error_code) == (
            ex.correlation_id,
            ErrorCode.UNSUPPORTED_VERSION,
        )
        assert {a.api_key for a in answer.api_keys} >= API_SPECS.keys()
    else:
        assert frame == struct.pack(">ih", ex.correlation_id, ErrorCode.UNSUPPORTED_VERSION)
    assert client.api_versions().error_code == ErrorCode.NONE


def _check_damaged(client: RawClient, ex: Example) -> None:
    try:
        client.send_raw(ex.data)
    except (BrokenPipeError, ConnectionResetError):
        return  # closed already: what a broker may do with rubbish
    client.half_close()
    assert client.closed_by_peer(CLOSE_TIMEOUT_S), "the broker did not close after EOF"


def _run_one(cluster: SharedCluster, ex: Example) -> None:
    with RawClient(cluster.ports[ex.broker], timeout_s=ANSWER_TIMEOUT_S) as client:
        if ex.kind == "damaged":
            _check_damaged(client, ex)
            return
        client.send_raw(ex.data)
        try:
            if ex.kind == "valid":
                _check_valid(client, ex)
            else:
                _check_unsupported(client, ex)
        except ConnectionClosed as e:
            raise AssertionError(f"the broker closed the connection: {e}") from e


# -- the test ------------------------------------------------------------------------------------


def _offsets(cluster: SharedCluster, topics: tuple[str, ...]) -> dict[tuple[str, int, int], Any]:
    """(topic, partition, -2 earliest | -1 latest) -> offset, asked of each leader."""
    out = {}
    for topic in topics:
        for partition, (leader, _) in sorted(cluster.leaders(topic).items()):
            with cluster.client(leader) as c:
                for timestamp in (-2, -1):
                    answer = c.list_offset(topic, partition, timestamp=timestamp)
                    out[(topic, partition, timestamp)] = (answer.error_code, answer.offset)
    return out


def _data_topics(cluster: SharedCluster) -> Targets:
    topics = (unique_topic("fuzz-one"), unique_topic("fuzz-two"))
    with cluster.client() as c:
        c.create_topic(topics[0], 4, 1)
        c.create_topic(topics[1], 2, 2)
    batch = make_batch([b"fuzz-value-1", b"fuzz-value-2"])
    for topic in topics:
        for partition, (leader, _) in cluster.leaders(topic).items():
            with cluster.client(leader) as c:
                answer = c.produce(topic, {partition: batch})
                assert answer[partition].error_code == ErrorCode.NONE
    return Targets(topics, batch)


def test_the_listener_and_handlers_survive_hostile_traffic(cluster: SharedCluster) -> None:
    targets = _data_topics(cluster)
    before = _offsets(cluster, targets.topics)
    watches = {n: LogWatch(cluster.node_log(n)).mark() for n in NODES}
    with cluster.client(101) as c:
        advertised = {a.api_key: (a.min_version, a.max_version) for a in c.api_versions().api_keys}
    control = {b: cluster.client(b) for b in BROKERS}
    count = {"valid": 0, "unsupported": 0, "damaged": 0}

    @seed(FUZZ_SEED)
    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(ex=_examples(targets, advertised))
    def run(ex: Example) -> None:
        note(f"LISTENER_FUZZ_SEED={FUZZ_SEED}")
        count[ex.kind] += 1
        _run_one(cluster, ex)
        for broker, c in control.items():  # everyone else is still served
            assert c.api_versions().error_code == ErrorCode.NONE, f"broker {broker}"

    try:
        run()
    finally:
        for c in control.values():
            c.close()
    assert min(count.values()) > 0, count

    for broker in BROKERS:
        assert cluster.alive(broker), f"broker {broker} died"
        with cluster.client(broker) as c:
            assert c.api_versions().error_code == ErrorCode.NONE
            assert {t.name for t in c.metadata(list(targets.topics)).topics} == set(targets.topics)
    assert _offsets(cluster, targets.topics) == before, "the fuzz changed a log"
    errors = {n: w.records("ERROR") for n, w in watches.items()}
    assert not any(errors.values()), "ERRORs logged during the fuzz:\n" + "\n".join(
        f"node {n}: {r}" for n, records in errors.items() for r in records
    )
