"""A broker's data plane in one object: partition logs, the Kafka listener and what joins them.

How this works. ``KafkaBroker`` owns the ``ReplicaManager`` (and through it the partition
logs), the fetch purgatory, the producer-id manager, the dispatcher and the listener. The
node starts it once the broker has caught up with the metadata log and been unfenced:
``start(image)`` loads the logs, applies that image (which partitions live here, who leads
them, at which epochs), subscribes to every later image and only then opens the listener, so
no client is served from a stale view. ``stop`` closes the listener first (parked fetches
are answered), then the logs, cleanly (a clean-shutdown marker skips recovery next time).
Log retention and compaction run in the background every ``log_maintenance_interval_ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from broker.context import BrokerContext, BrokerSettings
from broker.dispatcher import KafkaDispatcher
from broker.producer_ids import ProducerIdManager
from broker.purgatory import FetchPurgatory
from broker.replica_manager import ReplicaManager, topic_settings
from broker.server import Server, ServerConfig
from controller.client import ControllerClient
from controller.image import MetadataImage
from controller.state_machine import MetadataStateMachine
from storage.config import LogConfig
from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition

__all__ = ["KafkaBroker"]

_log = logging.getLogger(__name__)
LOG_MAINTENANCE_INTERVAL_MS = 30_000


class KafkaBroker:
    def __init__(
        self,
        settings: BrokerSettings,
        server_config: ServerConfig,
        host: str,
        port: int,
        logs: LogManager,
        machine: MetadataStateMachine,
        controller: ControllerClient,
        broker_epoch: Callable[[], int],
        fetch_max_waiting: int,
    ) -> None:
        self.settings = settings
        self.machine = machine
        self.logs = logs
        self.purgatory = FetchPurgatory(max_waiters=fetch_max_waiting)
        self.replicas = ReplicaManager(
            settings.broker_id, logs, purgatory=self.purgatory, log_defaults=settings.log_defaults
        )
        self.producer_ids = ProducerIdManager(settings.broker_id, controller, broker_epoch)
        self.context = BrokerContext(
            settings,
            self.replicas,
            self.purgatory,
            self.producer_ids,
            controller,
            lambda: self._image,
        )
        self.dispatcher = KafkaDispatcher(self.context)
        self.server = Server(
            self.dispatcher,
            host=host,
            port=port,
            config=server_config,
            listener=settings.listener_name,
        )
        self._image = MetadataImage.EMPTY
        self._apply_scheduled = False
        self._stop = asyncio.Event()
        self._maintenance: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return self.server.port

    async def start(self, image: MetadataImage) -> None:
        loop = asyncio.get_running_loop()
        # Logs load with their topic's configs (a compacted log must not load as a deleting
        # one: its offsets have gaps that a delete-policy load would call corrupt).
        settings = self.settings

        def config_for(tp: TopicPartition) -> LogConfig:
            found = topic_settings(image, tp.topic, settings.broker_id, settings.log_defaults)
            return found.log_config

        self.logs.config_for = config_for
        await loop.run_in_executor(None, self.logs.startup)
        self._apply(image)
        self.machine.on_publish(self._apply)
        self._maintenance = loop.create_task(
            self.logs.run_periodically(LOG_MAINTENANCE_INTERVAL_MS, self._stop),
            name="log-maintenance",
        )
        await self.server.start()
        _log.info("kafka listener %s on port %d", self.settings.listener_name, self.server.port)

    def _apply(self, image: MetadataImage) -> None:
        if image.offset < self._image.offset:
            return
        self._image = image
        if not self.replicas.apply(image) and not self._apply_scheduled:
            # Many new partitions here: the rest in later loop turns (serving meanwhile).
            self._apply_scheduled = True
            asyncio.get_running_loop().call_soon(self._apply_rest)

    def _apply_rest(self) -> None:
        self._apply_scheduled = False
        self._apply(self._image)

    async def stop(self) -> None:
        await self.server.close()
        self.purgatory.cancel_all()
        self._stop.set()
        if self._maintenance is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintenance
        await asyncio.get_running_loop().run_in_executor(None, self.logs.shutdown)
