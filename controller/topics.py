"""Topic decisions of the active controller: CreateTopics, DeleteTopics, CreatePartitions.

How this works. Each function takes the current (speculative) image and the request and
returns an ``Outcome``: the records that carry out every accepted item and one result per
distinct name, in the order the names first appear. Items are decided one after another
against the image *and* what the items before them took (brokers' load, the cluster's
partition count, topic ids), so the records of one request, committed together, are exactly
what one-by-one requests would have written. An item that breaks a rule gets its error code
and message and writes nothing; the others go on. With ``validate_only`` every item is
answered as if carried out, and no records are returned.

A name given more than once in one request (any of the three) is answered once, at its first
place, with INVALID_REQUEST "Duplicate topic name." and none of its occurrences is carried
out, as Kafka's ControllerApis answers it. A CreateTopics of ``__cluster_metadata`` (the
metadata log's name, ``METADATA_TOPIC``) given once is INVALID_REQUEST "Creation of internal
topic __cluster_metadata is prohibited." and takes no further part in the request (it counts
for no partitions, collides with no name), as Kafka's ControllerApis.createTopics takes it out
first; to every other request the name is legal and no topic has it.

CreateTopics first refuses the request as a whole (``DecisionError``, POLICY_VIOLATION
"Excessively large number of partitions per request.") when its names given once ask for more
than ``max_partitions_per_request`` partitions together (-1 counts the default, 0 and other
negatives nothing), before any other rule: Kafka's
ReplicationControlManager.validateTotalNumberOfPartitions. Then, per topic, the rules in the
order they are checked (first failure answers):

    Kafka's name rules (1-249 characters of [a-zA-Z0-9._-], not "." or "..")
                                            INVALID_TOPIC_EXCEPTION
    two names in the request that differ only by '.' versus '_'
                                            INVALID_TOPIC_EXCEPTION (both)
    the name exists                         TOPIC_ALREADY_EXISTS
    it differs from an existing name only by '.' versus '_' (their metric names would
    collide)                                INVALID_TOPIC_EXCEPTION
    partitions not -1 (the default) and not 1..max_partitions_per_topic
                                            INVALID_PARTITIONS
    replication factor not -1 (the default) and not 1..the alive brokers
                                            INVALID_REPLICATION_FACTOR
    configs: names and values (controller/configs.py)
                                            INVALID_CONFIG (INVALID_REQUEST if repeated)
    the cluster would hold more than max_cluster_partitions
                                            POLICY_VIOLATION

Alive brokers are registered, unfenced and not in controlled shutdown. Replicas are placed by
``controller.placement.place_replicas`` against the brokers' current load (replicas and
preferred leaderships held); every new partition starts with ISR = replicas, the first
replica leading, and both epochs 0. The records of a topic are its ``TopicRecord``, one
``PartitionRecord`` per partition, then a ``ConfigRecord`` per config entry (by name).

Cost: the brokers' load is the image's derived ``broker_load`` (kept up to date by the
delta), so a decision costs O(brokers + what it creates), not a pass over every partition; a
caller may pass another load (``load``). ``replica_load`` is the full pass, for checks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from controller import records as rec
from controller.broker_load import count_load
from controller.config import MAX_PARTITIONS_PER_TOPIC
from controller.configs import as_error_code, validate_topic_configs
from controller.image import TOPIC_ID_BYTES, MetadataImage, TopicImage
from controller.outcome import DecisionError, Outcome
from controller.placement import BrokerSlot, PlacementError, place_replicas
from controller.records import ConfigResourceType, MetadataRecord
from controller.topic_names import check_topic_name
from proto import controller_pb2 as cpb
from storage.config import LogConfig
from storage.errors import invariant

__all__ = [
    "DUPLICATE_NAME",
    "METADATA_TOPIC",
    "METADATA_TOPIC_PROHIBITED",
    "TOO_MANY_PARTITIONS",
    "Load",
    "TopicDefaults",
    "TopicLimits",
    "alive_broker_slots",
    "create_partitions",
    "create_topics",
    "delete_topics",
    "repeated",
    "replica_load",
]

DUPLICATE_NAME = "Duplicate topic name."  # Kafka's ControllerApis message
TOO_MANY_PARTITIONS = "Excessively large number of partitions per request."  # Kafka's
_DEFAULT = -1  # num_partitions or replication_factor: the cluster default
_MAX_VARIANTS = 64  # collision check: try 2**k spellings up to this, else scan every name
_H = TypeVar("_H", bound=Hashable)
Load = Mapping[int, tuple[int, int]]  # broker id -> (replicas, preferred leaderships) held


@dataclass(frozen=True, slots=True)
class TopicDefaults:
    """What a topic created with -1 gets (``ControllerConfig.num_partitions`` and
    ``default_replication_factor``)."""

    num_partitions: int = 1
    replication_factor: int = 1

    def __post_init__(self) -> None:
        if self.num_partitions < 1 or self.replication_factor < 1:
            raise ValueError(f"topic defaults must be at least 1: {self}")


@dataclass(frozen=True, slots=True)
class TopicLimits:
    """What one CreateTopics or CreatePartitions may ask for. The controller service passes
    ``ControllerConfig.max_cluster_partitions``; None (the default here, for decisions tested
    alone) is no limit on the cluster."""

    max_partitions_per_topic: int = MAX_PARTITIONS_PER_TOPIC
    max_partitions_per_request: int = 10_000  # CreateTopics, all topics (Kafka's per batch)
    max_cluster_partitions: int | None = None  # None: no limit
    max_topic_id_attempts: int = 100  # draws of new_topic_id before giving up

    def __post_init__(self) -> None:
        limit = self.max_cluster_partitions
        if (
            self.max_partitions_per_topic < 1
            or self.max_partitions_per_request < 1
            or self.max_topic_id_attempts < 1
        ):
            raise ValueError(f"topic limits must be at least 1: {self}")
        if limit is not None and limit < 1:
            raise ValueError(f"max_cluster_partitions must be at least 1 or None: {limit}")


# -- shared helpers ----------------------------------------------------------------------------


# The metadata log's name (Kafka's Topic.CLUSTER_METADATA_TOPIC_NAME): its directory is
# <data dir>/__cluster_metadata-0, beside partition logs. A legal name no topic may take.
METADATA_TOPIC = "__cluster_metadata"
METADATA_TOPIC_PROHIBITED = f"Creation of internal topic {METADATA_TOPIC} is prohibited."


def alive_broker_slots(image: MetadataImage) -> list[BrokerSlot]:
    """The brokers new replicas may go to: registered, unfenced, not shutting down."""
    return [
        BrokerSlot(b.broker_id, b.rack)
        for _, b in sorted(image.brokers.items())
        if not b.fenced and not b.in_controlled_shutdown
    ]


def replica_load(image: MetadataImage) -> dict[int, tuple[int, int]]:
    """Each broker's (replicas, preferred leaderships) in ``image``, counted by a pass over
    every partition: what ``image.broker_load`` must always equal."""
    return dict(
        count_load(p.replicas for t in image.topics.values() for p in t.partitions.values())
    )


def repeated(items: Iterable[_H]) -> set[_H]:
    """The items given more than once (a name is answered once, with ``DUPLICATE_NAME``)."""
    return {item for item, count in Counter(items).items() if count > 1}


def _duplicate() -> DecisionError:
    return DecisionError(cpb.INVALID_REQUEST, DUPLICATE_NAME)


def _collision_key(name: str) -> str:
    return name.replace(".", "_")


def _colliding_topic(image: MetadataImage, name: str) -> str | None:
    """An existing topic whose name differs from ``name`` only by '.' versus '_'. Tries the
    2**k spellings of a name with k such characters while that is cheaper than a scan."""
    spots = [i for i, c in enumerate(name) if c in "._"]
    if 2 ** len(spots) <= min(_MAX_VARIANTS, len(image.topic_ids)):
        for mask in range(2 ** len(spots)):
            chars = list(name)
            for bit, i in enumerate(spots):
                chars[i] = "_" if mask >> bit & 1 else "."
            variant = "".join(chars)
            if variant != name and variant in image.topic_ids:
                return variant
        return None
    key = _collision_key(name)
    return next((t for t in image.topic_ids if t != name and _collision_key(t) == key), None)


class _Capacity:
    """The alive brokers and what the items accepted so far in one request took from them."""

    def __init__(
        self, image: MetadataImage, load: Load | None, start: int, limits: TopicLimits
    ) -> None:
        self.slots = alive_broker_slots(image)
        self.load = dict(image.broker_load if load is None else load)
        self.partitions = image.partition_count()
        self.start = start
        self.limits = limits

    def check_replication(self, replication_factor: int) -> None:
        if replication_factor > len(self.slots):
            raise DecisionError(
                cpb.INVALID_REPLICATION_FACTOR,
                f"replication factor {replication_factor} is larger than the "
                f"{len(self.slots)} available brokers",
            )

    def check_room(self, new_partitions: int) -> None:
        limit = self.limits.max_cluster_partitions
        if limit is not None and self.partitions + new_partitions > limit:
            raise DecisionError(
                cpb.POLICY_VIOLATION,
                f"{new_partitions} more partitions would make {self.partitions + new_partitions}"
                f" in the cluster, above its limit of {limit}",
            )

    def place(self, partitions: int, replication_factor: int) -> list[tuple[int, ...]]:
        try:
            placed = place_replicas(
                self.slots, partitions, replication_factor, self.load, self.start
            )
        except PlacementError as e:
            raise DecisionError(cpb.INVALID_REPLICATION_FACTOR, str(e)) from None
        self.start += 1  # the next topic starts its stripes elsewhere
        self.partitions += partitions
        for replicas in placed:
            for i, broker in enumerate(replicas):
                held, leads = self.load.get(broker, (0, 0))
                self.load[broker] = (held + 1, leads + (i == 0))
        return placed


def _partition_records(
    topic_id: bytes, first_id: int, placed: list[tuple[int, ...]]
) -> list[MetadataRecord]:
    return [
        rec.partition(topic_id, first_id + i, replicas, replicas, leader=replicas[0])
        for i, replicas in enumerate(placed)
    ]


# -- CreateTopics ------------------------------------------------------------------------------


@dataclass(slots=True)
class _NewTopic:
    partitions: int
    replication_factor: int
    placed: list[tuple[int, ...]]
    configs: dict[str, str] = field(default_factory=dict)


def create_topics(
    image: MetadataImage,
    request: cpb.CreateTopicsRequest,
    defaults: TopicDefaults,
    new_topic_id: Callable[[], bytes],
    placement_start: int,
    limits: TopicLimits = TopicLimits(),
    *,
    log_defaults: LogConfig | None = None,
    load: Load | None = None,
) -> Outcome[cpb.CreateTopicsResponse]:
    """Creates the requested topics (module doc: the rules). ``new_topic_id`` draws 16
    random bytes; ``placement_start`` is a random int that spreads where placement starts;
    ``log_defaults`` is the node's ``[log]`` section, which config values are checked
    against. ``DecisionError`` if the request asks too many partitions in all
    (TOO_MANY_PARTITIONS), or if ``new_topic_id`` keeps drawing ids already taken."""
    twice = repeated(t.name for t in request.topics)
    once = [t for t in request.topics if t.name not in twice and t.name != METADATA_TOPIC]
    _check_request_partitions(once, defaults, limits)
    keys = Counter(_collision_key(t.name) for t in once)
    capacity = _Capacity(image, load, placement_start, limits)
    taken: set[bytes] = set()
    records: list[MetadataRecord] = []
    response = cpb.CreateTopicsResponse()
    answered: set[str] = set()  # the repeated names, once answered
    for topic in request.topics:
        if topic.name in twice:
            if topic.name not in answered:
                answered.add(topic.name)
                response.topics.append(_refused_topic(topic.name, _duplicate()))
            continue
        if topic.name == METADATA_TOPIC:
            refused = DecisionError(cpb.INVALID_REQUEST, METADATA_TOPIC_PROHIBITED)
            response.topics.append(_refused_topic(topic.name, refused))
            continue
        try:
            _check_in_request(topic.name, keys)
            new = _new_topic(image, topic, defaults, capacity, log_defaults or LogConfig())
        except DecisionError as e:
            response.topics.append(_refused_topic(topic.name, e))
            continue
        topic_id = _fresh_topic_id(image, taken, new_topic_id, limits.max_topic_id_attempts)
        records += _topic_records(topic.name, topic_id, new)
        response.topics.add(
            name=topic.name,
            topic_id=topic_id,
            num_partitions=new.partitions,
            replication_factor=new.replication_factor,
        )
    return Outcome(() if request.validate_only else tuple(records), response)


def _refused_topic(name: str, e: DecisionError) -> cpb.CreatableTopicResult:
    return cpb.CreatableTopicResult(
        name=name,
        error=as_error_code(e.code),
        message=e.message,
        num_partitions=_DEFAULT,
        replication_factor=_DEFAULT,
    )


def _check_request_partitions(
    topics: list[cpb.CreatableTopic], defaults: TopicDefaults, limits: TopicLimits
) -> None:
    """Kafka's bound on what one CreateTopics may ask for, checked before anything else."""
    total = sum(
        defaults.num_partitions if t.num_partitions == _DEFAULT else max(t.num_partitions, 0)
        for t in topics
    )
    if total > limits.max_partitions_per_request:
        raise DecisionError(cpb.POLICY_VIOLATION, TOO_MANY_PARTITIONS)


