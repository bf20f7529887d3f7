"""The metadata image: the cluster's metadata as one immutable value, and the delta that
builds the next one from committed records. Controllers and brokers use the same code.

How this works. A ``MetadataImage`` is what replaying the metadata log up to ``offset``
gives: brokers, topics with their partitions, configs, the producer-id high-water mark and
feature levels. It is never changed. To move forward, a ``MetadataDelta`` is opened on an
image, ``replay(record, offset)`` is called for each committed record in log order, and
``apply()`` returns the next image. The delta records only what changed (a touched topic
keeps only its changed partitions), and ``apply`` copies the top-level mappings once, rebuilds
only the touched topics, and shares every other ``TopicImage``, ``PartitionState`` and config
mapping with the old image. So replaying a batch of k records onto an image of T topics costs
O(k) Python work plus O(T) C-level dict copying per ``apply``: call ``apply`` once per
committed batch, not once per record.

Immutability: every mapping an image exposes is a ``types.MappingProxyType`` over a dict that
nothing refers to any more once the image is built, so neither callers nor later deltas can
change a published image (a write raises ``TypeError``). Values are frozen, slotted dataclasses.

Replay rules (KIP-631; the proto file documents the records). Records the log can legitimately
hold but that no longer apply (a fence, unfence, registration change or unregister whose broker
epoch is not the current registration's) are skipped and counted in
``MetadataDelta.ignored_records``. Records that break the image's invariants (a duplicate topic
name or id, a change to a missing topic or partition, producer ids going back, a partition
whose leader is outside its ISR) raise ``ImageError`` and leave the delta as it was.

Snapshots: ``to_records`` lists the image as records in a canonical order; replaying them
onto ``EMPTY`` (``image_from_records``) gives an equal image. ``encode_snapshot`` wraps them in
the container of ``controller.records`` together with the offset. ``digest`` is the sha256 of
the canonical records alone, *without* the offset: it names the state, so two nodes with the
same state agree even if one has since replayed a no-op; callers compare (offset, digest).

Derived state: ``broker_load`` (each broker's replicas and preferred leaderships,
``controller.broker_load``) is kept by the delta as partitions come, change and go. It is
not in the snapshot or the digest; replaying a snapshot rebuilds it, so it takes part in
image equality like everything else.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import ClassVar, NamedTuple, TypeVar

from controller import records as rec
from controller.broker_load import BrokerLoad, LoadChanges
from controller.records import ConfigResourceType, MetadataRecord, SnapshotError
from proto import metadata_pb2 as pb

__all__ = [
    "NO_LEADER",
    "BrokerLoad",
    "BrokerRegistration",
    "Endpoint",
    "ImageError",
    "MetadataDelta",
    "MetadataImage",
    "PartitionState",
    "TopicImage",
    "decode_snapshot",
    "encode_snapshot",
    "image_from_records",
]

NO_LEADER = -1
TOPIC_ID_BYTES = 16

K = TypeVar("K")
V = TypeVar("V")


class ImageError(Exception):
    """Committed records that break the image's invariants: the log (or the controller that
    wrote it) is wrong. The caller must stop applying; nothing is retriable."""

    retriable = False


class Endpoint(NamedTuple):
    name: str  # e.g. "PLAINTEXT", "CONTROLLER"
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    broker_id: int
    broker_epoch: int
    incarnation_id: bytes
    listeners: tuple[Endpoint, ...]
    rack: str | None
    fenced: bool
    in_controlled_shutdown: bool


@dataclass(frozen=True, slots=True)
class PartitionState:
    topic_id: bytes
    partition_id: int
    replicas: tuple[int, ...]  # the first is the preferred leader
    isr: tuple[int, ...]
    leader: int  # NO_LEADER (-1): none
    leader_epoch: int
    partition_epoch: int


@dataclass(frozen=True, slots=True)
class TopicImage:
    name: str
    topic_id: bytes
    partitions: Mapping[int, PartitionState]


@dataclass(frozen=True, slots=True)
class MetadataImage:
    offset: int  # the last Raft offset applied; -1: nothing
    brokers: Mapping[int, BrokerRegistration]
    topics: Mapping[bytes, TopicImage]  # by topic id
    topic_ids: Mapping[str, bytes]  # by topic name
    configs: Mapping[tuple[int, str], Mapping[str, str]]  # (resource type, name): entries
    next_producer_id: int
    features: Mapping[str, int]
    # The largest broker epoch ever registered (-1: none). Kept even after that broker
    # unregisters, so that a controller never hands out an epoch twice.
    broker_epoch_high_water: int
    # Derived from the partitions (module doc): broker id -> its load, brokers with none left out.
    broker_load: Mapping[int, BrokerLoad]
    # The digest, computed on first use: the image never changes, and the digest encodes it
    # all (about 1 s at 100,000 partitions), so a cluster status poll must not pay it twice.
    _digest: str | None = field(default=None, init=False, compare=False, repr=False)

    EMPTY: ClassVar[MetadataImage]

    @property
    def next_broker_epoch(self) -> int:
        return self.broker_epoch_high_water + 1

    def topic_by_name(self, name: str) -> TopicImage | None:
        topic_id = self.topic_ids.get(name)
        return None if topic_id is None else self.topics[topic_id]

    def partition(self, topic_id: bytes, partition_id: int) -> PartitionState | None:
        topic = self.topics.get(topic_id)
        return None if topic is None else topic.partitions.get(partition_id)

    def unfenced_broker_ids(self) -> tuple[int, ...]:
        return tuple(sorted(b for b, reg in self.brokers.items() if not reg.fenced))

    def partition_count(self) -> int:
        # Every partition has exactly one preferred leader: O(brokers), not O(topics).
        return sum(load.preferred_leaders for load in self.broker_load.values())

    def leaders_of(self, broker_id: int) -> tuple[PartitionState, ...]:
        """The partitions ``broker_id`` leads, by topic id and partition id (scans them all)."""
        return tuple(p for p in self._sorted_partitions() if p.leader == broker_id)

    def replicas_of(self, broker_id: int) -> tuple[PartitionState, ...]:
        """The partitions ``broker_id`` holds a replica of (scans them all)."""
        return tuple(p for p in self._sorted_partitions() if broker_id in p.replicas)

    def _sorted_partitions(self) -> Iterable[PartitionState]:
        for topic_id in sorted(self.topics):
            partitions = self.topics[topic_id].partitions
            yield from (partitions[p] for p in sorted(partitions))

    def to_records(self) -> list[MetadataRecord]:
        return _snapshot_records(self)

    def digest(self) -> str:
        """sha256 hex of the canonical records; the offset is not included (module doc).
        It encodes the whole image, O(partitions), once per image (then it is kept)."""
        if self._digest is None:
            digest = hashlib.sha256(rec.frame_records(self.to_records())).hexdigest()
            object.__setattr__(self, "_digest", digest)  # a cache of a frozen value's function
            return digest
        return self._digest


MetadataImage.EMPTY = MetadataImage(
    offset=-1,
    brokers=MappingProxyType({}),
    topics=MappingProxyType({}),
    topic_ids=MappingProxyType({}),
    configs=MappingProxyType({}),
    next_producer_id=0,
    features=MappingProxyType({}),
    broker_epoch_high_water=-1,
    broker_load=MappingProxyType({}),
)


# -- the delta ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _TopicChange:
    """A topic the delta touched. ``partitions`` holds only its new or changed partitions;
    ``base`` is the topic in the delta's image, or None for a topic created in the delta."""

    name: str
    topic_id: bytes
    base: TopicImage | None
    partitions: dict[int, PartitionState]

    def get(self, partition_id: int) -> PartitionState | None:
        state = self.partitions.get(partition_id)
        if state is None and self.base is not None:
            state = self.base.partitions.get(partition_id)
        return state

    def build(self) -> TopicImage:
        if self.base is not None and not self.partitions:
            return self.base
        merged = {} if self.base is None else _copy(self.base.partitions)
        merged.update(self.partitions)
        return TopicImage(self.name, self.topic_id, MappingProxyType(merged))

    def current(self) -> Iterable[PartitionState]:
        """Every partition the topic has now: the base's, as changed by the delta."""
        if self.base is not None:
            yield from (p for i, p in self.base.partitions.items() if i not in self.partitions)
        yield from self.partitions.values()


