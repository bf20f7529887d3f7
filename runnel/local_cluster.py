"""A local cluster: controllers and brokers as separate processes on 127.0.0.1.

How this works. A ``ClusterSpec`` (how many controllers and brokers, the data dir, the base
port) is saved as ``<data_dir>/cluster.json``; everything else follows from it, so a second
``runnel cluster up`` on the same data dir brings back the same cluster: same node ids, ports
and configs. Layout of the data dir:

    cluster.json          the spec
    supervisor.pid        the ``runnel cluster up`` process watching the nodes, while it runs
    node-<id>/node.toml   the node's config, generated once (edits survive a resume)
    node-<id>/node.log    its stdout and stderr, appended across restarts
    node-<id>/node.pid    its process id while it runs
    node-<id>/data/       its data dir (the metadata log first)

Node ids and ports. Controllers are 1..C, brokers 101..100+B. The k-th node (controllers
first, 0-based) owns the ports ``base_port + 4k`` to ``base_port + 4k + 3``, one per purpose
(``PORT_OFFSETS``): CLIENT, CONTROLLER, REPLICATION and metrics. A controller listens on
CONTROLLER (the metadata quorum and the controller's gRPC API); a broker on CLIENT (for Kafka
clients, once the Kafka listener exists) and REPLICATION (the metadata log as an observer,
later partition data). Both get a metrics port.

Processes and restarts are ``runnel/supervisor.py``'s business.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from runnel.commands import CommandError

__all__ = [
    "CLUSTER_FILE",
    "DEFAULT_BASE_PORT",
    "DEFAULT_BROKERS",
    "DEFAULT_CONTROLLERS",
    "ClusterSpec",
    "NodeSpec",
    "Port",
    "ports_in_use",
    "process_alive",
    "read_pid",
]

CLUSTER_FILE = "cluster.json"
SUPERVISOR_PID_FILE = "supervisor.pid"
SPEC_VERSION = 1
HOST = "127.0.0.1"
DEFAULT_CONTROLLERS = 3
DEFAULT_BROKERS = 3
DEFAULT_BASE_PORT = 19090
FIRST_BROKER_ID = 101
MAX_NODES_PER_ROLE = 99  # controller ids (1..C) stay below the first broker id
PORTS_PER_NODE = 4


class Port(StrEnum):
    """A node's ports, by purpose; the value is the listener name (metrics has none)."""

    CLIENT = "CLIENT"
    CONTROLLER = "CONTROLLER"
    REPLICATION = "REPLICATION"
    METRICS = "METRICS"


