"""Topic decisions (CreateTopics, DeleteTopics, CreatePartitions): one test per rule.

Images are built by replaying records through ``MetadataDelta`` (``cluster`` registers
brokers with racks and unfences them), and every decision's records are replayed the same
way, to prove they apply and that the image then holds what the answer said. A refused item
must leave no records behind.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import pytest
from support import assert_imports_none_of

from controller import records as rec
from controller.image import MetadataDelta, MetadataImage
from controller.outcome import DecisionError, Outcome
from controller.records import ConfigResourceType, MetadataRecord
from controller.topics import (
    TopicDefaults,
    TopicLimits,
    alive_broker_slots,
    create_partitions,
    create_topics,
    delete_topics,
    replica_load,
)
from proto import controller_pb2 as cpb
from storage.errors import InvariantViolation

TOPIC = ConfigResourceType.TOPIC
DEFAULTS = TopicDefaults(num_partitions=3, replication_factor=2)
LIMITS = TopicLimits()


def tid(n: int) -> bytes:
    return n.to_bytes(16, "big")


def replay(image: MetadataImage, records: Iterable[MetadataRecord]) -> MetadataImage:
    delta = MetadataDelta(image)
    for offset, record in enumerate(records, start=image.offset + 1):
        delta.replay(record, offset)
    return delta.apply()


def cluster(
    racks: Sequence[str | None] = ("r1", "r2", "r3"),
    *,
    fenced: Iterable[int] = (),
    shutting_down: Iterable[int] = (),
) -> MetadataImage:
    """Brokers 1..n (epoch 100 + id) in ``racks``, unfenced unless listed in ``fenced``."""
    records: list[MetadataRecord] = []
    for b, rack in enumerate(racks, start=1):
        records.append(rec.register_broker(b, 100 + b, bytes([b]) * 16, [], rack))
        if b not in set(fenced):
            records.append(rec.unfence_broker(b, 100 + b))
    for b in shutting_down:
        records.append(rec.broker_registration_change(b, 100 + b, in_controlled_shutdown=True))
    return replay(MetadataImage.EMPTY, records)


def ids(*values: int, start: int = 1000) -> Callable[[], bytes]:
    """A topic-id source: ``values`` first, then counting up from ``start``."""
    queue = [tid(v) for v in values]
    counter = iter(range(start, 10**9))

    def draw() -> bytes:
        return queue.pop(0) if queue else tid(next(counter))

    return draw


def topic(name: str, partitions: int = -1, rf: int = -1, **configs: str) -> cpb.CreatableTopic:
    entries = [cpb.ConfigEntry(name=k.replace("_", "."), value=v) for k, v in configs.items()]
    return cpb.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=rf, configs=entries
    )


def create(
    image: MetadataImage,
    *topics: cpb.CreatableTopic,
    validate_only: bool = False,
    limits: TopicLimits = LIMITS,
    new_topic_id: Callable[[], bytes] | None = None,
) -> Outcome[cpb.CreateTopicsResponse]:
    request = cpb.CreateTopicsRequest(topics=topics, validate_only=validate_only)
    return create_topics(image, request, DEFAULTS, new_topic_id or ids(), 0, limits)


def refused(image: MetadataImage, *topics: cpb.CreatableTopic) -> cpb.CreatableTopicResult:
    """The only topic's result, which must be an error; and no records."""
    outcome = create(image, *topics)
    assert outcome.records == ()
    (result,) = outcome.response.topics
    assert result.error != cpb.NONE and result.message
    assert (result.topic_id, result.num_partitions, result.replication_factor) == (b"", -1, -1)
    return result


def replicas_of(image: MetadataImage, topic_id: bytes, partition_id: int) -> tuple[int, ...]:
    p = image.partition(topic_id, partition_id)
    assert p is not None
    return p.replicas