def _check_in_request(name: str, keys: Counter[str]) -> None:
    """The rules that look at the request alone: legal names, no collisions."""
    check_topic_name(name)
    if keys[_collision_key(name)] > 1:
        raise DecisionError(
            cpb.INVALID_TOPIC_EXCEPTION,
            f"topic {name!r} collides with another topic of the request: "
            "names that differ only by '.' versus '_' cannot both exist",
        )


def _new_topic(
    image: MetadataImage,
    topic: cpb.CreatableTopic,
    defaults: TopicDefaults,
    capacity: _Capacity,
    log_defaults: LogConfig,
) -> _NewTopic:
    if topic.name in image.topic_ids:
        raise DecisionError(cpb.TOPIC_ALREADY_EXISTS, f"topic {topic.name!r} already exists")
    other = _colliding_topic(image, topic.name)
    if other is not None:
        raise DecisionError(
            cpb.INVALID_TOPIC_EXCEPTION,
            f"topic {topic.name!r} collides with existing topic {other!r}: names that differ "
            "only by '.' versus '_' cannot both exist",
        )
    partitions = _partition_count(topic.num_partitions, defaults, capacity.limits)
    replication_factor = topic.replication_factor
    if replication_factor == _DEFAULT:
        replication_factor = defaults.replication_factor
    if replication_factor < 1:
        raise DecisionError(
            cpb.INVALID_REPLICATION_FACTOR,
            f"replication factor must be at least 1 (or -1 for the default "
            f"{defaults.replication_factor}), not {replication_factor}",
        )
    capacity.check_replication(replication_factor)
    configs = validate_topic_configs(((c.name, c.value) for c in topic.configs), log_defaults)
    capacity.check_room(partitions)
    placed = capacity.place(partitions, replication_factor)
    return _NewTopic(partitions, replication_factor, placed, configs)


