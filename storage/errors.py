"""Typed operating errors raised by the storage engine.

Two kinds of errors exist (CONVENTIONS.md section 5). The classes here are *operating* errors:
bad input or a failing disk, expected and handled by the caller, mapped once at the boundary
to a Kafka error code (``kafka_code``). Broken invariants are programmer errors and raise
``InvariantViolation`` through :func:`invariant` instead; nothing should catch those.
"""

from __future__ import annotations

import errno


class StorageError(Exception):
    """Base of every operating error the storage engine raises."""

    kafka_code: int = -1  # UNKNOWN_SERVER_ERROR
    retriable: bool = False


class CorruptRecordError(StorageError):
    """A batch failed its CRC, has the wrong magic, or is truncated."""

    kafka_code = 2  # CORRUPT_MESSAGE
    retriable = True


class InvalidRecordError(StorageError):
    """A batch is well-formed bytes but breaks a rule (offsets, counts, attributes)."""

    kafka_code = 87  # INVALID_RECORD


class RecordTooLargeError(StorageError):
    """A batch is larger than ``max_message_bytes`` or than a segment can hold."""

    kafka_code = 10  # MESSAGE_TOO_LARGE


class InvalidTimestampError(StorageError):
    """A client batch's timestamps lie outside what the log accepts around its clock
    (``message_timestamp_before_max_ms`` / ``message_timestamp_after_max_ms``)."""

    kafka_code = 32  # INVALID_TIMESTAMP


class OffsetOutOfRangeError(StorageError):
    """An offset lies outside [log start offset, log end offset]."""

    kafka_code = 1  # OFFSET_OUT_OF_RANGE


class OutOfOrderSequenceError(StorageError):
    """An idempotent producer's batch sequence is not the next one expected."""

    kafka_code = 45  # OUT_OF_ORDER_SEQUENCE_NUMBER


class InvalidProducerEpochError(StorageError):
    """An idempotent producer's epoch went backwards (a zombie producer)."""

    kafka_code = 47  # INVALID_PRODUCER_EPOCH


class OffsetOverflowError(StorageError):
    """An offset cannot be expressed relative to a segment's base offset (4 bytes)."""

    kafka_code = -1


class InconsistentLogError(StorageError):
    """On-disk state contradicts itself, e.g. segments deleted behind the engine's back."""

    kafka_code = 56  # KAFKA_STORAGE_ERROR


class LogDirOfflineError(StorageError):
    """An I/O error took the log directory offline; no further writes are accepted."""

    kafka_code = 56  # KAFKA_STORAGE_ERROR
    retriable = True


class OutOfFileDescriptorsError(StorageError):
    """The process (EMFILE) or the system (ENFILE) has no file descriptor left. A resource
    limit, not a failed disk: nothing is taken offline, and the operation may succeed once
    descriptors are free or the limit is raised (``ulimit -n``)."""

    kafka_code = 56  # KAFKA_STORAGE_ERROR
    retriable = True


def out_of_descriptors(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from, says the process or the system ran
    out of file descriptors (EMFILE, ENFILE, or ``OutOfFileDescriptorsError``)."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        if isinstance(current, OutOfFileDescriptorsError) or (
            isinstance(current, OSError) and current.errno in (errno.EMFILE, errno.ENFILE)
        ):
            return True
        seen.append(current)
        current = current.__cause__
    return False


class CorruptSnapshotError(StorageError):
    """A producer-state snapshot failed its checksum; it is discarded and rebuilt."""


class InvariantViolation(AssertionError):
    """A programmer error: the engine's own invariant broke. Never caught."""


def invariant(condition: bool, message: str) -> None:
    """Crash loudly when ``condition`` is false; unlike ``assert`` it survives ``python -O``."""
    if not condition:
        raise InvariantViolation(message)