def counts(image: MetadataImage) -> tuple[Counter[int], Counter[int]]:
    """Replicas and leaders per broker."""
    replicas: Counter[int] = Counter()
    leaders: Counter[int] = Counter()
    for t in image.topics.values():
        for p in t.partitions.values():
            replicas.update(p.replicas)
            leaders[p.leader] += 1
    return replicas, leaders


# -- CreateTopics: what is written -------------------------------------------------------------


def test_create_topic_writes_records_that_replay_to_what_the_answer_says() -> None:
    image = cluster()
    outcome = create(image, topic("orders", 6, 3, retention_ms="60000"))
    (result,) = outcome.response.topics
    assert (result.name, result.error, result.topic_id) == ("orders", cpb.NONE, tid(1000))
    assert (result.num_partitions, result.replication_factor) == (6, 3)
    kinds = [r.WhichOneof("record") for r in outcome.records]
    assert kinds == ["topic"] + ["partition"] * 6 + ["config"]
    after = replay(image, outcome.records)
    created = after.topic_by_name("orders")
    assert created is not None and created.topic_id == tid(1000)
    assert sorted(created.partitions) == list(range(6))
    for p in created.partitions.values():
        assert len(set(p.replicas)) == 3
        assert p.isr == p.replicas and p.leader == p.replicas[0]
        assert (p.leader_epoch, p.partition_epoch) == (0, 0)
    assert after.configs[(TOPIC, "orders")] == {"retention.ms": "60000"}


def test_partitions_are_balanced_across_brokers() -> None:
    image = cluster(("r1", "r2", "r3", None))
    after = replay(image, create(image, topic("orders", 8, 3)).records)
    replicas, leaders = counts(after)
    assert replicas == {1: 6, 2: 6, 3: 6, 4: 6}
    assert leaders == {1: 2, 2: 2, 3: 2, 4: 2}


def test_replicas_of_a_partition_span_racks() -> None:
    image = cluster(("a", "a", "b", "b"))
    after = replay(image, create(image, topic("orders", 4, 2)).records)
    rack = {b.broker_id: b.rack for b in after.brokers.values()}
    for p in next(iter(after.topics.values())).partitions.values():
        assert {rack[b] for b in p.replicas} == {"a", "b"}


def test_new_topics_go_to_the_least_loaded_brokers() -> None:
    image = cluster(("r1", "r2"))
    image = replay(image, create(image, topic("old", 4, 1)).records)
    image = replay(image, [rec.register_broker(3, 103, b"3" * 16), rec.unfence_broker(3, 103)])
    after = replay(image, create(image, topic("new", 2, 1)).records)
    new = after.topic_by_name("new")
    assert new is not None
    assert [p.replicas for p in new.partitions.values()] == [(3,), (3,)]


def test_topics_of_one_request_are_placed_against_each_other() -> None:
    image = cluster(("r1", "r2"))
    after = replay(image, create(image, topic("a", 1, 1), topic("b", 1, 1)).records)
    assert counts(after)[0] == {1: 1, 2: 1}


def test_a_load_passed_in_is_used_instead_of_counting() -> None:
    image = cluster(("r1", "r2"))
    request = cpb.CreateTopicsRequest(topics=[topic("a", 1, 1)])
    outcome = create_topics(image, request, DEFAULTS, ids(), 0, load={1: (50, 50)})
    assert replicas_of(replay(image, outcome.records), tid(1000), 0) == (2,)


def test_the_load_comes_from_the_image_without_a_pass_over_the_partitions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    image = cluster(("r1", "r2"))
    image = replay(image, create(image, topic("a", 1, 1), new_topic_id=ids(1)).records)
    held = replicas_of(image, tid(1), 0)[0]
    assert image.broker_load == replica_load(image) == {held: (1, 1)}

    def no_counting(*args: object) -> None:
        raise AssertionError("create_topics counted the load by a pass over every partition")

    monkeypatch.setattr("controller.topics.count_load", no_counting)
    outcome = create(image, topic("b", 1, 1), new_topic_id=ids(2))
    assert replicas_of(replay(image, outcome.records), tid(2), 0) != (held,)  # the idle broker


