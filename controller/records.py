"""Metadata records on the wire: one record's bytes, and a snapshot's container of records.

How this works: a metadata record is a ``MetadataRecord`` protobuf (``proto/metadata.proto``)
with exactly one member of its ``oneof record`` set. ``encode`` serialises it
deterministically; the bytes travel as one opaque Raft record. ``decode`` parses bytes from
the log or a peer, which are untrusted: bytes that do not parse, or that carry no record type
this code knows (an empty message, or one written by a newer version), raise ``RecordError``.
The small constructors below (``topic(...)``, ``partition_change(...)``, ...) exist so that
controller code and tests read as the records they write.

A snapshot container (``pack_snapshot`` / ``unpack_snapshot``) holds an image's records in
canonical order; ``controller.image`` decides what goes in it. Layout, big-endian::

    magic "RNMI" (4) | version u16 | offset i64 | record count u32     header, 18 bytes
    record count x ( length u32 | encoded MetadataRecord )             body
    crc32c u32 of header + body                                        trailer

Any damage (short data, wrong magic or version, checksum mismatch, a length running past the
end, bytes left over, a record that does not decode) raises ``SnapshotError``. ``frame_records``
is the body alone: the image digest hashes it, so the digest does not depend on the offset.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from enum import IntEnum

import crc32c
from google.protobuf.message import DecodeError

from proto import metadata_pb2 as pb

__all__ = [
    "SNAPSHOT_VERSION",
    "ConfigResourceType",
    "MetadataRecord",
    "RecordError",
    "SnapshotError",
    "broker_registration_change",
    "config",
    "decode",
    "encode",
    "feature_level",
    "fence_broker",
    "frame_records",
    "no_op",
    "pack_snapshot",
    "partition",
    "partition_change",
    "producer_ids",
    "register_broker",
    "remove_topic",
    "topic",
    "unfence_broker",
    "unpack_snapshot",
    "unregister_broker",
]

MetadataRecord = pb.MetadataRecord

SNAPSHOT_VERSION = 1
_MAGIC = b"RNMI"
_HEADER = struct.Struct(">4sHqI")
_LENGTH = struct.Struct(">I")
_CRC = struct.Struct(">I")


class RecordError(ValueError):
    """Bytes that are not a metadata record this code understands."""

    retriable = False


class SnapshotError(ValueError):
    """Snapshot bytes that are damaged, from an unknown format version, or do not replay."""

    retriable = False


class ConfigResourceType(IntEnum):
    """What a config entry belongs to (Kafka's numbering, as in ``ConfigResourceType``)."""

    TOPIC = pb.TOPIC
    BROKER = pb.BROKER


# -- one record --------------------------------------------------------------------------------


def encode(record: MetadataRecord) -> bytes:
    if record.WhichOneof("record") is None:
        raise RecordError("a metadata record must carry a record type")
    return record.SerializeToString(deterministic=True)


def decode(data: bytes) -> MetadataRecord:
    record = MetadataRecord()
    try:
        record.ParseFromString(data)
    except DecodeError as e:
        raise RecordError(f"metadata record does not parse: {e}") from e
    if record.WhichOneof("record") is None:
        # Empty, or only fields this version does not know: replaying it as a no-op would
        # silently drop a change a newer controller made.
        raise RecordError(f"metadata record of {len(data)} bytes carries no known record type")
    return record


# -- snapshot container ------------------------------------------------------------------------


def frame_records(records: Iterable[MetadataRecord]) -> bytes:
    parts = []
    for record in records:
        data = encode(record)
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def pack_snapshot(offset: int, records: Sequence[MetadataRecord]) -> bytes:
    head = _HEADER.pack(_MAGIC, SNAPSHOT_VERSION, offset, len(records))
    body = frame_records(records)
    crc = crc32c.crc32c(body, crc32c.crc32c(head))
    return head + body + _CRC.pack(crc)


def unpack_snapshot(data: bytes) -> tuple[int, list[MetadataRecord]]:
    """The offset and records of a snapshot container; ``SnapshotError`` on any damage."""
    view = memoryview(data)
    if len(view) < _HEADER.size + _CRC.size:
        raise SnapshotError(f"snapshot of {len(view)} bytes is shorter than header and trailer")
    magic, version, offset, count = _HEADER.unpack_from(view, 0)
    if magic != _MAGIC:
        raise SnapshotError(f"not a metadata snapshot (magic {bytes(magic)!r})")
    if version != SNAPSHOT_VERSION:
        raise SnapshotError(f"snapshot format version {version} is not {SNAPSHOT_VERSION}")
    end = len(view) - _CRC.size
    (stored,) = _CRC.unpack_from(view, end)
    if crc32c.crc32c(view[:end]) != stored:
        raise SnapshotError("snapshot checksum mismatch")
    if offset < -1:
        raise SnapshotError(f"snapshot offset {offset} is below -1")
    return offset, _unframe(view[_HEADER.size : end], count)


def _unframe(body: memoryview, count: int) -> list[MetadataRecord]:
    records, pos = [], 0
    while pos < len(body):
        if pos + _LENGTH.size > len(body):
            raise SnapshotError(f"record length at body position {pos} is cut off")
        (length,) = _LENGTH.unpack_from(body, pos)
        pos += _LENGTH.size
        if pos + length > len(body):
            raise SnapshotError(
                f"record of {length} bytes at body position {pos} runs past the end"
            )
        try:
            records.append(decode(bytes(body[pos : pos + length])))
        except RecordError as e:
            raise SnapshotError(f"snapshot record {len(records)}: {e}") from e
        pos += length
    if len(records) != count:
        raise SnapshotError(f"snapshot holds {len(records)} records, its header says {count}")
    return records


# -- constructors ------------------------------------------------------------------------------


def register_broker(
    broker_id: int,
    broker_epoch: int,
    incarnation_id: bytes,
    listeners: Iterable[tuple[str, str, int]] = (),
    rack: str | None = None,
    *,
    fenced: bool = True,
) -> MetadataRecord:
    return MetadataRecord(
        register_broker=pb.RegisterBrokerRecord(
            broker_id=broker_id,
            incarnation_id=incarnation_id,
            broker_epoch=broker_epoch,
            listeners=[pb.Listener(name=n, host=h, port=p) for n, h, p in listeners],
            rack=rack or "",
            fenced=fenced,
        )
    )


def unregister_broker(broker_id: int, broker_epoch: int) -> MetadataRecord:
    r = pb.UnregisterBrokerRecord(broker_id=broker_id, broker_epoch=broker_epoch)
    return MetadataRecord(unregister_broker=r)


def fence_broker(broker_id: int, broker_epoch: int) -> MetadataRecord:
    r = pb.FenceBrokerRecord(broker_id=broker_id, broker_epoch=broker_epoch)
    return MetadataRecord(fence_broker=r)


def unfence_broker(broker_id: int, broker_epoch: int) -> MetadataRecord:
    r = pb.UnfenceBrokerRecord(broker_id=broker_id, broker_epoch=broker_epoch)
    return MetadataRecord(unfence_broker=r)


def broker_registration_change(
    broker_id: int,
    broker_epoch: int,
    *,
    fenced: bool | None = None,
    in_controlled_shutdown: bool | None = None,
) -> MetadataRecord:
    r = pb.BrokerRegistrationChangeRecord(
        broker_id=broker_id,
        broker_epoch=broker_epoch,
        fenced=fenced,
        in_controlled_shutdown=in_controlled_shutdown,
    )
    return MetadataRecord(broker_registration_change=r)


def topic(name: str, topic_id: bytes) -> MetadataRecord:
    return MetadataRecord(topic=pb.TopicRecord(name=name, topic_id=topic_id))


def partition(
    topic_id: bytes,
    partition_id: int,
    replicas: Sequence[int],
    isr: Sequence[int],
    leader: int,
    leader_epoch: int = 0,
    partition_epoch: int = 0,
) -> MetadataRecord:
    r = pb.PartitionRecord(
        topic_id=topic_id,
        partition_id=partition_id,
        replicas=replicas,
        isr=isr,
        leader=leader,
        leader_epoch=leader_epoch,
        partition_epoch=partition_epoch,
    )
    return MetadataRecord(partition=r)


def partition_change(
    topic_id: bytes,
    partition_id: int,
    *,
    leader: int | None = None,
    isr: Sequence[int] | None = None,
    replicas: Sequence[int] | None = None,
) -> MetadataRecord:
    """A change to one partition; ``None`` leaves a field unchanged (absent on the wire)."""
    r = pb.PartitionChangeRecord(topic_id=topic_id, partition_id=partition_id, leader=leader)
    if isr is not None:
        r.isr.CopyFrom(pb.BrokerIds(ids=isr))
    if replicas is not None:
        r.replicas.CopyFrom(pb.BrokerIds(ids=replicas))
    return MetadataRecord(partition_change=r)


def remove_topic(topic_id: bytes) -> MetadataRecord:
    return MetadataRecord(remove_topic=pb.RemoveTopicRecord(topic_id=topic_id))


def config(
    resource_type: ConfigResourceType, resource_name: str, name: str, value: str | None
) -> MetadataRecord:
    """Sets one config entry, or deletes it when ``value`` is ``None``."""
    r = pb.ConfigRecord(
        resource_type=resource_type.name, resource_name=resource_name, name=name, value=value
    )
    return MetadataRecord(config=r)


def producer_ids(broker_id: int, broker_epoch: int, next_producer_id: int) -> MetadataRecord:
    r = pb.ProducerIdsRecord(
        broker_id=broker_id, broker_epoch=broker_epoch, next_producer_id=next_producer_id
    )
    return MetadataRecord(producer_ids=r)


def feature_level(name: str, level: int) -> MetadataRecord:
    return MetadataRecord(feature_level=pb.FeatureLevelRecord(name=name, feature_level=level))


def no_op() -> MetadataRecord:
    return MetadataRecord(no_op=pb.NoOpRecord())