class MetadataDelta:
    """Committed records replayed on top of ``image`` and not yet published.

    Not thread-safe: one owner replays and applies. ``apply`` may be called any number of
    times, and replay may go on after it; an image already returned never changes. A record
    that raises ``ImageError`` leaves what ``apply`` would return unchanged.
    """

    def __init__(self, image: MetadataImage) -> None:
        self.image = image
        self.offset = image.offset
        self.ignored_records = 0  # skipped for a stale broker epoch (module doc)
        self.last_ignored = ""  # why the latest one was skipped, for the caller's log
        self._brokers: dict[int, BrokerRegistration | None] = {}  # None: unregistered
        self._high_water = image.broker_epoch_high_water
        self._topics: dict[bytes, _TopicChange | None] = {}  # None: removed
        self._topic_ids: dict[str, bytes | None] = {}  # None: removed
        self._configs: dict[tuple[int, str], dict[str, str]] = {}  # all entries; {}: removed
        self._next_producer_id = image.next_producer_id
        self._features: dict[str, int | None] = {}  # None: level 0, removed
        self._load = LoadChanges()

    def replay(self, record: MetadataRecord, offset: int) -> None:
        """Applies one committed record at ``offset``, which must follow the last one."""
        if offset <= self.offset:
            raise ImageError(f"record at offset {offset} does not follow offset {self.offset}")
        self._replay(record)
        self.offset = offset

    def apply(self) -> MetadataImage:
        base = self.image
        topics = {t: None if c is None else c.build() for t, c in self._topics.items()}
        configs = {k: MappingProxyType(dict(v)) if v else None for k, v in self._configs.items()}
        image = MetadataImage(
            offset=self.offset,
            brokers=_merge(base.brokers, self._brokers),
            topics=_merge(base.topics, topics),
            topic_ids=_merge(base.topic_ids, self._topic_ids),
            configs=_merge(base.configs, configs),
            next_producer_id=self._next_producer_id,
            features=_merge(base.features, self._features),
            broker_epoch_high_water=self._high_water,
            broker_load=self._load.applied_to(base.broker_load),
        )
        if base._digest is not None and _same_state(base, image):
            # Only the offset moved (no-ops, skipped records): the digest names the same state,
            # and a keep-alive no-op every half second must not cost a whole encoding each.
            object.__setattr__(image, "_digest", base._digest)
        return image

    def _replay(self, record: MetadataRecord) -> None:
        match record.WhichOneof("record"):
            case "register_broker":
                self._register_broker(record.register_broker)
            case "unregister_broker":
                self._unregister_broker(record.unregister_broker)
            case "fence_broker":
                self._fence_broker(record.fence_broker, fenced=True)
            case "unfence_broker":
                self._fence_broker(record.unfence_broker, fenced=False)
            case "broker_registration_change":
                self._broker_registration_change(record.broker_registration_change)
            case "broker_epoch_high_water":
                mark = record.broker_epoch_high_water.broker_epoch
                self._high_water = max(self._high_water, mark)
            case "topic":
                self._add_topic(record.topic)
            case "partition":
                self._put_partition(record.partition)
            case "partition_change":
                self._change_partition(record.partition_change)
            case "remove_topic":
                self._remove_topic(record.remove_topic)
            case "config":
                self._set_config(record.config)
            case "producer_ids":
                self._set_producer_ids(record.producer_ids)
            case "feature_level":
                self._set_feature(record.feature_level)
            case "no_op":
                pass
            case None:
                raise ImageError("a metadata record without a record type")

    # -- brokers

    def _broker(self, broker_id: int) -> BrokerRegistration | None:
        if broker_id in self._brokers:
            return self._brokers[broker_id]
        return self.image.brokers.get(broker_id)

    def _register_broker(self, r: pb.RegisterBrokerRecord) -> None:
        old = self._broker(r.broker_id)
        if old is not None and r.broker_epoch <= old.broker_epoch:
            raise ImageError(
                f"broker {r.broker_id} registered at epoch {r.broker_epoch}, "
                f"not above its current epoch {old.broker_epoch}"
            )
        self._brokers[r.broker_id] = BrokerRegistration(
            broker_id=r.broker_id,
            broker_epoch=r.broker_epoch,
            incarnation_id=r.incarnation_id,
            listeners=tuple(Endpoint(x.name, x.host, x.port) for x in r.listeners),
            rack=r.rack or None,
            fenced=r.fenced,
            in_controlled_shutdown=False,  # a new process starts afresh
        )
        self._high_water = max(self._high_water, r.broker_epoch)

    def _registration(self, broker_id: int, epoch: int, action: str) -> BrokerRegistration | None:
        """The registration an epoch-guarded record applies to, or None (counted) if stale.

        Kafka raises here (ClusterDelta.getBrokerOrThrow), which has left nodes unable to
        load their metadata log (KAFKA-19138); a record for a registration that has since
        been replaced changes nothing, so it is skipped instead.
        """
        current = self._broker(broker_id)
        if current is not None and current.broker_epoch == epoch:
            return current
        self.ignored_records += 1
        held = "none" if current is None else f"epoch {current.broker_epoch}"
        self.last_ignored = f"{action} broker {broker_id} at epoch {epoch}: registration {held}"
        return None

    def _unregister_broker(self, r: pb.UnregisterBrokerRecord) -> None:
        if self._registration(r.broker_id, r.broker_epoch, "unregister") is not None:
            self._brokers[r.broker_id] = None

    def _fence_broker(self, r: pb.FenceBrokerRecord | pb.UnfenceBrokerRecord, fenced: bool) -> None:
        action = "fence" if fenced else "unfence"
        current = self._registration(r.broker_id, r.broker_epoch, action)
        if current is not None:
            self._brokers[r.broker_id] = replace(current, fenced=fenced)

    def _broker_registration_change(self, r: pb.BrokerRegistrationChangeRecord) -> None:
        current = self._registration(r.broker_id, r.broker_epoch, "change")
        if current is None:
            return
        self._brokers[r.broker_id] = replace(
            current,
            fenced=r.fenced if r.HasField("fenced") else current.fenced,
            in_controlled_shutdown=(
                r.in_controlled_shutdown
                if r.HasField("in_controlled_shutdown")
                else current.in_controlled_shutdown
            ),
        )

    # -- topics and partitions

    def _topic_id(self, name: str) -> bytes | None:
        if name in self._topic_ids:
            return self._topic_ids[name]
        return self.image.topic_ids.get(name)

    def _topic_exists(self, topic_id: bytes) -> bool:
        if topic_id in self._topics:
            return self._topics[topic_id] is not None
        return topic_id in self.image.topics

    def _touch_topic(self, topic_id: bytes) -> _TopicChange:
        """The delta's entry for an existing topic, made on first touch (an untouched entry
        changes nothing); ``ImageError`` if there is no such topic."""
        if topic_id in self._topics:
            change = self._topics[topic_id]
        else:
            base = self.image.topics.get(topic_id)
            change = None if base is None else _TopicChange(base.name, topic_id, base, {})
            if change is not None:
                self._topics[topic_id] = change
        if change is None:
            raise ImageError(f"no topic with id {topic_id.hex()}")
        return change

    def _add_topic(self, r: pb.TopicRecord) -> None:
        if not r.name or len(r.topic_id) != TOPIC_ID_BYTES:
            raise ImageError(f"topic {r.name!r} with id {r.topic_id.hex()}: bad name or id")
        if self._topic_id(r.name) is not None:
            raise ImageError(f"topic {r.name!r} already exists")
        if self._topic_exists(r.topic_id):
            raise ImageError(f"topic id {r.topic_id.hex()} already exists")
        self._topics[r.topic_id] = _TopicChange(r.name, r.topic_id, None, {})
        self._topic_ids[r.name] = r.topic_id

    def _put_partition(self, r: pb.PartitionRecord) -> None:
        state = PartitionState(
            topic_id=r.topic_id,
            partition_id=r.partition_id,
            replicas=tuple(r.replicas),
            isr=tuple(r.isr),
            leader=r.leader,
            leader_epoch=r.leader_epoch,
            partition_epoch=r.partition_epoch,
        )
        _check_partition(state)
        topic = self._touch_topic(r.topic_id)
        old = topic.get(r.partition_id)
        if old is not None:
            self._load.remove(old.replicas)
        self._load.add(state.replicas)
        topic.partitions[r.partition_id] = state

    def _change_partition(self, r: pb.PartitionChangeRecord) -> None:
        topic = self._touch_topic(r.topic_id)
        old = topic.get(r.partition_id)
        if old is None:
            raise ImageError(f"topic {topic.name!r} has no partition {r.partition_id}")
        new = _changed_partition(old, r)
        _check_partition(new)
        if new.replicas != old.replicas:
            self._load.remove(old.replicas)
            self._load.add(new.replicas)
        topic.partitions[r.partition_id] = new

    def _remove_topic(self, r: pb.RemoveTopicRecord) -> None:
        topic = self._touch_topic(r.topic_id)
        for partition in topic.current():
            self._load.remove(partition.replicas)
        name = topic.name
        self._topics[r.topic_id] = None
        self._topic_ids[name] = None
        self._configs[(int(ConfigResourceType.TOPIC), name)] = {}

    # -- configs, producer ids, features

    def _set_config(self, r: pb.ConfigRecord) -> None:
        if r.resource_type not in _RESOURCE_TYPES or not r.name:
            raise ImageError(f"config {r.name!r} for resource type {r.resource_type}")
        key = (int(r.resource_type), r.resource_name)
        entries = self._configs.get(key)
        if entries is None:
            entries = self._configs[key] = dict(self.image.configs.get(key, {}))
        if r.HasField("value"):
            entries[r.name] = r.value
        else:
            entries.pop(r.name, None)

    def _set_producer_ids(self, r: pb.ProducerIdsRecord) -> None:
        if r.next_producer_id < self._next_producer_id:
            raise ImageError(
                f"next producer id {r.next_producer_id} is below {self._next_producer_id}: "
                "ids already handed out would be handed out again"
            )
        self._next_producer_id = r.next_producer_id

    def _set_feature(self, r: pb.FeatureLevelRecord) -> None:
        if not r.name or r.feature_level < 0:
            raise ImageError(f"feature {r.name!r} at level {r.feature_level}")
        # Level 0 means "off", and an off feature is not listed (as in Kafka's FeaturesImage).
        self._features[r.name] = r.feature_level or None