def test_minus_one_takes_the_cluster_defaults() -> None:
    image = cluster()
    outcome = create(image, topic("orders"))
    (result,) = outcome.response.topics
    assert (result.num_partitions, result.replication_factor) == (3, 2)
    created = replay(image, outcome.records).topic_by_name("orders")
    assert created is not None and len(created.partitions) == 3
    assert all(len(p.replicas) == 2 for p in created.partitions.values())


def test_configs_are_committed_in_canonical_text() -> None:
    image = cluster()
    outcome = create(image, topic("orders", cleanup_policy="delete,compact", segment_ms=" 5000"))
    assert replay(image, outcome.records).configs[(TOPIC, "orders")] == {
        "cleanup.policy": "compact,delete",
        "segment.ms": "5000",
    }


def test_validate_only_answers_as_if_created_and_writes_nothing() -> None:
    outcome = create(cluster(), topic("orders", 2, 2), topic("..", 1, 1), validate_only=True)
    assert outcome.records == ()
    ok, bad = outcome.response.topics
    assert (ok.error, ok.num_partitions, ok.replication_factor) == (cpb.NONE, 2, 2)
    assert bad.error == cpb.INVALID_TOPIC_EXCEPTION


def test_one_refused_topic_does_not_stop_the_others() -> None:
    image = cluster()
    outcome = create(image, topic("good", 1, 1), topic("bad name", 1, 1), topic("fine", 1, 1))
    errors = [(t.name, t.error) for t in outcome.response.topics]
    assert errors == [
        ("good", cpb.NONE),
        ("bad name", cpb.INVALID_TOPIC_EXCEPTION),
        ("fine", cpb.NONE),
    ]
    assert sorted(replay(image, outcome.records).topic_ids) == ["fine", "good"]


# -- CreateTopics: bad input, each refused with a clear error and no records --------------------


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "cannot be empty"),
        (".", "cannot be named '.'"),
        ("..", "cannot be named '..'"),
        ("a" * 250, "has 250 characters, more than 249"),
        ("a b", "other than ASCII letters"),
        ("a/b", "other than ASCII letters"),
        ("tópico", "other than ASCII letters"),
        ("a\n", "other than ASCII letters"),
    ],
)
def test_an_invalid_topic_name_is_invalid_topic_exception(name: str, why: str) -> None:
    result = refused(cluster(), topic(name, 1, 1))
    assert result.error == cpb.INVALID_TOPIC_EXCEPTION
    assert why in result.message


def test_a_name_of_249_legal_characters_is_accepted() -> None:
    name = "a.B_9-" * 41 + "xyz"
    assert len(name) == 249
    assert create(cluster(), topic(name, 1, 1)).response.topics[0].error == cpb.NONE


def test_a_name_given_twice_is_answered_once_as_a_duplicate_and_not_created() -> None:
    outcome = create(
        cluster(), topic("orders", 1, 1), topic("a.b", 1, 1), topic("orders", 2, 1),
        topic("a_b", 1, 1), topic("a_b", 1, 1),
    )  # fmt: skip
    answered = [(t.name, t.error, t.message) for t in outcome.response.topics]
    assert answered == [
        ("orders", cpb.INVALID_REQUEST, "Duplicate topic name."),
        ("a.b", cpb.NONE, ""),  # a repeated name is out of the collision check (Kafka's)
        ("a_b", cpb.INVALID_REQUEST, "Duplicate topic name."),
    ]
    assert list(replay(cluster(), outcome.records).topic_ids) == ["a.b"]


