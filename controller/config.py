"""What the active controller decides with: KRaft's defaults, units in the names.

The node's config file fills it (its ``[controller]`` section, see runnel/config.py); the
controller package owns the type so that it does not depend on the CLI above it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ControllerConfig", "at_least", "flags"]

MIB = 1024 * 1024


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

    def __post_init__(self) -> None:
        flags(self, "unclean_leader_election_enable", "auto_leader_rebalance_enable")
        at_least(
            self,
            1,
            "broker_session_timeout_ms",
            "metadata_snapshot_bytes",
            "metadata_snapshot_interval_ms",
            "metadata_max_idle_interval_ms",
            "default_replication_factor",
            "num_partitions",
            "leader_imbalance_check_interval_s",
        )
        at_least(self, 0, "leader_imbalance_per_broker_percentage")
        if self.leader_imbalance_per_broker_percentage > 100:
            raise ValueError("leader_imbalance_per_broker_percentage must be at most 100")


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
