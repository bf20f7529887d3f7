"""A node's configuration: one typed, frozen model, read from TOML and ``RUNNEL_*`` variables.

How this works. ``load_config(path, env)`` reads the TOML file (if any), lays the ``RUNNEL_*``
variables of ``env`` over it, turns each value into its field's type and builds the model:
``NodeConfig`` holds the top-level keys and one object per section. The sections reuse the
dataclasses of the layers they configure, so their own validation runs:

    [raft]            raft.core.RaftConfig            timeouts and limits of the metadata quorum
    [raft_transport]  raft.transport.TransportConfig  the gRPC transport between controllers
    [log]             storage.config.LogConfig        defaults for every topic's partition logs
    [controller]      ControllerConfig                what the active controller decides with
    [broker]          BrokerConfig                    a broker's lifecycle and Kafka answers
    [server]          broker.server.ServerConfig      the Kafka client listener's limits

``NodeConfig`` then checks what ties settings together (listeners, voters, on a combined node
the heartbeat against its controller's session timeout, on a broker the request size against
the message size, the transport's message size against Raft's batches and its learned peers'
idle expiry against Raft's fetch timeout; ``ControllerConfig`` its own: the default
partition count against the topic and cluster limits, the smallest snapshot interval). Every
problem found is collected, naming its key and where the value came from, and raised as one
``ConfigError``.
The generic machinery (sources, coercion, rendering) is ``runnel/config_parse.py``; a complete
example with every key is ``config/example.toml``.

Environment variables: ``RUNNEL_<KEY>`` sets a top-level key (``RUNNEL_NODE_ID=3``) and
``RUNNEL_<SECTION>__<KEY>``, with two underscores, a section's key
(``RUNNEL_RAFT__ELECTION_TIMEOUT_MS=1500``). Their values are text: integers, ``true`` or
``false``, lists separated by commas (``RUNNEL_DATA_DIRS=/d1,/d2``), ``none`` or nothing for
"not set" where a key may be unset, and -1 for "no limit" where Kafka uses it (also in the
file). A variable beats the file. Any other ``RUNNEL_*`` variable is an error, since a misspelt
override must not be ignored silently, except the test tools' own (``NOT_CONFIG_ENV``).
Relative ``data_dirs`` are relative to the working directory, as in Kafka.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, NamedTuple, get_type_hints

from broker.server import ServerConfig
from controller.config import ControllerConfig, at_least, flags
from raft.core import RaftConfig
from raft.transport import TransportConfig
from raft.voters import parse_quorum_voters
from runnel.config_parse import (
    TOP,
    ConfigError,
    Problem,
    build,
    coerce_all,
    dotted,
    env_name,
    overlay,
    plain,
    read_env,
    read_toml,
    toml_line,
    unknown_keys,
)
from storage.config import LogConfig

__all__ = [
    "NOT_CONFIG_ENV",
    "REPLICATION_LISTENER",
    "SECTIONS",
    "BrokerConfig",
    "ConfigError",
    "ControllerConfig",
    "Listener",
    "NodeConfig",
    "Problem",
    "Role",
    "load_config",
    "schema",
]

MIB = 1024 * 1024
# RUNNEL_* variables that belong to test tools, not to a node's configuration.
NOT_CONFIG_ENV = frozenset({"RUNNEL_CRASH_SEED", "RUNNEL_REWRITE_SCENARIOS"})
_LISTENER = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]*):(\d+)$")
_CLUSTER_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_EVERY_INTERFACE = frozenset({"", "0.0.0.0", "[::]"})


class Role(StrEnum):
    BROKER = "broker"
    CONTROLLER = "controller"


@dataclass(frozen=True, slots=True)
class Listener:
    """A named address, ``NAME://host:port``. An empty host, 0.0.0.0 or [::] binds every
    interface (and then needs an advertised address, except the controller listener)."""

    name: str
    host: str
    port: int

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"listener {self}: port {self.port} is out of range 1-65535")

    @classmethod
    def parse(cls, text: str) -> Listener:
        match = _LISTENER.match(text.strip())
        if match is None:
            raise ValueError(f"listener {text!r} is not NAME://host:port")
        return cls(match[1], match[2], int(match[3]))

    def __str__(self) -> str:
        return f"{self.name}://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def binds_every_interface(self) -> bool:
        return self.host in _EVERY_INTERFACE


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """A broker's lifecycle and what it answers Kafka clients with (the listener's own
    limits are the ``[server]`` section)."""

    heartbeat_interval_ms: int = 2000  # below controller.broker_session_timeout_ms
    auto_create_topics_enable: bool = False  # Metadata for an unknown topic creates it
    fetch_max_bytes: int = 57_671_680  # 55 MiB: the most one Fetch response carries
    fetch_max_wait_ms: int = 30_000  # the longest a Fetch may long-poll, whatever it asks
    fetch_max_waiting: int = 10_000  # parked long polls, consumers' and followers' each
    controller_request_timeout_ms: int = 30_000  # a request forwarded to the controller
    # Fetch sessions (KIP-227): at most this many, holding at most this many partitions in
    # all; one unused this long is dropped.
    max_incremental_fetch_session_cache_slots: int = 1000  # Kafka's name; 0: no sessions
    fetch_session_cache_max_partitions: int = 200_000
    fetch_session_expiry_ms: int = 120_000
    # Replication (Kafka's names and defaults).
    replica_lag_time_max_ms: int = 30_000  # an ISR follower not caught up this long leaves
    replica_fetch_wait_max_ms: int = 500  # a follower's long poll on its leader
    replica_fetch_max_bytes: int = 1_048_576  # per partition per follower fetch
    replica_fetch_response_max_bytes: int = 10_485_760  # per follower fetch
    replica_fetch_backoff_ms: int = 1000  # a partition's rest after a fetch error (the longest)
    replica_high_watermark_checkpoint_interval_ms: int = 5000
    # A ReadBatches chunk (broker/replica_read.py) the client leaves untaken this long ends
    # the call DEADLINE_EXCEEDED; a live reader takes one (about 30 KB) in milliseconds.
    replica_read_write_timeout_ms: int = 30_000
    # ReadBatches calls held at once (a stalled one holds its gRPC slot until its client
    # goes); at most a quarter of raft_transport.max_concurrent_rpcs (checked below).
    replica_read_max_calls: int = 1_000
    # How often the log maintenance pass runs (time-based flushes, retention, compaction,
    # checkpoints), in a worker thread; each pass starts this long after the last one ended.
    log_maintenance_interval_ms: int = 30_000

    def __post_init__(self) -> None:
        _at_least(
            self,
            1,
            "heartbeat_interval_ms",
            "fetch_max_bytes",
            "fetch_max_waiting",
            "controller_request_timeout_ms",
            "replica_lag_time_max_ms",
            "replica_fetch_max_bytes",
            "replica_fetch_response_max_bytes",
            "replica_high_watermark_checkpoint_interval_ms",
            "replica_read_write_timeout_ms",
            "replica_read_max_calls",
            "fetch_session_expiry_ms",
            "log_maintenance_interval_ms",
        )
        _at_least(
            self,
            0,
            "fetch_max_wait_ms",
            "replica_fetch_wait_max_ms",
            "replica_fetch_backoff_ms",
            "max_incremental_fetch_session_cache_slots",
            "fetch_session_cache_max_partitions",
        )
        _flags(self, "auto_create_topics_enable")
        if self.fetch_session_expiry_ms <= self.fetch_max_wait_ms:
            # A consumer's session must outlive the longest long poll it may wait out.
            raise ValueError(
                f"fetch_session_expiry_ms ({self.fetch_session_expiry_ms}) must be above "
                f"fetch_max_wait_ms ({self.fetch_max_wait_ms})"
            )
        if self.replica_fetch_wait_max_ms >= self.replica_lag_time_max_ms:
            # As Kafka requires: a follower waiting out one long poll must not leave the ISR.
            raise ValueError(
                f"replica_fetch_wait_max_ms ({self.replica_fetch_wait_max_ms}) must be below "
                f"replica_lag_time_max_ms ({self.replica_lag_time_max_ms})"
            )


_at_least = at_least
_flags = flags


SECTIONS: dict[str, type[Any]] = {
    "raft": RaftConfig,
    "raft_transport": TransportConfig,
    "log": LogConfig,
    "controller": ControllerConfig,
    "broker": BrokerConfig,
    "server": ServerConfig,
}


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Everything one node runs with. Constructing it checks the relations between settings
    and raises ConfigError; ``origins`` maps a dotted key to where its value came from."""

    node_id: int
    process_roles: frozenset[Role]
    listeners: tuple[Listener, ...]  # NAME://host:port, one name each
    data_dirs: tuple[Path, ...]  # the first holds the metadata log
    controller_quorum_voters: str  # "1@host:port,2@host:port,..."
    advertised_listeners: tuple[Listener, ...] = ()  # what clients dial, by listener name
    controller_listener_name: str = "CONTROLLER"
    client_listener_name: str = "CLIENT"  # where a broker serves Kafka clients
    # Where followers fetch from leaders, over the Kafka protocol (Kafka's
    # inter.broker.listener.name); unset: the client listener.
    inter_broker_listener_name: str | None = None
    # What Metadata and DescribeCluster report; unset: derived from controller_quorum_voters,
    # so every node of one cluster reports the same id without being told.
    cluster_id: str | None = None
    rack: str | None = None
    metrics_port: int | None = None  # Prometheus over HTTP; none: no endpoint
    raft: RaftConfig = field(default_factory=RaftConfig)
    raft_transport: TransportConfig = field(default_factory=TransportConfig)
    log: LogConfig = field(default_factory=LogConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    origins: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        problems = [self._problem(f.keys, f.message) for f in _findings(self)]
        if problems:
            raise ConfigError(problems)

    @property
    def metadata_log_dir(self) -> Path:
        return self.data_dirs[0]

    def quorum_voters(self) -> dict[int, str]:
        """Voter id -> ``host:port`` of the controllers."""
        return parse_quorum_voters(self.controller_quorum_voters)

    def effective_cluster_id(self) -> str:
        """``cluster_id``, or one derived from the voters: 22 characters of URL-safe base64,
        the shape of Kafka's cluster ids, equal on every node given the same voters."""
        if self.cluster_id is not None:
            return self.cluster_id
        voters = ",".join(f"{i}@{a}" for i, a in sorted(self.quorum_voters().items()))
        digest = hashlib.sha256(voters.encode()).digest()[:16]
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def listener(self, name: str) -> Listener | None:
        return next((item for item in self.listeners if item.name == name), None)

    def advertised(self, name: str) -> Listener | None:
        """The address clients should dial for listener ``name``."""
        given = next((item for item in self.advertised_listeners if item.name == name), None)
        return given or self.listener(name)

    def to_dict(self) -> dict[str, Any]:
        """The effective values as plain data (sections as nested dicts), e.g. for JSON."""
        out: dict[str, Any] = {}
        for section, key, value, _ in self._settings():
            (out.setdefault(section, {}) if section else out)[key] = plain(value)
        return out

    def describe(self) -> str:
        """The effective values as TOML that loads again; a comment names where each value
        that is not a default came from."""
        lines = ["# runnel node configuration: effective values"]
        current = TOP
        for section, key, value, default in self._settings():
            if section != current:
                lines += ["", f"[{section}]"]
                current = section
            source = self.origins.get(dotted(section, key))
            lines.append(toml_line(key, value, source, unset_by_minus_one=default is not None))
        return "\n".join(lines) + "\n"

    def _settings(self) -> Iterator[tuple[str, str, object, object]]:
        """(section, key, value, default) of every setting, top-level keys first."""
        for f in fields(self):
            if f.name not in SECTIONS and f.name != "origins":
                yield TOP, f.name, getattr(self, f.name), f.default
        for section in SECTIONS:
            config = getattr(self, section)
            for f in fields(config):
                yield section, f.name, getattr(config, f.name), f.default

    def _problem(self, keys: tuple[str, ...], message: str) -> Problem:
        """Blame the first of ``keys`` that was set (a relation is broken by what was set)."""
        key = next((k for k in keys if k in self.origins), keys[0])
        source = self.origins.get(key) or ("" if key in REQUIRED else "default")
        return Problem(key, source, message)


# A broker-only node's gRPC listener: the metadata log (as an observer) and replica reads.
REPLICATION_LISTENER = "REPLICATION"

REQUIRED = frozenset(
    f.name for f in fields(NodeConfig) if f.default is MISSING and f.default_factory is MISSING
)

# -- relations between settings ----------------------------------------------------------------


class Finding(NamedTuple):
    message: str
    keys: tuple[str, ...]  # the keys involved, the likeliest culprit first


def _finding(message: str, *keys: str) -> Finding:
    return Finding(message, keys)


def _findings(config: NodeConfig) -> Iterator[Finding]:
    yield from _identity_findings(config)
    yield from _listener_findings(config)
    yield from _role_findings(config)
    yield from _voter_findings(config)
    yield from _limit_findings(config)


def _identity_findings(c: NodeConfig) -> Iterator[Finding]:
    if c.node_id < 0:
        yield _finding(f"must be at least 0, got {c.node_id}", "node_id")
    if not c.process_roles:
        yield _finding("names no role; give controller, broker or both", "process_roles")
    if not c.data_dirs:
        yield _finding("names no directory; give one (it holds the metadata log)", "data_dirs")
    dirs = Counter(os.path.normpath(path.absolute()) for path in c.data_dirs)
    for path, count in dirs.items():
        if count > 1:
            yield _finding(f"names {path} more than once", "data_dirs")
    if c.cluster_id is not None and not _CLUSTER_ID.match(c.cluster_id):
        message = f"{c.cluster_id!r} must be 1-64 letters, digits, '-' or '_'"
        yield _finding(message, "cluster_id")
    if c.rack is not None and not c.rack.strip():
        yield _finding("is empty; leave it unset instead", "rack")
    if c.metrics_port is not None and not 0 < c.metrics_port < 65536:
        yield _finding(f"port {c.metrics_port} is out of range 1-65535", "metrics_port")
    if c.metrics_port in {item.port for item in c.listeners}:
        yield _finding(f"port {c.metrics_port} is already used by a listener", "metrics_port")


def _listener_findings(c: NodeConfig) -> Iterator[Finding]:
    for key in ("listeners", "advertised_listeners"):
        names = Counter(item.name for item in getattr(c, key))
        for name, count in names.items():
            if count > 1:
                yield _finding(f"names listener {name} {count} times", key)
    ports = Counter(item.port for item in c.listeners)
    for port, count in ports.items():
        if count > 1:
            yield _finding(f"{count} listeners share port {port}", "listeners")
    known = ", ".join(item.name for item in c.listeners)
    for item in c.advertised_listeners:
        if c.listener(item.name) is None:
            message = f"{item.name} is not among listeners ({known})"
            yield _finding(message, "advertised_listeners")
        if item.binds_every_interface:
            yield _finding(f"{item} is not an address anyone can dial", "advertised_listeners")
    for item in c.listeners:
        exempt = item.name == c.controller_listener_name  # controllers are dialled as voters
        if c.advertised(item.name) is item and item.binds_every_interface and not exempt:
            message = (
                f"{item} binds every interface; give the address clients dial as an "
                f"advertised listener {item.name}://host:{item.port}"
            )
            yield _finding(message, "advertised_listeners", "listeners")


def _role_findings(c: NodeConfig) -> Iterator[Finding]:
    name = c.controller_listener_name
    known = ", ".join(item.name for item in c.listeners) or "none"
    if Role.CONTROLLER in c.process_roles and c.listener(name) is None:
        message = f"{name!r} is not among listeners ({known}); a controller listens on it"
        yield _finding(message, "controller_listener_name", "listeners")
    client = c.client_listener_name
    if Role.BROKER in c.process_roles and c.listener(client) is None:
        message = f"{client!r} is not among listeners ({known}); a broker serves clients on it"
        yield _finding(message, "client_listener_name", "listeners")
    if Role.BROKER in c.process_roles and client == name:
        message = f"clients and controllers cannot share the listener {name}"
        yield _finding(message, "client_listener_name", "controller_listener_name")
    if c.process_roles == {Role.BROKER} and c.listener(name) is not None:
        message = f"a broker-only node must not listen on the controller listener {name}"
        yield _finding(message, "listeners", "controller_listener_name")
    yield from _inter_broker_findings(c)


def _inter_broker_findings(c: NodeConfig) -> Iterator[Finding]:
    inter, key = c.inter_broker_listener_name, "inter_broker_listener_name"
    if inter is None or Role.BROKER not in c.process_roles:
        return
    known = ", ".join(item.name for item in c.listeners) or "none"
    if inter in (c.controller_listener_name, REPLICATION_LISTENER):
        message = (
            f"{inter!r} serves gRPC (the metadata log, replica reads), not the Kafka protocol "
            "followers fetch with; name a Kafka listener of its own"
        )
        yield _finding(message, key)
    elif c.listener(inter) is None:
        message = f"{inter!r} is not among listeners ({known}); followers fetch from leaders on it"
        yield _finding(message, key, "listeners")


def _voter_findings(c: NodeConfig) -> Iterator[Finding]:
    key = "controller_quorum_voters"
    if c.node_id < 0 or not c.process_roles:
        return  # reported already; comparing with the voters would only repeat it
    if not c.controller_quorum_voters.strip():
        yield _finding("is empty; give the controllers as id@host:port,...", key)
        return
    try:
        voters = c.quorum_voters()
    except ValueError as e:
        yield _finding(str(e).removeprefix(f"{key} "), key)
        return
    own = voters.get(c.node_id)
    if Role.CONTROLLER not in c.process_roles:
        if own is not None:
            message = f"node {c.node_id} is a voter in {key} but not a controller"
            yield _finding(message, "node_id", key, "process_roles")
        return
    if own is None:
        message = f"does not name this controller, node {c.node_id} (it names {sorted(voters)})"
        yield _finding(message, key, "node_id")
        return
    listener = c.listener(c.controller_listener_name)
    if listener is not None and not _same_address(own, listener):
        message = f"gives node {c.node_id} the address {own}, but its listener is {listener}"
        yield _finding(message, key, "listeners")


def _same_address(voter: str, listener: Listener) -> bool:
    host, _, port = voter.rpartition(":")
    if int(port) != listener.port:
        return False
    return listener.binds_every_interface or host.lower() == listener.host.lower()


# The most a Produce request carrying one batch (of one partition) adds around the batch: a
# client id of 32,767 bytes (its int16 length's limit), a transactional id as long, a topic
# name of 249 characters and the fixed fields come to 65,819 bytes in the Produce versions
# runnel serves (v3-v9); rounded up. A batch of log.max_message_bytes must fit in
# socket_request_max_bytes with this around it, or a producer sized to the message limit has
# its connection closed by the frame check instead of being answered MESSAGE_TOO_LARGE.
PRODUCE_FRAMING_MAX_BYTES = 66 * 1024


def _limit_findings(c: NodeConfig) -> Iterator[Finding]:
    yield from _heartbeat_findings(c)
    frame, message_bytes = c.server.socket_request_max_bytes, c.log.max_message_bytes
    if Role.BROKER in c.process_roles and frame < message_bytes + PRODUCE_FRAMING_MAX_BYTES:
        message = (
            f"socket_request_max_bytes ({frame}) must be at least log.max_message_bytes "
            f"({message_bytes}) + {PRODUCE_FRAMING_MAX_BYTES} (a Produce request's framing "
            "at most), or a batch the log accepts closes the producer's connection"
        )
        yield _finding(message, "server.socket_request_max_bytes", "log.max_message_bytes")
    largest = max(c.raft.fetch_max_bytes, c.raft.max_batch_bytes, c.raft.snapshot_chunk_bytes)
    try:
        c.raft_transport.check_fits(largest)
    except ValueError as e:
        keys = ("raft.fetch_max_bytes", "raft.max_batch_bytes", "raft.snapshot_chunk_bytes")
        yield _finding(str(e), "raft_transport.max_message_bytes", *keys)
    reads, rpcs = c.broker.replica_read_max_calls, c.raft_transport.max_concurrent_rpcs
    if Role.BROKER in c.process_roles and reads > rpcs // 4:
        message = (
            f"replica_read_max_calls ({reads}) must be at most a quarter of "
            f"raft_transport.max_concurrent_rpcs ({rpcs}): the controller API may hold half of "
            "the server's calls, and Raft needs the rest"
        )
        yield _finding(
            message, "broker.replica_read_max_calls", "raft_transport.max_concurrent_rpcs"
        )
    idle_ms, fetch_timeout_ms = c.raft_transport.learned_peer_max_idle_ms, c.raft.fetch_timeout_ms
    if idle_ms <= fetch_timeout_ms:
        message = (
            f"learned_peer_max_idle_ms ({idle_ms}) must exceed raft.fetch_timeout_ms "
            f"({fetch_timeout_ms}), or the leader may forget a live broker between its fetches "
            "and drop the answers"
        )
        yield _finding(message, "raft_transport.learned_peer_max_idle_ms", "raft.fetch_timeout_ms")


def _heartbeat_findings(c: NodeConfig) -> Iterator[Finding]:
    """Only on a combined node: its broker's heartbeats against the session timeout its own
    controller fences with when active. A broker-only node's ``[controller]`` section is not
    what the controllers fence with (theirs is, and the node cannot see it), and a
    controller-only node sends no heartbeats; there the operator keeps every broker's
    heartbeat_interval_ms below the controllers' broker_session_timeout_ms."""
    if c.process_roles != {Role.BROKER, Role.CONTROLLER}:
        return
    heartbeat, session = c.broker.heartbeat_interval_ms, c.controller.broker_session_timeout_ms
    if heartbeat >= session:
        message = (
            f"heartbeat_interval_ms ({heartbeat}) must be below "
            f"controller.broker_session_timeout_ms ({session}), or live brokers get fenced"
        )
        yield _finding(
            message, "broker.heartbeat_interval_ms", "controller.broker_session_timeout_ms"
        )


# -- loading -----------------------------------------------------------------------------------


def schema() -> dict[str, dict[str, Any]]:
    """Section (``""`` for the top level) -> key -> type hint: every key a node knows."""
    hints = get_type_hints(NodeConfig)
    top = {key: hint for key, hint in hints.items() if key not in SECTIONS and key != "origins"}
    return {TOP: top} | {name: get_type_hints(cls) for name, cls in SECTIONS.items()}


def load_config(path: Path | None, env: Mapping[str, str]) -> NodeConfig:
    """The node's configuration from the TOML file at ``path`` (if any) with the ``RUNNEL_*``
    variables of ``env`` over it; raises ConfigError listing every problem found."""
    layer = read_env(env, NOT_CONFIG_ENV)
    if path is not None:
        layer = overlay(read_toml(path), layer)
    keys = schema()
    problems = unknown_keys(layer, keys)
    origins = {
        dotted(section, key): setting.source
        for section, settings in layer.items()
        for key, setting in settings.items()
        if key in keys.get(section, {})
    }
    values: dict[str, Any] = coerce_all(TOP, layer.get(TOP, {}), keys[TOP], problems)
    for section, cls in SECTIONS.items():
        given = coerce_all(section, layer.get(section, {}), keys[section], problems)
        sources = {key: origins[dotted(section, key)] for key in given}
        values[section] = build(cls, list(keys[section]), section, given, sources, problems)
    for key in sorted(REQUIRED - values.keys() - layer[TOP].keys()):
        message = f"is required: set it in the file or as {env_name(TOP, key)}"
        problems.append(Problem(key, "", message))
    if not values.keys() >= REQUIRED:
        raise ConfigError(problems)
    try:
        config = NodeConfig(**values, origins=origins)
    except ConfigError as e:
        raise ConfigError([*problems, *e.problems]) from None
    if problems:
        raise ConfigError(problems)
    return config