def test_a_request_asking_more_than_10000_partitions_in_all_is_refused_as_a_whole() -> None:
    with pytest.raises(DecisionError) as e:  # the default (3) counts for -1
        create(cluster(), topic("a", 9_997, 1), topic("b", -1, 1), topic("c", 1, 1))
    assert (e.value.code, e.value.message) == (
        cpb.POLICY_VIOLATION,
        "Excessively large number of partitions per request.",
    )
    with pytest.raises(DecisionError):  # before every other rule, validate_only too
        create(cluster(), topic("..", 10_001, 1), validate_only=True)


def test_the_request_partition_total_leaves_out_repeated_names_and_counts_no_negatives() -> None:
    outcome = create(
        cluster(), topic("a", 9_997, 1), topic("b", -1, 1), topic("c", 0, 1),
        topic("d", -5, 1), topic("dup", 5_000, 1), topic("dup", 5_000, 1),
    )  # fmt: skip
    assert [t.error for t in outcome.response.topics] == [
        cpb.NONE, cpb.NONE, cpb.INVALID_PARTITIONS, cpb.INVALID_PARTITIONS, cpb.INVALID_REQUEST,
    ]  # fmt: skip
    assert replay(cluster(), outcome.records).partition_count() == 10_000


def test_an_existing_topic_is_topic_already_exists() -> None:
    image = cluster()
    image = replay(image, create(image, topic("orders", 1, 1)).records)
    result = refused(image, topic("orders", 1, 1))
    assert result.error == cpb.TOPIC_ALREADY_EXISTS
    assert "'orders' already exists" in result.message


@pytest.mark.parametrize(
    ("existing", "new"),
    [("a.b", "a_b"), ("a_b", "a.b"), ("x.y_z", "x_y.z"), ("m.a.n.y.d.o.t.s", "m_a_n_y_d_o_t_s")],
)
def test_a_name_colliding_with_an_existing_topic_is_invalid_topic_exception(
    existing: str, new: str
) -> None:
    image = cluster()
    image = replay(image, create(image, topic(existing, 1, 1)).records)
    for n in range(100):  # enough topics that the check tries spellings, not a scan
        image = replay(
            image, create(image, topic(f"t{n}", 1, 1), new_topic_id=ids(start=n)).records
        )
    result = refused(image, topic(new, 1, 1))
    assert result.error == cpb.INVALID_TOPIC_EXCEPTION
    assert f"collides with existing topic {existing!r}" in result.message


def test_names_that_collide_within_one_request_are_both_refused() -> None:
    outcome = create(cluster(), topic("a.b", 1, 1), topic("a_b", 1, 1))
    assert outcome.records == ()
    assert [t.error for t in outcome.response.topics] == [cpb.INVALID_TOPIC_EXCEPTION] * 2


@pytest.mark.parametrize("partitions", [0, -2])
def test_a_partition_count_out_of_range_is_invalid_partitions(partitions: int) -> None:
    result = refused(cluster(), topic("orders", partitions, 1))
    assert result.error == cpb.INVALID_PARTITIONS
    assert f"must be 1 to 10000 (or -1 for the default 3), not {partitions}" in result.message


def test_the_per_topic_cap_holds_under_a_larger_per_request_limit() -> None:
    limits = TopicLimits(max_partitions_per_request=20_000)
    outcome = create(cluster(), topic("orders", 10_001, 1), limits=limits)
    (result,) = outcome.response.topics
    assert outcome.records == () and result.error == cpb.INVALID_PARTITIONS


def test_the_per_topic_partition_limit_is_configurable() -> None:
    outcome = create(
        cluster(), topic("orders", 6, 1), limits=TopicLimits(max_partitions_per_topic=5)
    )
    assert outcome.response.topics[0].error == cpb.INVALID_PARTITIONS


@pytest.mark.parametrize("rf", [0, -2])
def test_a_replication_factor_below_one_is_invalid_replication_factor(rf: int) -> None:
    assert refused(cluster(), topic("orders", 1, rf)).error == cpb.INVALID_REPLICATION_FACTOR