_RESOURCE_TYPES = frozenset(int(t) for t in ConfigResourceType)


def _changed_partition(old: PartitionState, r: pb.PartitionChangeRecord) -> PartitionState:
    leader = r.leader if r.HasField("leader") else old.leader
    return replace(
        old,
        replicas=tuple(r.replicas.ids) if r.HasField("replicas") else old.replicas,
        isr=tuple(r.isr.ids) if r.HasField("isr") else old.isr,
        leader=leader,
        # Only a new leader starts a new leader epoch: bumping it for an ISR change would
        # make every follower's fetch fail for nothing (KAFKA-15021).
        leader_epoch=old.leader_epoch + 1 if leader != old.leader else old.leader_epoch,
        partition_epoch=old.partition_epoch + 1,
    )


def _check_partition(p: PartitionState) -> None:
    """``ImageError`` unless ``p`` is a state a correct controller can write."""
    where = f"partition {p.partition_id} of topic {p.topic_id.hex()}"
    if p.partition_id < 0 or p.leader_epoch < 0 or p.partition_epoch < 0:
        raise ImageError(f"{where}: negative id or epoch")
    if not p.replicas or len(set(p.replicas)) != len(p.replicas):
        raise ImageError(f"{where}: replicas {p.replicas} are empty or repeat a broker")
    if len(set(p.isr)) != len(p.isr) or not set(p.isr) <= set(p.replicas):
        raise ImageError(f"{where}: ISR {p.isr} repeats a broker or is not within {p.replicas}")
    if p.leader != NO_LEADER and p.leader not in p.isr:
        raise ImageError(f"{where}: leader {p.leader} is not in the ISR {p.isr}")


