"""What ``runnel cluster status`` (and ``cluster up``'s live view) shows: the active
controller and every node, as a table or one JSON object.

How this works. :func:`find_active` asks every known controller for DescribeCluster, one
plain blocking gRPC call each with a short deadline. The one that answers is the active
controller; a standby's NOT_CONTROLLER answer names the active one (id and address), which
is then asked too, so a single bootstrap address is enough. :func:`gather` joins that answer
with what the local cluster knows (the nodes it should have, their pids, the supervisor's
notes). For a cluster reached by ``--bootstrap``, only the controllers' addresses and the
registered brokers are known: fields nobody can tell are None (``null``, ``-`` in the table).

Metadata lag is the active controller's committed offset minus the offset the broker last
reported in a heartbeat (every ``broker.heartbeat_interval_ms``), so a few records of lag
are normal in a healthy cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from runnel.admin import Controllers
from runnel.local_cluster import ClusterSpec

__all__ = ["Active", "ClusterStatus", "NodeStatus", "Survey", "find_active", "gather", "render"]

PROBE_TIMEOUT_S = 1.5
RETRY_STEP_S = 0.2


@dataclass(frozen=True, slots=True)
class Active:
    """The active controller and what it answered (a DescribeClusterResponse)."""

    node_id: int | None  # None when only its address is known
    address: str
    response: Any


@dataclass(frozen=True, slots=True)
class NodeStatus:
    node_id: int | None
    roles: list[str]
    addresses: dict[str, str]  # listener name -> host:port
    pid: int | None = None  # local cluster only
    alive: bool | None = None  # local: the process runs; remote controller: it answered
    registered: bool | None = None  # brokers: known to the active controller
    fenced: bool | None = None
    broker_epoch: int | None = None
    metadata_offset: int | None = None
    metadata_lag: int | None = None
    partitions: int | None = None  # replicas it holds
    leaders: int | None = None
    note: str = ""  # the supervisor's ("restarting in 4 s")


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    controller_id: int | None  # the active controller; None: none answered (or id unknown)
    controller_address: str | None
    controller_epoch: int | None
    metadata_offset: int | None
    image_digest: str | None
    topics: int | None
    partitions: int | None
    nodes: list[NodeStatus] = field(default_factory=list)

    @property
    def brokers(self) -> list[NodeStatus]:
        return [n for n in self.nodes if "broker" in n.roles]

    def unhealthy(self) -> list[str]:
        """Why the cluster is not healthy (empty: an active controller answered and every
        broker is registered and unfenced)."""
        if self.controller_address is None:
            return ["no active controller answered"]
        return [
            f"broker {n.node_id} is " + ("not registered" if not n.registered else "fenced")
            for n in self.brokers
            if not n.registered or n.fenced
        ]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- asking the controllers --------------------------------------------------------------------


def _probe(address: str) -> tuple[Any | None, str]:
    """DescribeCluster at one address: (response, "") or (None, why not)."""
    import grpc

    from proto import controller_pb2 as cpb
    from proto import controller_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = controller_pb2_grpc.ControllerServiceStub(channel)
        try:
            response = stub.DescribeCluster(cpb.DescribeClusterRequest(), timeout=PROBE_TIMEOUT_S)
        except grpc.RpcError as e:
            return None, f"{address}: {e.code().name}"
    return response, ""


@dataclass(frozen=True, slots=True)
class Survey:
    """What asking the controllers found."""

    active: Active | None  # None: no controller answered as the active one
    answered: dict[str, bool]  # every address asked -> whether it answered at all
    ids: dict[str, int]  # address -> controller id, where known


def find_active(controllers: Controllers, timeout_s: float) -> Survey:
    """Ask the controllers until the active one answers or ``timeout_s`` has passed (at
    least one round)."""
    ids = {a: i for i, a in controllers.addresses.items() if i >= 0}
    to_ask = list(controllers.addresses.values())
    deadline = time.monotonic() + timeout_s
    while True:
        answered: dict[str, bool] = {}
        for address in to_ask:
            response, _ = _probe(address)
            answered[address] = response is not None
            if response is None:
                continue
            header = response.header
            if header.error == 0:
                active = Active(ids.get(address), address, response)
                return Survey(active, answered, ids)
            if header.controller_id >= 0 and header.controller_address:
                ids[header.controller_address] = header.controller_id
                if header.controller_address not in to_ask:
                    to_ask.append(header.controller_address)
        if time.monotonic() + RETRY_STEP_S >= deadline:
            return Survey(None, answered, ids)
        time.sleep(RETRY_STEP_S)


def gather(
    controllers: Controllers,
    timeout_s: float,
    notes: Callable[[int], str] | None = None,
) -> ClusterStatus:
    """The cluster's status as the active controller and the local cluster (if any) see it."""
    survey = find_active(controllers, timeout_s)
    active = survey.active
    response = active.response if active is not None else None
    status = ClusterStatus(
        controller_id=active.node_id if active else None,
        controller_address=active.address if active else None,
        controller_epoch=response.controller_epoch if response else None,
        metadata_offset=response.metadata_offset if response else None,
        image_digest=response.image_digest if response else None,
        topics=response.topics if response else None,
        partitions=response.partitions if response else None,
    )
    brokers = {b.broker_id: b for b in response.brokers} if response else {}
    if controllers.cluster is not None:
        nodes = _local_nodes(controllers.cluster, brokers, status, notes)
    else:
        nodes = _remote_nodes(survey, brokers, status)
    status.nodes.extend(nodes)
    return status