def test_a_replication_factor_above_the_alive_brokers_is_invalid_replication_factor() -> None:
    result = refused(cluster(("r1", "r2")), topic("orders", 1, 3))
    assert result.error == cpb.INVALID_REPLICATION_FACTOR
    assert result.message == "replication factor 3 is larger than the 2 available brokers"


def test_fenced_and_shutting_down_brokers_are_not_available() -> None:
    image = cluster(("r1", "r2", "r3", "r4"), fenced=[3], shutting_down=[4])
    assert [s.broker_id for s in alive_broker_slots(image)] == [1, 2]
    assert "the 2 available brokers" in refused(image, topic("orders", 1, 3)).message
    after = replay(image, create(image, topic("orders", 4, 2)).records)
    assert set(counts(after)[0]) == {1, 2}


def test_the_default_replication_factor_is_checked_against_the_alive_brokers() -> None:
    result = refused(cluster((None,)), topic("orders"))  # the default is 2
    assert result.message == "replication factor 2 is larger than the 1 available brokers"


def test_an_unknown_config_name_is_invalid_config() -> None:
    result = refused(cluster(), topic("orders", 1, 1, retention_minutes="5"))
    assert result.error == cpb.INVALID_CONFIG
    assert "unknown topic config 'retention.minutes'" in result.message


@pytest.mark.parametrize(
    ("key", "value"),
    [("retention_ms", "soon"), ("segment_bytes", "1"), ("cleanup_policy", "keep")],
)
def test_an_impossible_config_value_is_invalid_config(key: str, value: str) -> None:
    result = refused(cluster(), topic("orders", 1, 1, **{key: value}))
    assert result.error == cpb.INVALID_CONFIG
    assert f"invalid value {value!r} for config {key.replace('_', '.')!r}" in result.message


def test_a_config_given_twice_is_invalid_request() -> None:
    t = topic("orders", 1, 1, retention_ms="1")
    t.configs.add(name="retention.ms", value="2")
    assert refused(cluster(), t).error == cpb.INVALID_REQUEST


def test_the_cluster_partition_limit_counts_the_whole_request() -> None:
    image = cluster()
    image = replay(image, create(image, topic("old", 4, 1)).records)
    limits = TopicLimits(max_cluster_partitions=10)
    outcome = create(image, topic("a", 4, 1), topic("b", 4, 1), topic("c", 2, 1), limits=limits)
    errors = [t.error for t in outcome.response.topics]
    assert errors == [cpb.NONE, cpb.POLICY_VIOLATION, cpb.NONE]
    assert "above its limit of 10" in outcome.response.topics[1].message
    assert replay(image, outcome.records).partition_count() == 10


# -- CreateTopics: topic ids -------------------------------------------------------------------


def test_a_drawn_topic_id_already_taken_is_drawn_again() -> None:
    image = cluster()
    image = replay(image, create(image, topic("old", 1, 1), new_topic_id=ids(7)).records)
    outcome = create(image, topic("a", 1, 1), topic("b", 1, 1), new_topic_id=ids(7, 0, 8, 8, 9))
    assert [t.topic_id for t in outcome.response.topics] == [tid(8), tid(9)]
    replay(image, outcome.records)


def test_a_topic_id_source_that_keeps_repeating_refuses_the_request() -> None:
    image = cluster()
    image = replay(image, create(image, topic("old", 1, 1), new_topic_id=ids(7)).records)
    with pytest.raises(DecisionError) as e:
        create(image, topic("a", 1, 1), new_topic_id=lambda: tid(7))
    assert e.value.code == cpb.UNKNOWN_SERVER_ERROR


def test_a_topic_id_of_the_wrong_length_is_a_programmer_error() -> None:
    with pytest.raises(InvariantViolation):
        create(cluster(), topic("a", 1, 1), new_topic_id=lambda: b"short")


# -- DeleteTopics ------------------------------------------------------------------------------