def _same_state(a: MetadataImage, b: MetadataImage) -> bool:
    """Whether ``b`` shares every part of ``a`` (so only the offset can differ)."""
    return (
        a.brokers is b.brokers
        and a.topics is b.topics
        and a.topic_ids is b.topic_ids
        and a.configs is b.configs
        and a.features is b.features
        and a.next_producer_id == b.next_producer_id
        and a.broker_epoch_high_water == b.broker_epoch_high_water
    )


def _merge(base: Mapping[K, V], changes: Mapping[K, V | None]) -> Mapping[K, V]:
    """``base`` with ``changes`` made (None removes) as a new read-only mapping, or ``base``
    itself when nothing changed (so untouched parts of an image are shared, not copied)."""
    if not changes:
        return base
    merged = _copy(base)
    for key, value in changes.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return MappingProxyType(merged)


def _copy(mapping: Mapping[K, V]) -> dict[K, V]:
    # The proxy's copy() copies the dict beneath at C speed; dict(proxy) would go through the
    # generic mapping protocol, several times slower on a large image.
    if isinstance(mapping, MappingProxyType):
        copied: dict[K, V] = mapping.copy()
        return copied
    return dict(mapping)


# -- snapshots ---------------------------------------------------------------------------------


def image_from_records(records: Iterable[MetadataRecord], offset: int) -> MetadataImage:
    """The image that a snapshot's records describe, as of ``offset``: they are replayed onto
    ``EMPTY`` as one unit (all at ``offset``), and every one of them must apply."""
    delta = MetadataDelta(MetadataImage.EMPTY)
    for record in records:
        delta._replay(record)
    if delta.ignored_records:
        raise ImageError(f"snapshot record skipped: {delta.last_ignored}")
    delta.offset = offset
    return delta.apply()


