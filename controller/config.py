"""What the active controller decides with: KRaft's defaults, units in the names.

The node's config file fills it (its ``[controller]`` section, see runnel/config.py); the
controller package owns the type so that it does not depend on the CLI above it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "METADATA_SNAPSHOT_MIN_BYTES",
    "MAX_PARTITIONS_PER_TOPIC",
    "ControllerConfig",
    "at_least",
    "flags",
]

MIB = 1024 * 1024
MAX_PARTITIONS_PER_TOPIC = 10_000  # CreateTopics and CreatePartitions (controller/topics.py)
# The smallest metadata_snapshot_bytes. A snapshot writes the whole image, whatever the bytes
# since the last one; it is due once the records applied since then reach the setting
# (raft/driver.py, ``_snapshot_due``), checked after every commit. A few bytes would snapshot
# after nearly every commit: a partition change is about 30 bytes, and the NoOp record an idle
# active controller writes every metadata_max_idle_interval_ms is 2, so at 1 an idle cluster
# writes its whole image twice a second. At 1 KiB an idle cluster snapshots at most every 512
# NoOps (about 4 minutes at the default 500 ms), and a busy one every 30-odd partition changes.
METADATA_SNAPSHOT_MIN_BYTES = 1024


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """What the active controller decides with; KRaft's defaults, units in the names."""

    broker_session_timeout_ms: int = 9000  # a broker without a heartbeat this long is fenced
    metadata_snapshot_bytes: int = 20 * MIB  # snapshot the image after this much new log...
    metadata_snapshot_interval_ms: int = 60 * 60 * 1000  # ...or this long after the last one
    metadata_max_idle_interval_ms: int = 500  # a NoOp record when the log was idle this long
    unclean_leader_election_enable: bool = False  # elect an out-of-sync replica: loses data
    default_replication_factor: int = 1  # for a topic created without one
    num_partitions: int = 1  # for a topic created without a count
    auto_leader_rebalance_enable: bool = True  # move leadership back to preferred replicas
    leader_imbalance_check_interval_s: int = 300
    leader_imbalance_per_broker_percentage: int = 10  # rebalance a broker above this
    # Partitions in the whole cluster (every topic's, replicas not counted): a CreateTopics or
    # CreatePartitions that would go above it is refused, POLICY_VIOLATION. Above the 200,000
    # the largest documented metadata benchmark creates (docs/performance.md).
    max_cluster_partitions: int = 250_000

    def __post_init__(self) -> None:
        flags(self, "unclean_leader_election_enable", "auto_leader_rebalance_enable")
        at_least(
            self,
            1,
            "broker_session_timeout_ms",
            "metadata_snapshot_interval_ms",
            "metadata_max_idle_interval_ms",
            "default_replication_factor",
            "num_partitions",
            "leader_imbalance_check_interval_s",
            "max_cluster_partitions",
        )
        at_least(self, 0, "leader_imbalance_per_broker_percentage")
        if self.leader_imbalance_per_broker_percentage > 100:
            raise ValueError("leader_imbalance_per_broker_percentage must be at most 100")
        self._check_relations()

    def _check_relations(self) -> None:
        """Settings that are each legal but would make the controller refuse what it is
        asked or snapshot without end."""
        if self.metadata_snapshot_bytes < METADATA_SNAPSHOT_MIN_BYTES:
            raise ValueError(
                f"metadata_snapshot_bytes must be at least {METADATA_SNAPSHOT_MIN_BYTES}, got "
                f"{self.metadata_snapshot_bytes}: a snapshot writes the whole metadata image, "
                "and below that one would follow nearly every commit"
            )
        if self.num_partitions > MAX_PARTITIONS_PER_TOPIC:
            raise ValueError(
                f"num_partitions ({self.num_partitions}) must be at most "
                f"{MAX_PARTITIONS_PER_TOPIC}, the most partitions a topic may have: every "
                "topic created without a count would be refused (INVALID_PARTITIONS)"
            )
        if self.num_partitions > self.max_cluster_partitions:
            raise ValueError(
                f"num_partitions ({self.num_partitions}) must be at most "
                f"max_cluster_partitions ({self.max_cluster_partitions}): every topic created "
                "without a count would be refused (POLICY_VIOLATION)"
            )


def at_least(config: object, minimum: int, *names: str) -> None:
    """Raise ValueError naming the first of ``names`` that is not an int >= ``minimum``."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        if value < minimum:
            raise ValueError(f"{name} must be at least {minimum}, got {value}")


def flags(config: object, *names: str) -> None:
    """Raise ValueError naming the first of ``names`` that is not a bool."""
    for name in names:
        if not isinstance(getattr(config, name), bool):
            raise ValueError(f"{name} must be true or false, got {getattr(config, name)!r}")
