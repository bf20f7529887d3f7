"""A broker's data plane in one object: partition logs, the Kafka listener and what joins them.

How this works. ``KafkaBroker`` owns the ``ReplicaManager`` (and through it the partition
logs), the fetch purgatory, the producer-id manager, the dispatcher and the listener. The
node starts it once the broker has caught up with the metadata log and been unfenced:
``start(image)`` subscribes to every later image, loads the logs, applies the latest image
(which partitions live here, who leads them, at which epochs: one published while the logs
loaded, which after a crash takes a while, is not missed) and only then opens the listener,
so no client is served from a stale view. ``stop`` first stops applying images (the metadata log
goes on until the node closes Raft: a partition moved now must not create or open a log, or
start a fetcher, after they are closed), then closes the listener (its connections close and
their requests in flight, parked fetches too, get no answer: clients retry elsewhere), then
the follower fetchers, then the logs, cleanly (a clean-shutdown marker skips recovery next
time). Log retention and compaction run in the background every
``log_maintenance_interval_ms``.

Listeners: the client listener, and any other Kafka listeners the node names (an
inter-broker one, Kafka's ``inter.broker.listener.name``), each a ``Server`` with its own
dispatcher; they share everything but the listener's name, which Metadata answers with
(every broker's address on the listener asked), and one budget of request memory
(``request_memory``, ``queued_max_request_bytes``: broker-wide, as in Kafka).

Replication: the replica manager tells the ``ReplicaFetcherManager`` which partitions follow
which leader (each leader's address on the inter-broker listener, by default the client
listener, is in the image), and leaders send their ISR proposals through the
``AlterPartitionSender``. Two periodic duties run: the ISR shrink check every half
``replica_lag_time_max_ms`` on the event loop, and the high-watermark checkpoint every
``replica_high_watermark_checkpoint_interval_ms`` in a worker thread (a few small files,
fsynced; after a crash a follower's log is never truncated to it, only where consumers may
read comes from it).

A data directory that fails (an I/O error takes it offline, see ``storage/log_manager.py``)
stops the broker, as Kafka's KRaft brokers halt on a log directory failure unless the
controller knows which directory holds each replica (KIP-858, which runnel does not have):
a broker that stayed up would keep leading partitions it can no longer serve, and the
controller would never move them. ``on_fatal`` tells the node, which shuts down under control
(the controller moves the leaderships to in-sync replicas at once) and exits with status 1.
A directory that is offline at start-up refuses the start (``DataDirOffline``), and so does
running out of file descriptors while loading the logs (``CannotStart``, naming the limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from broker.alter_partition import AlterPartitionSender
from broker.connection import MemoryPool
from broker.context import BrokerContext, BrokerSettings
from broker.dispatcher import KafkaDispatcher
from broker.producer_ids import ProducerIdManager
from broker.purgatory import FetchPurgatory
from broker.replica_fetcher import FetcherConfig, ReplicaFetcherManager
from broker.replica_manager import (
    UNSERVED_RETRY_INTERVAL_MS,
    ReplicaManager,
    monotonic_ms,
    topic_settings,
)
from broker.server import Server, ServerConfig
from controller.client import ControllerClient
from controller.image import MetadataImage
from controller.state_machine import MetadataStateMachine
from replication.partition import Partition
from storage.config import LogConfig
from storage.errors import OutOfFileDescriptorsError
from storage.log_manager import LogManager
from storage.records import compiled_framing
from storage.topic_partition import TopicPartition

__all__ = ["CannotStart", "DataDirOffline", "KafkaBroker"]

_log = logging.getLogger(__name__)


class CannotStart(Exception):
    """The broker cannot start (module doc); the message says why."""


class DataDirOffline(CannotStart):
    """A data directory is offline: the broker must not serve (module doc)."""


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
        other_listeners: Sequence[tuple[str, str, int]] = (),  # (name, host, port)
    ) -> None:
        self.settings = settings
        self.machine = machine
        self.logs = logs
        self.purgatory = FetchPurgatory(max_waiters=fetch_max_waiting)
        self.replica_purgatory = FetchPurgatory(max_waiters=fetch_max_waiting)
        replication = settings.replication
        self.replicas = ReplicaManager(
            settings.broker_id,
            logs,
            purgatory=self.purgatory,
            replica_purgatory=self.replica_purgatory,
            log_defaults=settings.log_defaults,
            replica_lag_time_max_ms=replication.replica_lag_time_max_ms,
        )
        self.alter_partition = AlterPartitionSender(
            settings.broker_id, controller, broker_epoch, lambda: self._image, monotonic_ms
        )
        self.fetchers = ReplicaFetcherManager(
            FetcherConfig(
                broker_id=settings.broker_id,
                fetch_wait_max_ms=replication.replica_fetch_wait_max_ms,
                fetch_max_bytes=replication.replica_fetch_max_bytes,
                fetch_response_max_bytes=replication.replica_fetch_response_max_bytes,
                fetch_backoff_ms=replication.replica_fetch_backoff_ms,
                request_timeout_ms=settings.controller_request_timeout_ms,
                largest_batch_bytes=server_config.socket_request_max_bytes,
            ),
            self._address_of,
            broker_epoch,
            self._persist_log_starts,
        )
        self.replicas.propose_isr = self.alter_partition.propose
        self.replicas.on_follow = self.fetchers.follow
        self.replicas.on_unfollow = self.fetchers.unfollow
        self.producer_ids = ProducerIdManager(settings.broker_id, controller, broker_epoch)
        self.context = BrokerContext(
            settings,
            self.replicas,
            self.purgatory,
            self.producer_ids,
            controller,
            lambda: self._image,
        )
        self.dispatchers: dict[str, KafkaDispatcher] = {}  # by listener name
        self.servers: dict[str, Server] = {}
        # One budget of request memory for every Kafka listener, as Kafka's SocketServer has.
        self.request_memory = MemoryPool(server_config.queued_max_request_bytes)
        for name, listener_host, listener_port in (
            (settings.listener_name, host, port),
            *other_listeners,
        ):
            context = self.context
            if name != settings.listener_name:
                context = dataclasses.replace(
                    context, settings=dataclasses.replace(settings, listener_name=name)
                )
                context.fetch_sessions = self.context.fetch_sessions  # one cache, as in Kafka
            self.dispatchers[name] = KafkaDispatcher(context)
            self.servers[name] = Server(
                self.dispatchers[name],
                host=listener_host,
                port=listener_port,
                config=server_config,
                listener=name,
                memory_pool=self.request_memory,
            )
        self.server = self.servers[settings.listener_name]  # the client listener
        self._image = MetadataImage.EMPTY
        self._apply_scheduled = False
        self._stopping = False  # set by stop(): no image is applied after it
        self._applying = False  # set by start() once the logs are loaded (module doc)
        self._unreachable: set[tuple[int, str]] = set()  # (leader, listener) said missing
        self._stop = asyncio.Event()
        self._maintenance: asyncio.Task[None] | None = None
        self._duties: list[asyncio.Task[None]] = []
        # Called once, on the event loop, when a data directory fails (module doc).
        self.on_fatal: Callable[[str], None] | None = None
        self._fatal: str | None = None
        # Only logs this process loaded are shut down (and marked clean): a start stopped
        # before that must leave the previous shutdown's state as it found it.
        self._logs_started = False

    @property
    def port(self) -> int:
        return self.server.port

    async def start(self, image: MetadataImage) -> None:
        loop = asyncio.get_running_loop()
        # Logs load with their topic's configs (a compacted log must not load as a deleting
        # one: its offsets have gaps that a delete-policy load would call corrupt).
        settings = self.settings

        # Images published while the logs load are kept (``_apply``) and the latest applied
        # once they are loaded: the image given may be stale by then.
        self._image = image
        self.machine.on_publish(self._apply)

        def config_for(tp: TopicPartition) -> LogConfig:  # a worker thread; images are frozen
            latest = self._image
            found = topic_settings(latest, tp.topic, settings.broker_id, settings.log_defaults)
            return found.log_config

        self.logs.config_for = config_for

        def dir_offline(data_dir: Path, error: str) -> None:  # any thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: stopping anyway
                loop.call_soon_threadsafe(self._dir_failed, data_dir, error)

        self.logs.on_dir_offline = dir_offline
        try:
            await loop.run_in_executor(None, self.logs.startup)
        except OutOfFileDescriptorsError as e:
            raise CannotStart(str(e)) from e
        self._logs_started = True
        if self.logs.offline_dirs:
            failed = "; ".join(f"{d}: {e}" for d, e in self.logs.offline_dirs.items())
            raise DataDirOffline(f"data directories offline at start-up: {failed}")
        self._applying = True
        self._apply(self._image)
        self._maintenance = loop.create_task(
            self.logs.run_periodically(settings.log_maintenance_interval_ms, self._stop),
            name="log-maintenance",
        )
        replication = settings.replication
        self._duties = [
            loop.create_task(
                self._every(replication.replica_lag_time_max_ms // 2, self.replicas.shrink_isrs),
                name="isr-shrink",
            ),
            loop.create_task(
                self._checkpoint_high_watermarks(
                    replication.replica_high_watermark_checkpoint_interval_ms
                ),
                name="hw-checkpoint",
            ),
            loop.create_task(
                self._every(UNSERVED_RETRY_INTERVAL_MS, self._retry_unserved),
                name="unserved-retry",
            ),
        ]
        for name, server in self.servers.items():
            await server.start()
            _log.info("kafka listener %s on port %d", name, server.port)
        if not compiled_framing():
            _log.warning(
                "storage._framing is not built: produce checks record framing in Python "
                "(several times slower; install a C compiler and reinstall)"
            )

    def _dir_failed(self, data_dir: Path, error: str) -> None:
        if self._fatal is not None:
            return
        self._fatal = f"data directory {data_dir} failed: {error}"
        _log.critical(
            "%s; stopping the broker so that the controller moves its leaderships to in-sync "
            "replicas (replace or repair the directory, then start the broker again)",
            self._fatal,
        )
        if self.on_fatal is not None:
            self.on_fatal(self._fatal)

    def _apply(self, image: MetadataImage) -> None:
        if image.offset < self._image.offset or self._stopping:
            return
        self._image = image
        if not self._applying:
            return  # the logs are loading: start() applies the latest image after
        if not self.replicas.apply(image) and not self._apply_scheduled:
            # Many new partitions here: the rest in later loop turns (serving meanwhile).
            self._apply_scheduled = True
            asyncio.get_running_loop().call_soon(self._apply_rest)

    def _apply_rest(self) -> None:
        self._apply_scheduled = False
        self._apply(self._image)

    def _retry_unserved(self) -> None:
        """Partitions whose logs could not be had, tried again; more in later loop turns
        when many are served at once (an unfinished apply comes first)."""
        if self._stopping:
            return
        if not self._apply_scheduled and not self.replicas.retry_unserved():
            asyncio.get_running_loop().call_soon(self._retry_unserved)

    async def _persist_log_starts(self, partitions: list[Partition]) -> None:
        """A follower's fetcher, before its next request says these partitions' new log
        starts: their directories' checkpoints, in a worker thread."""
        await asyncio.to_thread(self.logs.checkpoint_dirs_of, [p.log for p in partitions])

    def _address_of(self, broker_id: int) -> tuple[str, int] | None:
        """A leader's inter-broker listener (by default the client listener), from the
        image."""
        registration = self._image.brokers.get(broker_id)
        if registration is None:
            return None
        name = self.settings.inter_broker_listener_name or self.settings.listener_name
        for endpoint in registration.listeners:
            if endpoint.name == name:
                return endpoint.host, endpoint.port
        if (broker_id, name) not in self._unreachable:  # a misconfiguration: said once
            self._unreachable.add((broker_id, name))
            known = ", ".join(e.name for e in registration.listeners)
            _log.error(
                "broker %d registered no listener %s (%s), so its partitions cannot be "
                "followed from here; give every broker the same inter_broker_listener_name",
                broker_id,
                name,
                known,
            )
        return None

    async def _every(self, interval_ms: int, duty: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(max(interval_ms, 1) / 1000)
            try:
                duty()
            except Exception:  # a bug: logged, and the duty goes on
                _log.exception("periodic duty %s failed", duty)

    async def _checkpoint_high_watermarks(self, interval_ms: int) -> None:
        """The checkpoint files in a worker thread (their fsyncs block); ``LogManager``
        serialises them with the maintenance thread's."""
        while True:
            await asyncio.sleep(interval_ms / 1000)
            for data_dir in self.logs.data_dirs:
                if data_dir not in self.logs.offline_dirs:
                    await asyncio.to_thread(self.logs.checkpoint, data_dir)

    async def stop(self) -> None:
        self._stopping = True  # images are no longer applied (module doc)
        for server in self.servers.values():
            await server.close()
        self.purgatory.cancel_all()
        self.replica_purgatory.cancel_all()
        for duty in self._duties:
            duty.cancel()
        await asyncio.gather(*self._duties, return_exceptions=True)
        await self.fetchers.close()
        await self.alter_partition.close()
        self._stop.set()
        if self._maintenance is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintenance
        if self._logs_started:
            await asyncio.get_running_loop().run_in_executor(None, self.logs.shutdown)