def encode_snapshot(image: MetadataImage) -> bytes:
    return rec.pack_snapshot(image.offset, image.to_records())


def decode_snapshot(data: bytes) -> MetadataImage:
    offset, records = rec.unpack_snapshot(data)
    try:
        return image_from_records(records, offset)
    except ImageError as e:
        raise SnapshotError(f"snapshot records do not replay: {e}") from e


def _snapshot_records(image: MetadataImage) -> list[MetadataRecord]:
    """The canonical order: features, brokers by id, topics by name (each followed by its
    partitions by id, with their current epochs), configs by resource and name, producer ids."""
    out = [rec.feature_level(name, image.features[name]) for name in sorted(image.features)]
    out += _broker_records(image)
    for name in sorted(image.topic_ids):
        out += _topic_records(image.topics[image.topic_ids[name]])
    for key in sorted(image.configs):
        entries = image.configs[key]
        resource = ConfigResourceType(key[0])
        out += [rec.config(resource, key[1], name, entries[name]) for name in sorted(entries)]
    if image.next_producer_id != MetadataImage.EMPTY.next_producer_id:
        # Which broker took the latest block is not image state, so the record names none.
        out.append(rec.producer_ids(-1, -1, image.next_producer_id))
    return out


def _broker_records(image: MetadataImage) -> list[MetadataRecord]:
    out = []
    high_water = image.broker_epoch_high_water
    if high_water > max((b.broker_epoch for b in image.brokers.values()), default=-1):
        # The broker that registered the highest epoch has unregistered: keep the mark.
        mark = pb.BrokerEpochHighWaterRecord(broker_epoch=high_water)
        out.append(MetadataRecord(broker_epoch_high_water=mark))
    for broker_id in sorted(image.brokers):
        b = image.brokers[broker_id]
        out.append(
            rec.register_broker(
                broker_id, b.broker_epoch, b.incarnation_id, b.listeners, b.rack, fenced=b.fenced
            )
        )
        if b.in_controlled_shutdown:
            out.append(
                rec.broker_registration_change(
                    broker_id, b.broker_epoch, in_controlled_shutdown=True
                )
            )
    return out


def _topic_records(topic: TopicImage) -> list[MetadataRecord]:
    out = [rec.topic(topic.name, topic.topic_id)]
    for partition_id in sorted(topic.partitions):
        p = topic.partitions[partition_id]
        out.append(
            rec.partition(
                p.topic_id,
                partition_id,
                p.replicas,
                p.isr,
                p.leader,
                p.leader_epoch,
                p.partition_epoch,
            )
        )
    return out
