"""What the Kafka API handlers work with: one ``BrokerContext`` per broker process.

How this works. The node builds the context once its parts exist (the replica manager, the
fetch purgatory, the producer-id manager, the controller client) and hands it to the
dispatcher; handlers read the broker's latest metadata image through ``image()`` and never
keep one across an ``await`` (it may be replaced meanwhile). The context makes the broker's
fetch session cache itself, from the settings, with random session ids.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.fetch_session import FetchSessionCache, SessionLimits
from broker.producer_ids import ProducerIdManager
from broker.purgatory import FetchPurgatory
from broker.replica_manager import ReplicaManager
from controller.client import ControllerClient
from controller.image import MetadataImage
from storage.config import LogConfig

__all__ = ["BrokerContext", "BrokerSettings", "ReplicationSettings"]


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """The settings handlers answer with (from ``runnel.config.BrokerConfig``)."""

    broker_id: int
    cluster_id: str
    listener_name: str  # Metadata answers with every broker's address on this listener
    # Where followers dial their leaders (Kafka's inter.broker.listener.name); None: the
    # client listener (``listener_name`` of the client listener's context).
    inter_broker_listener_name: str | None = None
    auto_create_topics_enable: bool = False
    fetch_max_bytes: int = 57_671_680
    fetch_max_wait_ms: int = 30_000
    controller_request_timeout_ms: int = 30_000
    fetch_sessions: SessionLimits = field(default_factory=SessionLimits)  # KIP-227
    log_defaults: LogConfig = field(default_factory=LogConfig)  # the node's [log] section
    log_maintenance_interval_ms: int = 30_000  # flushes, retention, compaction, checkpoints
    replication: ReplicationSettings = field(default_factory=lambda: ReplicationSettings())


@dataclass(frozen=True, slots=True)
class ReplicationSettings:
    """Followers and the ISR (Kafka's names, with units last)."""

    replica_lag_time_max_ms: int = 30_000  # an ISR follower not caught up this long leaves
    replica_fetch_wait_max_ms: int = 500  # a follower's long poll on its leader
    replica_fetch_max_bytes: int = 1_048_576  # per partition per follower fetch
    replica_fetch_response_max_bytes: int = 10_485_760  # per follower fetch
    replica_fetch_backoff_ms: int = 1000  # a partition's rest after a fetch error (the longest)
    replica_high_watermark_checkpoint_interval_ms: int = 5000


@dataclass(slots=True)
class BrokerContext:
    settings: BrokerSettings
    replicas: ReplicaManager
    purgatory: FetchPurgatory
    producer_ids: ProducerIdManager
    controller: ControllerClient
    image: Callable[[], MetadataImage]  # the latest image applied on this broker
    fetch_sessions: FetchSessionCache = field(init=False)

    def __post_init__(self) -> None:
        ids = random.SystemRandom()
        self.fetch_sessions = FetchSessionCache(
            self.settings.fetch_sessions, lambda: ids.randint(1, 2**31 - 1)
        )
