"""One runnel node process: ``runnel node --config FILE``.

How this works. The config's ``process_roles`` decide what runs; every node replicates the
metadata log through one ``RaftNode`` with a ``MetadataStateMachine``:

- a **controller** is a voter: its Raft transport listens on the controller listener, which
  also serves the controller's gRPC API (``ControllerService``), and it runs a
  ``QuorumController`` (a standby until its Raft node leads);
- a **broker** is a Raft observer (unless it is also a controller) whose transport listens
  on its REPLICATION listener; it registers with the active controller and heartbeats
  (``BrokerLifecycle``), starting fenced until it has caught up. Once unfenced it opens its
  partition logs and serves Kafka clients on its client listener (``broker.runtime``). Its
  Raft transport's listener also serves the batch metadata of its replicas
  (``broker.replica_read``; "not serving yet" until the logs are open).

SIGTERM (or SIGINT) is a controlled shutdown: a broker asks the controller to move its
leaderships away first; a controller that leads resigns so the others elect at once. A second
signal skips what is left of the controlled shutdown: the node goes on to close its logs and
Raft at once. SIGKILL is safe: every acknowledged metadata record is fsynced on a majority.

A start that fails, whatever the reason (a port in use, a data directory that is a file, no
controller to register with, not unfenced in time), logs one "cannot start: <reason>" line,
stops whatever had started (so the logs it loaded close cleanly) and exits with status 1.
A node that cannot even be built (a part that fails after the Raft node opened the metadata
log) closes that log before the error goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import resource
import signal
import sys
from collections.abc import Awaitable
from pathlib import Path

import uvloop

from broker.context import BrokerSettings, ReplicationSettings
from broker.fetch_session import SessionLimits
from broker.lifecycle import (
    REGISTER_TIMEOUT_S,
    BrokerLifecycle,
    BrokerState,
    RegistrationRefused,
)
from broker.replica_read import ReplicaManagerSource, ReplicaReadService
from broker.runtime import CannotStart, KafkaBroker
from controller.client import ControllerClient, ControllerUnavailable
from controller.quorum import QuorumController
from controller.service import ControllerService
from controller.state_machine import MetadataStateMachine
from proto import metadata_pb2 as mpb
from raft.driver import RaftNode, RaftNodeConfig
from raft.log_store import METADATA_LOG_DIR
from raft.transport import GrpcTransport, TransportError
from runnel.commands import EXIT_OK, EXIT_PROBLEM, CommandError, Subparsers, set_handler
from runnel.config import REPLICATION_LISTENER, ConfigError, NodeConfig, Role, load_config
from runnel.metrics import serve_metrics
from storage.dir_lock import DirLock, make_data_dir
from storage.errors import StorageError
from storage.log_manager import LogManager

__all__ = ["RunnelNode", "register"]

_log = logging.getLogger(__name__)
SHUTDOWN_TIMEOUT_S = 30.0
UNFENCE_TIMEOUT_S = 120.0  # beyond a previous incarnation's session timeout, with room
NEVER = 2**62


class RunnelNode:
    """The parts of one node, started and stopped in order."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.voters = config.quorum_voters()
        self.is_controller = Role.CONTROLLER in config.process_roles
        self.is_broker = Role.BROKER in config.process_roles
        self.machine = MetadataStateMachine()
        # The metadata log's directory is this process's before the log is opened (a second
        # node on it would recover, and so cut, the first one's log); the broker's log
        # manager locks the other data directories when it starts.
        self._metadata_dir_lock = _lock_metadata_dir(config.metadata_log_dir)
        try:
            self.transport = self._transport()
            self.raft = self._raft()  # opens the log
        except BaseException:
            self._metadata_dir_lock.release()
            raise
        self.controller: QuorumController | None = None
        self.controller_service: ControllerService | None = None
        self.lifecycle: BrokerLifecycle | None = None
        self.client: ControllerClient | None = None
        self.kafka: KafkaBroker | None = None
        self.replica_read: ReplicaReadService | None = None
        try:
            self._build_roles()
        except BaseException:
            # Nobody holds this node to stop it: its metadata log (the one part open so far;
            # the others open their sockets and logs in ``start``) is closed here.
            try:
                self.raft.close_unstarted()
            except Exception:  # the error that stopped the construction is the one to see
                _log.exception("node %d: closing the metadata log failed", config.node_id)
            self._metadata_dir_lock.release()
            raise

    def _raft(self) -> RaftNode:
        config = self.config
        raft_config = RaftNodeConfig(
            config.node_id,
            frozenset(self.voters),
            config.metadata_log_dir,
            config.raft,
            snapshot_interval_records=NEVER,
            snapshot_interval_bytes=config.controller.metadata_snapshot_bytes,
            snapshot_interval_ms=config.controller.metadata_snapshot_interval_ms,
            max_inbox_bytes=config.raft_transport.max_inbox_bytes,
        )
        return RaftNode(raft_config, self.transport, self.machine)

    def _build_roles(self) -> None:
        """The controller's and the broker's parts, on top of the Raft node."""
        config = self.config
        if self.is_controller:
            self.controller = QuorumController(self.raft, self.machine, config.controller)
            # Half the server's RPC slots at most wait for commits: Raft needs the others.
            self.controller_service = ControllerService(
                self.controller,
                self.voters,
                config.log,
                max_in_flight_requests=max(1, config.raft_transport.max_concurrent_rpcs // 2),
            )
            self.transport.add_service(self.controller_service.register)
        if self.is_broker:
            self.client = ControllerClient(self.voters)
            self.lifecycle = BrokerLifecycle(
                config.node_id,
                self._advertised_listeners(),
                config.rack,
                self.client,
                self.raft,
                config.broker.heartbeat_interval_ms,
            )
            self.kafka = self._kafka_broker(self.client, self.lifecycle)
            self.replica_read = ReplicaReadService(
                ReplicaManagerSource(self.kafka.replicas),
                write_timeout_ms=config.broker.replica_read_write_timeout_ms,
                max_calls=config.broker.replica_read_max_calls,
            )
            self.transport.add_service(self.replica_read.register)

    def _transport(self) -> GrpcTransport:
        config = self.config
        name = config.controller_listener_name if self.is_controller else REPLICATION_LISTENER
        listener = config.listener(name)
        if listener is None:
            raise CommandError(f"node {config.node_id} needs a {name} listener (metadata log)")
        advertised = config.advertised(name)
        peers = {i: a for i, a in self.voters.items() if i != config.node_id}
        return GrpcTransport(
            config.node_id,
            listener.address,
            peers,
            config.raft_transport,
            advertised_address=advertised.address if advertised is not None else None,
        )

    def _kafka_broker(self, client: ControllerClient, lifecycle: BrokerLifecycle) -> KafkaBroker:
        config = self.config
        listener = config.listener(config.client_listener_name)
        if listener is None:  # the config's own checks make this unreachable
            raise CommandError(f"node {config.node_id} has no {config.client_listener_name}")
        b = config.broker
        inter = config.inter_broker_listener_name
        internal = None if inter in (None, listener.name) else config.listener(inter)
        settings = BrokerSettings(
            broker_id=config.node_id,
            cluster_id=config.effective_cluster_id(),
            listener_name=listener.name,
            inter_broker_listener_name=inter,
            auto_create_topics_enable=b.auto_create_topics_enable,
            fetch_max_bytes=b.fetch_max_bytes,
            fetch_max_wait_ms=b.fetch_max_wait_ms,
            controller_request_timeout_ms=b.controller_request_timeout_ms,
            fetch_sessions=SessionLimits(
                max_sessions=b.max_incremental_fetch_session_cache_slots,
                max_partitions=b.fetch_session_cache_max_partitions,
                expiry_ms=b.fetch_session_expiry_ms,
            ),
            log_defaults=config.log,
            log_maintenance_interval_ms=b.log_maintenance_interval_ms,
            replication=ReplicationSettings(
                replica_lag_time_max_ms=b.replica_lag_time_max_ms,
                replica_fetch_wait_max_ms=b.replica_fetch_wait_max_ms,
                replica_fetch_max_bytes=b.replica_fetch_max_bytes,
                replica_fetch_response_max_bytes=b.replica_fetch_response_max_bytes,
                replica_fetch_backoff_ms=b.replica_fetch_backoff_ms,
                replica_high_watermark_checkpoint_interval_ms=(
                    b.replica_high_watermark_checkpoint_interval_ms
                ),
            ),
        )
        logs = LogManager(
            config.data_dirs,
            config.log,
            foreign_dirs=frozenset({METADATA_LOG_DIR}),
            locked=frozenset({config.metadata_log_dir}),  # this node's already
        )
        return KafkaBroker(
            settings,
            config.server,
            listener.host,
            listener.port,
            logs,
            self.machine,
            client,
            lambda: lifecycle.broker_epoch,
            b.fetch_max_waiting,
            other_listeners=[]
            if internal is None
            else [(internal.name, internal.host, internal.port)],
        )

    def _advertised_listeners(self) -> list[mpb.Listener]:
        out = []
        for listener in self.config.listeners:
            advertised = self.config.advertised(listener.name) or listener
            out.append(mpb.Listener(name=listener.name, host=advertised.host, port=advertised.port))
        return out

    async def start(self) -> None:
        if self.config.metrics_port is not None:
            host = self.transport.address.rpartition(":")[0]
            try:
                serve_metrics(self, host, self.config.metrics_port)
            except OSError as e:
                where = f"{host}:{self.config.metrics_port}"
                raise CannotStart(f"metrics endpoint {where}: {e}") from e
        await self.transport.start()
        await self.raft.start()
        if self.lifecycle is not None:
            try:
                await self.lifecycle.start()
            except TimeoutError:
                raise CannotStart(f"not registered within {REGISTER_TIMEOUT_S:.0f} s") from None
        if self.kafka is not None and self.lifecycle is not None:
            try:
                await self.lifecycle.wait_for(BrokerState.RUNNING, UNFENCE_TIMEOUT_S)
                await self._until_unfenced_in_own_image()
            except TimeoutError:
                raise CannotStart(f"not unfenced within {UNFENCE_TIMEOUT_S:.0f} s") from None
            try:
                await self.kafka.start(self.machine.image)
            except OSError as e:  # a listener's port in use, most likely
                servers = self.kafka.servers.items()
                listening = ", ".join(f"{name} {x.host}:{x.port}" for name, x in servers)
                raise CannotStart(f"starting the Kafka broker ({listening}): {e}") from e
        roles = ",".join(sorted(r.value for r in self.config.process_roles))
        _log.info("node %d started (%s) on %s", self.config.node_id, roles, self.transport.address)

    async def _until_unfenced_in_own_image(self) -> None:
        """The controller says "unfenced" before this observer has replicated the record;
        clients must not be served an image in which this broker is still fenced (Metadata
        would list no broker at all)."""
        node_id = self.config.node_id

        def unfenced() -> bool:
            registration = self.machine.image.brokers.get(node_id)
            return registration is not None and not registration.fenced

        async with asyncio.timeout(UNFENCE_TIMEOUT_S):
            while not unfenced():
                await asyncio.sleep(0.02)

    def skip_controlled_shutdown(self) -> None:
        """The rest of a controlled shutdown (now or to come) is skipped: ``stop`` goes on to
        close the logs and Raft at once."""
        if self.lifecycle is not None:
            self.lifecycle.skip_controlled_shutdown()

    async def stop(self) -> None:
        """Stop every part, started or not (a failed start stops what it had started); a
        part that fails to stop is logged and the next one still stops."""
        node_id = self.config.node_id
        if self.lifecycle is not None:
            await _stopping(
                node_id, "the controlled shutdown", self.lifecycle.shutdown(SHUTDOWN_TIMEOUT_S)
            )
        if self.kafka is not None:
            await _stopping(node_id, "stopping the broker", self.kafka.stop())
        if self.controller is not None:
            await _stopping(node_id, "closing the controller", self.controller.close())
        try:
            await self.raft.close()
        except StorageError as e:  # a failed data directory: recovered at the next start
            _log.error("node %d: closing the metadata log failed: %s", node_id, e)
        except Exception:
            _log.exception("node %d: closing the metadata log failed", node_id)
        await _stopping(node_id, "closing the Raft transport", self.transport.close())
        if self.client is not None:
            await _stopping(node_id, "closing the controller client", self.client.close())
        self._metadata_dir_lock.release()
        _log.info("node %d stopped", node_id)


def _lock_metadata_dir(directory: Path) -> DirLock:
    """The metadata log's data directory, locked (DataDirInUseError if another has it)."""
    make_data_dir(directory)
    lock = DirLock(directory)
    lock.acquire()
    return lock


async def _stopping(node_id: int, what: str, step: Awaitable[object]) -> None:
    try:
        await step
    except Exception:  # a bug: said, and the node's other parts still stop
        _log.exception("node %d: %s failed", node_id, what)


# Start-up failures that are operating errors: their message says it all (traceback at DEBUG).
_EXPECTED_START_ERRORS = (
    CannotStart,
    CommandError,
    ControllerUnavailable,
    OSError,  # a port in use, a data directory that is a file, ... (TimeoutError too)
    RegistrationRefused,
    StorageError,
    TransportError,
)


def _log_cannot_start(node_id: int, error: BaseException) -> None:
    reason = str(error) or type(error).__name__
    if isinstance(error, _EXPECTED_START_ERRORS):
        _log.error("node %d cannot start: %s", node_id, reason)
        _log.debug("node %d: the start-up failure", node_id, exc_info=error)
    else:
        _log.error("node %d cannot start: %r", node_id, error, exc_info=error)


async def serve(config: NodeConfig) -> int:
    """Run a node until SIGTERM / SIGINT (exit status 0) or a fatal error such as a failed
    data directory or a failed start (status 1); either way it shuts down under control, and
    a second signal skips the rest of the controlled shutdown."""
    try:
        node = RunnelNode(config)
    except Exception as e:  # nothing runs yet, and what was open is closed: nothing to stop
        _log_cannot_start(config.node_id, e)
        return EXIT_PROBLEM
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: signal.Signals) -> None:
        if not stop.is_set():
            _log.info("node %d: %s: shutting down under control", config.node_id, signum.name)
            stop.set()
            return
        _log.warning(
            "node %d: %s while stopping: skipping the rest of the controlled shutdown",
            config.node_id,
            signum.name,
        )
        node.skip_controlled_shutdown()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    fatal: list[str] = []

    def on_fatal(reason: str) -> None:
        fatal.append(reason)
        stop.set()

    node.raft.on_fatal = on_fatal
    if node.kafka is not None:
        node.kafka.on_fatal = on_fatal
    if node.lifecycle is not None:
        node.lifecycle.on_fatal = on_fatal
    started, failure = await _start(node, stop)
    if started:
        print(f"ready node {config.node_id}", flush=True)
        await stop.wait()
    await node.stop()
    if fatal:
        what = "stopped after a fatal error" if started else "cannot start"
        _log.critical("node %d %s: %s", config.node_id, what, fatal[0])
        return EXIT_PROBLEM
    if failure is not None:
        _log_cannot_start(config.node_id, failure)
        return EXIT_PROBLEM
    return EXIT_OK