def existing(*names: str) -> MetadataImage:
    image = cluster()
    for name in names:
        outcome = create(
            image, topic(name, 2, 2, retention_ms="1"), new_topic_id=ids(start=len(image.topics))
        )
        image = replay(image, outcome.records)
    return image


def test_delete_removes_the_topic_its_partitions_and_configs() -> None:
    image = existing("orders", "payments")
    outcome = delete_topics(image, cpb.DeleteTopicsRequest(names=["orders"]))
    assert [(t.name, t.error) for t in outcome.response.topics] == [("orders", cpb.NONE)]
    after = replay(image, outcome.records)
    assert list(after.topic_ids) == ["payments"]
    assert (TOPIC, "orders") not in after.configs and after.partition_count() == 2


def test_deleting_an_unknown_topic_is_unknown_topic_or_partition() -> None:
    image = existing("orders")
    outcome = delete_topics(image, cpb.DeleteTopicsRequest(names=["nope", "orders"]))
    nope, orders = outcome.response.topics
    assert (nope.error, nope.message) == (cpb.UNKNOWN_TOPIC_OR_PARTITION, "no topic named 'nope'")
    assert orders.error == cpb.NONE
    assert replay(image, outcome.records).topic_ids == {}


def test_a_topic_deleted_by_id_is_deleted_only_if_its_name_still_has_that_id() -> None:
    """A broker turns a DeleteTopics by id into a name from its own image, which may lag: the
    topic may have been deleted and created again under the same name meanwhile."""
    image = existing("orders", "payments")
    orders, payments = image.topic_ids["orders"], image.topic_ids["payments"]
    stale = bytes(16)  # the id of an "orders" deleted since
    request = cpb.DeleteTopicsRequest(
        names=["orders", "payments"], topic_ids={"orders": stale, "payments": payments}
    )
    outcome = delete_topics(image, request)
    assert [(t.name, t.error, t.message, t.topic_id) for t in outcome.response.topics] == [
        ("orders", cpb.UNKNOWN_TOPIC_ID, f"topic id {stale.hex()} no longer names topic 'orders'",
         b""),
        ("payments", cpb.NONE, "", payments),
    ]  # fmt: skip
    assert replay(image, outcome.records).topic_ids == {"orders": orders}


def test_a_topic_named_twice_for_deletion_is_answered_once_as_a_duplicate() -> None:
    image = existing("orders", "payments")
    request = cpb.DeleteTopicsRequest(names=["orders", "payments", "orders", "orders"])
    outcome = delete_topics(image, request)
    assert [(t.name, t.error, t.message) for t in outcome.response.topics] == [
        ("orders", cpb.INVALID_REQUEST, "Duplicate topic name."),
        ("payments", cpb.NONE, ""),
    ]
    assert list(replay(image, outcome.records).topic_ids) == ["orders"]


# -- CreatePartitions --------------------------------------------------------------------------


def grow(
    image: MetadataImage,
    *items: tuple[str, int],
    validate_only: bool = False,
    limits: TopicLimits = LIMITS,
) -> Outcome[cpb.CreatePartitionsResponse]:
    request = cpb.CreatePartitionsRequest(
        topics=[cpb.CreatePartitionsTopic(name=n, count=c) for n, c in items],
        validate_only=validate_only,
    )
    return create_partitions(image, request, 0, limits)


def test_create_partitions_adds_partitions_with_the_topic_s_replication_factor() -> None:
    image = existing("orders")  # 2 partitions, replication factor 2
    outcome = grow(image, ("orders", 5))
    assert [(t.name, t.error) for t in outcome.response.topics] == [("orders", cpb.NONE)]
    after = replay(image, outcome.records)
    orders = after.topic_by_name("orders")
    assert orders is not None and sorted(orders.partitions) == [0, 1, 2, 3, 4]
    for p in orders.partitions.values():
        assert len(p.replicas) == 2 and p.isr == p.replicas and p.leader == p.replicas[0]
    assert max(counts(after)[0].values()) - min(counts(after)[0].values()) <= 1