def _local_nodes(
    cluster: ClusterSpec,
    brokers: dict[int, Any],
    status: ClusterStatus,
    notes: Callable[[int], str] | None,
) -> list[NodeStatus]:
    nodes = []
    for spec in cluster.nodes():
        pid = cluster.running_pid(spec.node_id)
        note = notes(spec.node_id) if notes is not None else ""
        base = NodeStatus(spec.node_id, [spec.role], spec.listeners(), pid, pid is not None)
        if spec.is_controller:
            nodes.append(_with(base, note=note))
        else:
            nodes.append(_broker(base, brokers.pop(spec.node_id, None), status, note))
    # brokers the controller knows that this cluster does not (another process, a typo)
    nodes += [_broker(_registered_only(b), b, status, "") for b in brokers.values()]
    return nodes


def _remote_nodes(
    survey: Survey, brokers: dict[int, Any], status: ClusterStatus
) -> list[NodeStatus]:
    """Every controller address asked (the bootstrap ones, and the active one if a standby
    named it), then the registered brokers."""
    nodes = [
        NodeStatus(survey.ids.get(address), ["controller"], {"CONTROLLER": address}, None, alive)
        for address, alive in survey.answered.items()
    ]
    nodes += [_broker(_registered_only(b), b, status, "") for b in brokers.values()]
    return nodes


def _registered_only(b: Any) -> NodeStatus:
    addresses = {x.name: f"{x.host}:{x.port}" for x in b.listeners}
    return NodeStatus(b.broker_id, ["broker"], addresses)


def _broker(base: NodeStatus, b: Any | None, status: ClusterStatus, note: str) -> NodeStatus:
    if b is None:
        registered = None if status.controller_address is None else False
        return _with(base, registered=registered, note=note)
    lag = None
    if status.metadata_offset is not None and b.metadata_offset >= 0:
        lag = status.metadata_offset - b.metadata_offset
    return _with(
        base,
        registered=True,
        fenced=b.fenced,
        broker_epoch=b.broker_epoch,
        metadata_offset=b.metadata_offset if b.metadata_offset >= 0 else None,
        metadata_lag=lag,
        partitions=b.partitions,
        leaders=b.leaders,
        note=note or ("controlled shutdown" if b.in_controlled_shutdown else ""),
    )


def _with(base: NodeStatus, **changes: Any) -> NodeStatus:
    return NodeStatus(**{**asdict(base), **changes})


# -- the table ---------------------------------------------------------------------------------

COLUMNS = ("ID", "ROLE", "ADDRESSES", "PID", "ALIVE", "FENCED", "EPOCH", "LAG", "PARTS", "LEADS")


def render(status: ClusterStatus) -> str:
    """The status as lines for people: a heading, then one row per node."""
    lines = [_heading(status), ""]
    rows = [list(COLUMNS), *(_row(n) for n in status.nodes)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    for row, node in zip(rows, [None, *status.nodes], strict=True):
        text = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        lines.append(text + (f"  {node.note}" if node is not None and node.note else ""))
    return "\n".join(lines)


def _heading(s: ClusterStatus) -> str:
    if s.controller_address is None:
        return "controller: none answered (no active controller)"
    who = f"node {s.controller_id}" if s.controller_id is not None else "id unknown"
    return (
        f"controller: {who} at {s.controller_address}, epoch {s.controller_epoch}; "
        f"metadata offset {s.metadata_offset}, image digest {_short(s.image_digest)}; "
        f"{s.topics} topics, {s.partitions} partitions"
    )


def _row(n: NodeStatus) -> list[str]:
    fenced = _text(n.fenced)
    if n.registered is False:
        fenced = "unregistered"
    addresses = ",".join(f"{k}={v}" for k, v in n.addresses.items())
    values: Sequence[object] = (
        n.node_id,
        ",".join(n.roles),
        addresses,
        n.pid,
        n.alive,
    )
    counts = (n.broker_epoch, n.metadata_lag, n.partitions, n.leaders)
    return [*(_text(v) for v in values), fenced, *(_text(v) for v in counts)]


def _text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _short(digest: str | None) -> str:
    return "-" if not digest else digest[:12]