def _partition_count(requested: int, defaults: TopicDefaults, limits: TopicLimits) -> int:
    count = defaults.num_partitions if requested == _DEFAULT else requested
    if not 1 <= count <= limits.max_partitions_per_topic:
        raise DecisionError(
            cpb.INVALID_PARTITIONS,
            f"number of partitions must be 1 to {limits.max_partitions_per_topic} (or -1 "
            f"for the default {defaults.num_partitions}), not {count}",
        )
    return count


def _fresh_topic_id(
    image: MetadataImage, taken: set[bytes], draw: Callable[[], bytes], attempts: int
) -> bytes:
    """A topic id no topic has (nor had in this request), and not all zeros (Kafka's
    "no id")."""
    for _ in range(attempts):
        topic_id = draw()
        invariant(len(topic_id) == TOPIC_ID_BYTES, f"topic id {topic_id.hex()} is not 16 bytes")
        if topic_id not in image.topics and topic_id not in taken and any(topic_id):
            taken.add(topic_id)
            return topic_id
    raise DecisionError(
        cpb.UNKNOWN_SERVER_ERROR, f"no unused topic id in {attempts} draws: the source repeats"
    )


def _topic_records(name: str, topic_id: bytes, new: _NewTopic) -> list[MetadataRecord]:
    out = [rec.topic(name, topic_id), *_partition_records(topic_id, 0, new.placed)]
    topic = ConfigResourceType.TOPIC
    out += [rec.config(topic, name, key, new.configs[key]) for key in sorted(new.configs)]
    return out


