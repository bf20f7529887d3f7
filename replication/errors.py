"""Typed operating errors of a partition replica, each carrying its Kafka error code.

How this works. These are the *operating* errors of CONVENTIONS.md section 5: a client asked
the wrong broker, sent a stale epoch or bad bytes, or a disk failed. Each class names its code
(``code``, the number from Kafka's ``Errors.java``) and whether a client may simply retry
(``retriable``, as Kafka's exception hierarchy has it), so the request handlers map an error
to its code in one place (``error.code``) without knowing the classes. Broken invariants are
not here: ``storage.errors.InvariantViolation`` is never caught or mapped.

Storage raises its own typed errors (``storage.errors``); ``from_storage_error`` turns each
into the error a Kafka client expects, once, at the partition boundary::

    CorruptRecordError         CORRUPT_MESSAGE (2)        bad CRC, magic, framing
    RecordTooLargeError        MESSAGE_TOO_LARGE (10)     one batch over max_message_bytes
    (request over segment)     RECORD_LIST_TOO_LARGE (18) checked by the partition first
    InvalidRecordError         INVALID_RECORD (87)        see ``InvalidRecord.legacy_code``
    OffsetOutOfRangeError      OFFSET_OUT_OF_RANGE (1)
    OutOfOrderSequenceError    OUT_OF_ORDER_SEQUENCE_NUMBER (45)
    InvalidProducerEpochError  INVALID_PRODUCER_EPOCH (47)
    LogDirOfflineError         KAFKA_STORAGE_ERROR (56)
    InconsistentLogError       KAFKA_STORAGE_ERROR (56)
    anything else              UNKNOWN_SERVER_ERROR (-1)

Storage raises ``RecordTooLargeError`` both for one batch over ``max_message_bytes`` and for
a whole append over ``segment_bytes``; Kafka answers the first MESSAGE_TOO_LARGE and the second
RECORD_LIST_TOO_LARGE. The partition checks the request size against ``segment_bytes``
itself before appending (as Kafka's log does), so a ``RecordTooLargeError`` reaching the
mapping is always the per-batch one.
"""

from __future__ import annotations

from storage import errors as storage_errors

__all__ = [
    "CorruptMessage",
    "FencedLeaderEpoch",
    "InvalidProducerEpoch",
    "InvalidRecord",
    "InvalidRequiredAcks",
    "InvalidTimestamp",
    "KafkaStorageError",
    "MessageTooLarge",
    "NotEnoughReplicas",
    "NotEnoughReplicasAfterAppend",
    "NotLeaderOrFollower",
    "OffsetNotAvailable",
    "OffsetOutOfRange",
    "OutOfOrderSequenceNumber",
    "PolicyViolation",
    "RecordListTooLarge",
    "ReplicationError",
    "RequestTimedOut",
    "UnknownLeaderEpoch",
    "UnknownServerError",
    "UnknownTopicOrPartition",
    "from_storage_error",
]


class ReplicationError(Exception):
    """Base of the operating errors a replica raises; ``code`` is the Kafka error code."""

    code: int = -1  # UNKNOWN_SERVER_ERROR
    retriable: bool = False


class UnknownServerError(ReplicationError):
    code = -1


class OffsetOutOfRange(ReplicationError):
    code = 1


class CorruptMessage(ReplicationError):
    code = 2
    retriable = True  # Kafka's CorruptRecordException is a RetriableException


class UnknownTopicOrPartition(ReplicationError):
    code = 3
    retriable = True


class NotLeaderOrFollower(ReplicationError):
    """This broker is not the leader (or a replica at all) of the partition."""

    code = 6
    retriable = True


class RequestTimedOut(ReplicationError):
    code = 7
    retriable = True


class MessageTooLarge(ReplicationError):
    """One batch is larger than the topic's ``max.message.bytes``."""

    code = 10


class RecordListTooLarge(ReplicationError):
    """One produce request for a partition is larger than a whole segment."""

    code = 18


class NotEnoughReplicas(ReplicationError):
    """acks=-1 while the ISR is smaller than ``min.insync.replicas``: nothing was written."""

    code = 19
    retriable = True


class NotEnoughReplicasAfterAppend(ReplicationError):
    """Written, but the ISR shrank below ``min.insync.replicas`` before it was committed."""

    code = 20
    retriable = True


class OffsetNotAvailable(ReplicationError):
    """A new leader's high watermark is still below the start of its epoch: the offsets
    before it may not all be committed, so "latest" and a timestamp lookup past the high
    watermark are not answered yet (Kafka's Partition.fetchOffsetForTimestamp). Retriable;
    ListOffsets below v5 answers ``legacy_code`` (LEADER_NOT_AVAILABLE) instead."""

    code = 78
    legacy_code = 5
    retriable = True


class PolicyViolation(ReplicationError):
    """The topic's configuration forbids the request (DeleteRecords on a topic whose
    cleanup.policy does not include "delete")."""

    code = 44


class InvalidRequiredAcks(ReplicationError):
    code = 21


class InvalidTimestamp(ReplicationError):
    code = 32


class OutOfOrderSequenceNumber(ReplicationError):
    code = 45


class InvalidProducerEpoch(ReplicationError):
    code = 47


class KafkaStorageError(ReplicationError):
    """The partition's log directory is offline after an I/O error."""

    code = 56
    retriable = True


class FencedLeaderEpoch(ReplicationError):
    """The request's leader epoch is older than this replica's: the client is behind."""

    code = 74
    retriable = True


class UnknownLeaderEpoch(ReplicationError):
    """The request's leader epoch is newer than this replica's: this broker is behind."""

    code = 75
    retriable = True


class InvalidRecord(ReplicationError):
    """Well-formed bytes that break a rule (record count, a keyless record on a compacted
    topic, several batches from an idempotent producer).

    INVALID_RECORD exists since Produce v8 (KIP-467). Before that Kafka's
    ``InvalidRecordException`` was a ``CorruptRecordException``, so a handler answering an
    older Produce version sends ``legacy_code`` (CORRUPT_MESSAGE) instead."""

    code = 87
    legacy_code = CorruptMessage.code


_FROM_STORAGE: tuple[tuple[type[storage_errors.StorageError], type[ReplicationError]], ...] = (
    (storage_errors.CorruptRecordError, CorruptMessage),
    (storage_errors.RecordTooLargeError, MessageTooLarge),
    (storage_errors.InvalidRecordError, InvalidRecord),
    (storage_errors.InvalidTimestampError, InvalidTimestamp),
    (storage_errors.OffsetOutOfRangeError, OffsetOutOfRange),
    (storage_errors.OutOfOrderSequenceError, OutOfOrderSequenceNumber),
    (storage_errors.InvalidProducerEpochError, InvalidProducerEpoch),
    (storage_errors.LogDirOfflineError, KafkaStorageError),
    (storage_errors.OutOfFileDescriptorsError, KafkaStorageError),
    (storage_errors.InconsistentLogError, KafkaStorageError),
)


def from_storage_error(error: storage_errors.StorageError) -> ReplicationError:
    """The replication error a storage error means to a Kafka client (module doc); the caller
    raises it ``from`` the original so the cause stays in the traceback."""
    for storage_type, replication_type in _FROM_STORAGE:
        if isinstance(error, storage_type):
            return replication_type(str(error))
    return UnknownServerError(f"{type(error).__name__}: {error}")