async def _start(node: RunnelNode, stop: asyncio.Event) -> tuple[bool, BaseException | None]:
    """Start ``node``: (started, why not). A fatal error or a signal meanwhile (``stop``)
    ends the start at once (waiting to be unfenced, say, which a broker whose metadata log
    failed would do until its timeout): not started, and its failure, if any, is the fatal
    error's consequence."""
    starting = asyncio.ensure_future(node.start())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not starting.done():
            starting.cancel()
        await asyncio.wait({starting, stopping})
    if starting.cancelled():
        return False, None
    failure = starting.exception()
    return failure is None, failure


def configure_logging(node_id: int) -> None:
    """One line per event, ``key=value`` fields first: easy to grep and to parse."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s level=%(levelname)s node={node_id} logger=%(name)s %(message)s",
    )


def _run_node(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, os.environ)
    except ConfigError as e:
        raise CommandError(str(e)) from None
    if args.print_config:
        print(config.describe())
        return EXIT_OK
    configure_logging(config.node_id)
    raise_open_file_limit()
    return uvloop.run(serve(config))


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit, as the JVM does for
    Kafka: a broker keeps a descriptor per segment file. Returns the limit and logs it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    _log.info("open file limit %d (the soft limit raised to the hard one)", soft)
    return soft


def register(groups: Subparsers) -> None:
    """Add ``runnel node`` to the top-level parser."""
    node = groups.add_parser(
        "node",
        help="run one node (controller, broker or both)",
        description="Run one runnel node. SIGTERM shuts it down under control.",
    )
    node.add_argument("--config", type=Path, default=None, help="TOML config file")
    node.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective config (file + RUNNEL_* variables) and exit",
    )
    set_handler(node, _run_node)