# -- DeleteTopics ------------------------------------------------------------------------------


def delete_topics(
    image: MetadataImage, request: cpb.DeleteTopicsRequest
) -> Outcome[cpb.DeleteTopicsResponse]:
    """Removes each named topic (its partitions and configs go with it); one answer per
    distinct name, with the topic's id. A name given with the id the client knew it by
    (``topic_ids``) is removed only if it still has that id."""
    twice = repeated(request.names)
    records: list[MetadataRecord] = []
    response = cpb.DeleteTopicsResponse()
    for name in dict.fromkeys(request.names):
        result = response.topics.add(name=name)
        topic_id = image.topic_ids.get(name)
        expected = request.topic_ids.get(name)
        if name in twice:
            result.error, result.message = cpb.INVALID_REQUEST, DUPLICATE_NAME
        elif expected is not None and expected != topic_id:
            result.error = cpb.UNKNOWN_TOPIC_ID
            result.message = f"topic id {expected.hex()} no longer names topic {name!r}"
        elif topic_id is None:
            result.error = cpb.UNKNOWN_TOPIC_OR_PARTITION
            result.message = f"no topic named {name!r}"
        else:
            result.topic_id = topic_id
            records.append(rec.remove_topic(topic_id))
    return Outcome(tuple(records), response)


