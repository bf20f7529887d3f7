"""Per-log configuration: Kafka's topic-level settings, units in names, validated at creation."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from storage.batch import TimestampType

CleanupPolicy = Literal["delete", "compact", "compact,delete"]
_DAY_MS = 24 * 60 * 60 * 1000
_HOUR_MS = 60 * 60 * 1000


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Settings for one partition log. ``None`` means "no limit" where Kafka uses -1/MAX."""

    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * _DAY_MS
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10 * 1024 * 1024
    index_interval_bytes: int = 4096
    max_message_bytes: int = 1024 * 1024 + 12
    flush_messages: int | None = None  # fsync after this many messages; None: page cache
    flush_ms: int | None = None  # fsync unflushed data this long after the last flush
    fsync_each_append: bool = False  # inline fdatasync in every append, under the log lock
    retention_ms: int | None = 7 * _DAY_MS
    retention_bytes: int | None = None
    cleanup_policy: CleanupPolicy = "delete"
    delete_retention_ms: int = _DAY_MS  # how long compaction keeps tombstones
    min_compaction_lag_ms: int = 0
    min_cleanable_dirty_ratio: float = 0.5
    message_timestamp_type: TimestampType = TimestampType.CREATE_TIME
    # CreateTime batches stamped further from the leader's clock are refused (KIP-937;
    # Kafka 4's defaults): a clock far ahead would keep its segments from time retention.
    message_timestamp_before_max_ms: int | None = None
    message_timestamp_after_max_ms: int | None = _HOUR_MS
    producer_id_expiration_ms: int = _DAY_MS
    max_decompressed_batch_bytes: int = 64 * 1024 * 1024  # limit when records are decoded

    def __post_init__(self) -> None:
        _at_least("segment_bytes", self.segment_bytes, 128)
        _at_least("segment_ms", self.segment_ms, 1)
        _at_least("segment_jitter_ms", self.segment_jitter_ms, 0)
        _at_least("segment_index_bytes", self.segment_index_bytes, 12 * 2)
        _at_least("index_interval_bytes", self.index_interval_bytes, 0)
        _at_least("max_message_bytes", self.max_message_bytes, 61)
        _at_least("delete_retention_ms", self.delete_retention_ms, 0)
        _at_least("min_compaction_lag_ms", self.min_compaction_lag_ms, 0)
        _at_least("producer_id_expiration_ms", self.producer_id_expiration_ms, 1)
        _at_least("max_decompressed_batch_bytes", self.max_decompressed_batch_bytes, 1024)
        for name in (
            "flush_messages",
            "flush_ms",
            "retention_ms",
            "retention_bytes",
            "message_timestamp_before_max_ms",
            "message_timestamp_after_max_ms",
        ):
            value = getattr(self, name)
            if value is not None:
                _at_least(name, value, 1 if name.startswith("flush") else 0)
        if self.cleanup_policy not in ("delete", "compact", "compact,delete"):
            raise ValueError(
                f"cleanup_policy must be delete, compact or compact,delete: "
                f"got {self.cleanup_policy!r}"
            )
        if not 0.0 <= self.min_cleanable_dirty_ratio <= 1.0:
            raise ValueError("min_cleanable_dirty_ratio must lie in [0, 1]")
        if self.segment_jitter_ms >= self.segment_ms:
            raise ValueError("segment_jitter_ms must be below segment_ms")

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> LogConfig:
        """Build from ``{name: value}``, accepting Kafka's dotted names (``segment.bytes``)."""
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            name = key.replace(".", "_")
            if name not in known:
                raise ValueError(f"unknown log config {key!r}")
            kwargs[name] = value
        return cls(**kwargs)


def _at_least(name: str, value: int | float, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