PORT_OFFSETS = {Port.CLIENT: 0, Port.CONTROLLER: 1, Port.REPLICATION: 2, Port.METRICS: 3}
CONTROLLER_PORTS = (Port.CONTROLLER, Port.METRICS)
BROKER_PORTS = (Port.CLIENT, Port.REPLICATION, Port.METRICS)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node of a local cluster: its id, role and the ports it uses."""

    node_id: int
    is_controller: bool
    ports: dict[Port, int]

    @property
    def role(self) -> str:
        return "controller" if self.is_controller else "broker"

    def listeners(self) -> dict[str, str]:
        """Listener name -> host:port (the metrics port is not a listener)."""
        return {p.value: f"{HOST}:{n}" for p, n in self.ports.items() if p is not Port.METRICS}


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """What ``cluster.json`` records; ``data_dir`` is where it lives (absolute)."""

    controllers: int
    brokers: int
    data_dir: Path
    base_port: int = DEFAULT_BASE_PORT

    def __post_init__(self) -> None:
        for name in ("controllers", "brokers"):
            count = getattr(self, name)
            if not 1 <= count <= MAX_NODES_PER_ROLE:
                raise CommandError(f"--{name} must be 1-{MAX_NODES_PER_ROLE}, got {count}")
        last = self.base_port + PORTS_PER_NODE * (self.controllers + self.brokers) - 1
        if self.base_port < 1024 or last > 65535:
            raise CommandError(
                f"--base-port {self.base_port}: the cluster needs ports {self.base_port}-{last},"
                " which must lie within 1024-65535"
            )

    # -- the nodes -----------------------------------------------------------------------
    def nodes(self) -> list[NodeSpec]:
        """Controllers first, then brokers."""
        ids = [*range(1, self.controllers + 1)]
        ids += range(FIRST_BROKER_ID, FIRST_BROKER_ID + self.brokers)
        return [self._node(slot, node_id) for slot, node_id in enumerate(ids)]

    def node(self, node_id: int) -> NodeSpec:
        found = next((n for n in self.nodes() if n.node_id == node_id), None)
        if found is None:
            raise CommandError(f"the cluster in {self.data_dir} has no node {node_id}")
        return found

    def _node(self, slot: int, node_id: int) -> NodeSpec:
        is_controller = node_id < FIRST_BROKER_ID
        first = self.base_port + PORTS_PER_NODE * slot
        wanted = CONTROLLER_PORTS if is_controller else BROKER_PORTS
        return NodeSpec(node_id, is_controller, {p: first + PORT_OFFSETS[p] for p in wanted})

    def controller_addresses(self) -> dict[int, str]:
        """Controller id -> host:port of its CONTROLLER listener."""
        return {
            n.node_id: f"{HOST}:{n.ports[Port.CONTROLLER]}" for n in self.nodes() if n.is_controller
        }

    @property
    def quorum_voters(self) -> str:
        return ",".join(f"{i}@{a}" for i, a in self.controller_addresses().items())

    @property
    def bootstrap(self) -> str:
        """What ``runnel topics`` and ``cluster status`` dial: the controllers (gRPC)."""
        return ",".join(self.controller_addresses().values())

    @property
    def kafka_bootstrap(self) -> str:
        """What Kafka clients dial: every broker's CLIENT listener."""
        return ",".join(
            f"{HOST}:{n.ports[Port.CLIENT]}" for n in self.nodes() if not n.is_controller
        )

    # -- files ---------------------------------------------------------------------------
    def node_dir(self, node_id: int) -> Path:
        return self.data_dir / f"node-{node_id}"

    def config_path(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "node.toml"

    def log_path(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "node.log"

    def pid_path(self, node_id: int) -> Path:
        return self.node_dir(node_id) / "node.pid"

    @property
    def supervisor_pid_path(self) -> Path:
        return self.data_dir / SUPERVISOR_PID_FILE

    def running_pid(self, node_id: int) -> int | None:
        """The pid of the node's process if its pid file names one that runs this node."""
        pid = read_pid(self.pid_path(node_id))
        marker = str(self.config_path(node_id))
        return pid if pid is not None and process_alive(pid, marker) else None

    def write_node_configs(self) -> None:
        """Generate each node's ``node.toml`` that does not exist yet, and check it loads."""
        from runnel.config import ConfigError, load_config  # the config stack is heavy

        for node in self.nodes():
            path = self.config_path(node.node_id)
            if not path.exists():
                (self.node_dir(node.node_id) / "data").mkdir(parents=True, exist_ok=True)
                path.write_text(self.node_config_toml(node))
            try:
                load_config(path, {})
            except ConfigError as e:
                raise CommandError(f"{path} is not a valid node config:\n{e}") from None

    def node_config_toml(self, node: NodeSpec) -> str:
        listeners = [f"{name}://{address}" for name, address in node.listeners().items()]
        data_dir = self.node_dir(node.node_id) / "data"
        lines = [
            f"# Generated by `runnel cluster up` for node {node.node_id} ({node.role}) of the",
            f"# local cluster in {self.data_dir}. A resume keeps this file as it is.",
            f"node_id = {node.node_id}",
            f"process_roles = [{_toml_str(node.role)}]",
            f"listeners = [{', '.join(_toml_str(x) for x in listeners)}]",
            f"data_dirs = [{_toml_str(str(data_dir))}]",
            f"controller_quorum_voters = {_toml_str(self.quorum_voters)}",
            f"metrics_port = {node.ports[Port.METRICS]}",
        ]
        return "\n".join(lines) + "\n"

    # -- cluster.json ----------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "version": SPEC_VERSION,
            "controllers": self.controllers,
            "brokers": self.brokers,
            "base_port": self.base_port,
        }

    def save(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / CLUSTER_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, data_dir: Path) -> ClusterSpec | None:
        """The spec saved in ``data_dir``, or None if there is none."""
        data_dir = data_dir.absolute()
        path = data_dir / CLUSTER_FILE
        try:
            raw = json.loads(path.read_text())
            if raw.get("version") != SPEC_VERSION:
                raise CommandError(f"{path}: unknown version {raw.get('version')!r}")
            return cls(raw["controllers"], raw["brokers"], data_dir, raw["base_port"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise CommandError(f"{path} is unreadable or damaged: {e!r}") from None

    @classmethod
    def resolve(
        cls,
        data_dir: Path,
        controllers: int | None,
        brokers: int | None,
        base_port: int | None,
    ) -> ClusterSpec:
        """The cluster saved in ``data_dir`` (options given must agree with it), or a new one
        from the options and defaults."""
        saved = cls.load(data_dir)
        if saved is None:
            return cls(
                controllers or DEFAULT_CONTROLLERS,
                brokers or DEFAULT_BROKERS,
                data_dir.absolute(),
                base_port or DEFAULT_BASE_PORT,
            )
        given = {"controllers": controllers, "brokers": brokers, "base-port": base_port}
        have = {"controllers": saved.controllers, "brokers": saved.brokers}
        have["base-port"] = saved.base_port
        clashes = [f"--{k} {v}" for k, v in given.items() if v is not None and v != have[k]]
        if clashes:
            raise CommandError(
                f"{saved.data_dir} holds a cluster of {saved.controllers} controllers and "
                f"{saved.brokers} brokers on base port {saved.base_port}; "
                f"{', '.join(clashes)} conflicts with it. Leave the option out to resume that "
                "cluster, or use another --data-dir for a new one."
            )
        return saved


def _toml_str(text: str) -> str:
    return json.dumps(text)  # a JSON string is a TOML basic string


# -- processes and ports -----------------------------------------------------------------------


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def process_alive(pid: int, marker: str | None = None) -> bool:
    """Whether ``pid`` runs (a zombie does not) and, where ``/proc`` can tell, its command
    line contains ``marker`` (so a recycled pid is not taken for the node)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return marker is None  # another user's process: not one of ours
    proc = Path(f"/proc/{pid}")
    if not proc.is_dir():
        return True  # no /proc (macOS): signal 0 is all we know
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = (proc / "cmdline").read_bytes()
    except (OSError, IndexError):
        return False  # it went away while we looked
    if state in {"Z", "X"}:
        return False
    return marker is None or marker.encode() in cmdline


def ports_in_use(ports: Iterable[int]) -> list[int]:
    """The ports among ``ports`` that cannot be bound on 127.0.0.1 now."""
    busy = []
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do
            try:
                s.bind((HOST, port))
            except OSError:
                busy.append(port)
    return busy