# -- CreatePartitions --------------------------------------------------------------------------


def create_partitions(
    image: MetadataImage,
    request: cpb.CreatePartitionsRequest,
    placement_start: int,
    limits: TopicLimits = TopicLimits(),
    *,
    load: Load | None = None,
) -> Outcome[cpb.CreatePartitionsResponse]:
    """Raises each topic's partition count to ``count`` (its new total). New partitions get
    the topic's replication factor (that of its first partition) and are placed against
    the brokers' current load, so they go to the least-loaded brokers first. One answer per
    distinct name."""
    twice = repeated(t.name for t in request.topics)
    capacity = _Capacity(image, load, placement_start, limits)
    records: list[MetadataRecord] = []
    response = cpb.CreatePartitionsResponse()
    answered: set[str] = set()
    for item in request.topics:
        if item.name in answered:
            continue
        answered.add(item.name)
        result = response.topics.add(name=item.name)
        try:
            if item.name in twice:
                raise _duplicate()
            records += _add_partitions(image, item, capacity)
        except DecisionError as e:
            result.error, result.message = as_error_code(e.code), e.message
    return Outcome(() if request.validate_only else tuple(records), response)


def _add_partitions(
    image: MetadataImage, item: cpb.CreatePartitionsTopic, capacity: _Capacity
) -> list[MetadataRecord]:
    topic = image.topic_by_name(item.name)
    if topic is None:
        raise DecisionError(cpb.UNKNOWN_TOPIC_OR_PARTITION, f"no topic named {item.name!r}")
    current = len(topic.partitions)
    if item.count <= current:
        raise DecisionError(
            cpb.INVALID_PARTITIONS,
            f"topic {item.name!r} has {current} partitions; the new count must be larger, "
            f"not {item.count} (partitions cannot be removed)",
        )
    if item.count > capacity.limits.max_partitions_per_topic:
        raise DecisionError(
            cpb.INVALID_PARTITIONS,
            f"topic {item.name!r} cannot have {item.count} partitions, more than the "
            f"limit of {capacity.limits.max_partitions_per_topic}",
        )
    replication_factor = _replication_factor(topic)
    capacity.check_replication(replication_factor)
    capacity.check_room(item.count - current)
    placed = capacity.place(item.count - current, replication_factor)
    return _partition_records(topic.topic_id, current, placed)


def _replication_factor(topic: TopicImage) -> int:
    partitions = topic.partitions
    invariant(
        bool(partitions) and max(partitions) == len(partitions) - 1,
        f"topic {topic.name!r} has partitions {sorted(partitions)}, not 0..n-1",
    )
    return len(partitions[0].replicas)