def test_new_partitions_go_to_the_least_loaded_brokers_first() -> None:
    image = cluster(("r1", "r2"))
    image = replay(image, create(image, topic("orders", 2, 1)).records)
    image = replay(image, [rec.register_broker(3, 103, b"3" * 16), rec.unfence_broker(3, 103)])
    after = replay(image, grow(image, ("orders", 3)).records)
    assert replicas_of(after, tid(1000), 2) == (3,)
    assert replica_load(after) == {1: (1, 1), 2: (1, 1), 3: (1, 1)}


@pytest.mark.parametrize("count", [2, 1, 0])
def test_a_count_not_above_the_current_one_is_invalid_partitions(count: int) -> None:
    outcome = grow(existing("orders"), ("orders", count))
    assert outcome.records == ()
    (result,) = outcome.response.topics
    assert result.error == cpb.INVALID_PARTITIONS
    assert f"has 2 partitions; the new count must be larger, not {count}" in result.message


def test_a_count_above_the_per_topic_limit_is_invalid_partitions() -> None:
    outcome = grow(
        existing("orders"), ("orders", 4), limits=TopicLimits(max_partitions_per_topic=3)
    )
    assert outcome.records == () and outcome.response.topics[0].error == cpb.INVALID_PARTITIONS


def test_create_partitions_of_an_unknown_topic_is_unknown_topic_or_partition() -> None:
    outcome = grow(existing("orders"), ("nope", 3))
    assert (
        outcome.records == () and outcome.response.topics[0].error == cpb.UNKNOWN_TOPIC_OR_PARTITION
    )


def test_a_topic_named_twice_for_new_partitions_is_answered_once_as_a_duplicate() -> None:
    outcome = grow(existing("orders"), ("orders", 3), ("orders", 4))
    assert outcome.records == ()
    assert [(t.name, t.error, t.message) for t in outcome.response.topics] == [
        ("orders", cpb.INVALID_REQUEST, "Duplicate topic name.")
    ]


def test_create_partitions_needs_as_many_alive_brokers_as_the_replication_factor() -> None:
    image = existing("orders")
    image = replay(image, [rec.fence_broker(1, 101), rec.fence_broker(2, 102)])
    outcome = grow(image, ("orders", 3))
    assert outcome.records == ()
    assert outcome.response.topics[0].error == cpb.INVALID_REPLICATION_FACTOR
    assert (
        "replication factor 2 is larger than the 1 available brokers"
        in outcome.response.topics[0].message
    )


def test_create_partitions_respects_the_cluster_partition_limit() -> None:
    outcome = grow(existing("orders"), ("orders", 5), limits=TopicLimits(max_cluster_partitions=4))
    assert outcome.records == () and outcome.response.topics[0].error == cpb.POLICY_VIOLATION


def test_create_partitions_validate_only_writes_nothing() -> None:
    outcome = grow(existing("orders"), ("orders", 5), validate_only=True)
    assert outcome.records == () and outcome.response.topics[0].error == cpb.NONE


# -- purity ------------------------------------------------------------------------------------


def test_the_decision_modules_import_no_io_modules() -> None:
    banned = {"asyncio", "grpc", "time", "random", "os", "socket", "threading", "logging"}
    assert_imports_none_of((f"controller/{m}" for m in ("topics.py", "configs.py")), banned)


def test_limits_and_defaults_are_validated() -> None:
    with pytest.raises(ValueError):
        TopicLimits(max_partitions_per_topic=0)
    with pytest.raises(ValueError):
        TopicLimits(max_cluster_partitions=0)
    with pytest.raises(ValueError):
        TopicLimits(max_partitions_per_request=0)
    with pytest.raises(ValueError):
        TopicDefaults(num_partitions=0)
