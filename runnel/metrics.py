"""Prometheus metrics of one node, served over HTTP on ``metrics_port`` (127.0.0.1 only
unless the config's listeners bind elsewhere: the endpoint follows the CONTROLLER or
REPLICATION listener's host).

How this works. Nothing on the hot paths counts anything for metrics: a custom collector
reads the node's current state (Raft role, epoch, high watermark, the image, the broker's
lifecycle state) each time Prometheus scrapes, so a node without a scraper pays nothing. The
image digest is computed per scrape (a pass over the whole image: fine for thousands of
partitions; a large cluster would want it cached per offset).

Types follow Prometheus's naming conventions (prometheus.io/docs/practices/naming). A count
since start-up (the attributes the node bumps, read per scrape; a restart resets them) is a
counter named ``..._total``, bytes with the unit before it; a value "now" is a gauge. The
counters, all ``runnel_kafka_``: ``connections_accepted_total``, ``connections_refused_total``,
``connections_closed_total``, ``requests_received_total`` (label ``listener``),
``requests_served_total`` (label ``api_key``), ``received_bytes_total``, ``sent_bytes_total``,
``replica_fetches_total``, ``replica_full_fetches_total``,
``replica_fetch_session_errors_total``, ``replica_appended_bytes_total``,
``replica_truncations_total``, ``replica_metadata_rests_total``,
``isr_changes_proposed_total``, ``isr_changes_refused_total``, ``isr_change_requests_total``,
``fetch_session_evictions_total``, ``fetch_session_expirations_total`` and
``request_memory_waits_total``; and ``runnel_raft_inbox_drops_total`` (label ``reason``:
``count`` or ``bytes``) and ``runnel_raft_learned_peers_forgotten_total``. Everything else is
a gauge. prometheus_client names a counter's family without ``_total`` and its samples with
it; the classic text format prints ``# TYPE`` with ``_total``, OpenMetrics without (and a
``# UNIT bytes`` line for the byte counters).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import start_http_server
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from controller.image import NO_LEADER

if TYPE_CHECKING:
    from broker.runtime import KafkaBroker
    from controller.image import MetadataImage
    from replication.partition import Partition
    from runnel.node import RunnelNode

__all__ = ["serve_metrics"]

RAFT_ROLES = (
    "unattached",
    "prospective",
    "candidate",
    "leader",
    "follower",
    "resigned",
    "observer",
)


class NodeCollector(Collector):
    def __init__(self, node: RunnelNode) -> None:
        self.node = node
        self._offline: tuple[object, int] = (None, 0)  # (image, its offline partitions)

    def _offline_partitions(self, image: MetadataImage) -> int:
        """Partitions without a leader in ``image``: one pass per image (images never
        change), not per scrape."""
        seen, count = self._offline
        if seen is not image:
            count = sum(
                p.leader == NO_LEADER for t in image.topics.values() for p in t.partitions.values()
            )
            self._offline = (image, count)
        return count

    def collect(self) -> Iterator[Metric]:
        node, raft = self.node, self.node.raft
        labels = ["node_id"]
        node_id = str(node.config.node_id)
        yield _gauge("runnel_raft_epoch", "The node's Raft epoch", labels, node_id, raft.epoch)
        yield _gauge(
            "runnel_raft_leader_id", "The Raft leader it knows (-1: none)", labels, node_id,
            raft.leader_id,
        )  # fmt: skip
        yield _gauge(
            "runnel_raft_high_watermark", "The metadata log's high watermark", labels, node_id,
            raft.high_watermark,
        )  # fmt: skip
        yield _gauge(
            "runnel_metadata_applied_offset", "Metadata records below this offset are applied",
            labels, node_id, raft.applied_end,
        )  # fmt: skip
        role = GaugeMetricFamily(
            "runnel_raft_role", "1 for the node's Raft role", labels=[*labels, "role"]
        )
        for name in RAFT_ROLES:
            role.add_metric([node_id, name], 1.0 if raft.role == name else 0.0)
        yield role
        image = node.machine.published  # never node.machine.image: that builds, on the loop
        info = GaugeMetricFamily(
            "runnel_metadata_image",
            "The applied image: its last offset and digest (1; compare across nodes)",
            labels=[*labels, "offset", "digest"],
        )
        info.add_metric([node_id, str(image.offset), image.digest()], 1.0)
        yield info
        yield _gauge(
            "runnel_metadata_topics", "Topics in the image", labels, node_id, len(image.topics)
        )
        yield _gauge(
            "runnel_metadata_partitions", "Partitions in the image", labels, node_id,
            image.partition_count(),
        )  # fmt: skip
        yield _gauge(
            "runnel_metadata_brokers_unfenced", "Unfenced brokers in the image", labels, node_id,
            len(image.unfenced_broker_ids()),
        )  # fmt: skip
        yield _gauge(
            "runnel_metadata_offline_partitions",
            "Partitions without a leader in the image (Kafka's OfflinePartitionsCount)",
            labels, node_id, self._offline_partitions(image),
        )  # fmt: skip
        yield from _raft_limits(node, labels, node_id)
        if node.controller is not None:
            yield _gauge(
                "runnel_controller_active", "1 on the active controller", labels, node_id,
                1 if node.controller.active else 0,
            )  # fmt: skip
        if node.lifecycle is not None:
            state = GaugeMetricFamily(
                "runnel_broker_state",
                "1 for the broker's lifecycle state",
                labels=[*labels, "state"],
            )
            for name in ("starting", "fenced", "running", "shutting-down", "stopped"):
                state.add_metric(
                    [node_id, name], 1.0 if node.lifecycle.state.value == name else 0.0
                )
            yield state
        if node.kafka is not None:
            yield from _kafka_metrics(node, node_id)


def _raft_limits(node: RunnelNode, labels: list[str], node_id: str) -> Iterator[Metric]:
    """What the Raft inbox dropped and the transport's learned peers (docs/raft.md)."""
    drops = CounterMetricFamily(
        "runnel_raft_inbox_drops_total",
        "Received Raft messages dropped so far: the inbox held its most messages or bytes",
        labels=[*labels, "reason"],
    )
    drops.add_metric([node_id, "count"], float(node.raft.inbox_full_drops))
    drops.add_metric([node_id, "bytes"], float(node.raft.inbox_bytes_drops))
    yield drops
    transport = node.transport
    yield _gauge(
        "runnel_raft_learned_peers", "Peers known from their messages only (brokers), now",
        labels, node_id, transport.learned_peer_count,
    )  # fmt: skip
    yield _counter(
        "runnel_raft_learned_peers_forgotten_total",
        "Learned peers forgotten so far: idle too long, or to make room at the cap",
        labels, node_id, transport.forgotten_learned_peers,
    )  # fmt: skip


def _kafka_metrics(node: RunnelNode, node_id: str) -> Iterator[Metric]:
    """The Kafka listeners and the partitions held here (plain attribute reads)."""
    kafka = node.kafka
    if kafka is None:
        return
    servers, labels = list(kafka.servers.values()), ["node_id"]
    yield _gauge(
        "runnel_kafka_connections_open", "Client connections open now", labels, node_id,
        sum(server.connections_open for server in servers),
    )  # fmt: skip
    for name, doc, attribute in (
        ("connections_accepted_total", "Client connections accepted so far",
         "connections_accepted"),
        ("connections_refused_total",
         "Client connections closed at once so far: max_connections were open",
         "connections_refused"),
        ("connections_closed_total", "Client connections closed so far", "connections_closed"),
        ("received_bytes_total", "Bytes read from clients so far", "bytes_received"),
        ("sent_bytes_total", "Bytes sent to clients so far (sendfile included)", "bytes_sent"),
    ):  # every Kafka listener's together  # fmt: skip
        value = sum(getattr(server, attribute) for server in servers)
        yield _counter(f"runnel_kafka_{name}", doc, labels, node_id, value)
    yield _gauge(
        "runnel_kafka_fetches_waiting", "Fetches parked for data now", labels, node_id,
        kafka.purgatory.waiting,
    )  # fmt: skip
    memory = kafka.request_memory
    yield _gauge(
        "runnel_kafka_request_memory_used_bytes",
        "Request memory taken from the pool of queued_max_request_bytes now", labels, node_id,
        memory.used_bytes,
    )  # fmt: skip
    yield _counter(
        "runnel_kafka_request_memory_waits_total",
        "Reads paused so far until request memory was given back", labels, node_id,
        memory.waits,
    )  # fmt: skip
    yield _gauge(
        "runnel_kafka_response_buffered_bytes", "Response bytes produced, not yet sent, now",
        labels, node_id, sum(server.buffered_response_bytes() for server in servers),
    )  # fmt: skip
    yield from _request_metrics(kafka, labels, node_id)
    try:
        partitions = kafka.replicas.partitions()
    except RuntimeError:  # the event loop changed the set while this thread walked it
        return
    yield _gauge(
        "runnel_kafka_partitions", "Partition replicas held here", labels, node_id, len(partitions)
    )
    leaders = [p for p in partitions if p.is_leader]
    yield _gauge("runnel_kafka_leaders", "Partitions led here", labels, node_id, len(leaders))
    yield from _replication_metrics(kafka, leaders, labels, node_id)


def _request_metrics(kafka: KafkaBroker, labels: list[str], node_id: str) -> Iterator[Metric]:
    """Requests by listener (summed over the label: all received) and by API key."""
    by_listener = CounterMetricFamily(
        "runnel_kafka_requests_received_total", "Kafka requests received so far, by listener",
        labels=[*labels, "listener"],
    )  # fmt: skip
    for listener, server in kafka.servers.items():
        by_listener.add_metric([node_id, listener], float(server.requests_received))
    yield by_listener
    by_api = CounterMetricFamily(
        "runnel_kafka_requests_served_total",
        "Kafka requests passed to their API's handler so far (unsupported ones not), by API key",
        labels=[*labels, "api_key"],
    )
    counts: Counter[int] = Counter()
    for dispatcher in kafka.dispatchers.values():
        counts.update(dispatcher.requests_by_api)
    for api_key, count in sorted(counts.items()):
        by_api.add_metric([node_id, str(api_key)], float(count))
    yield by_api


def _replication_metrics(
    kafka: KafkaBroker, leaders: list[Partition], labels: list[str], node_id: str
) -> Iterator[Metric]:
    """Kafka's UnderReplicatedPartitions and UnderMinIsrPartitions (of the partitions led
    here), the followers' fetchers, the fetch sessions and the leaders' ISR proposals."""
    under = sum(1 for p in leaders if len(p.isr) < len(p.replicas))
    under_min = sum(1 for p in leaders if len(p.isr) < p.min_insync_replicas)
    sessions = kafka.context.fetch_sessions
    for name, doc, value in (
        ("under_replicated_partitions", "Partitions led here whose ISR lacks a replica", under),
        ("under_min_isr_partitions", "Partitions led here below min.insync.replicas", under_min),
        ("partitions_following", "Partitions this broker fetches as a follower",
         kafka.fetchers.following()),
        ("fetch_sessions", "Fetch sessions (KIP-227) open here now", sessions.size),
        ("fetch_session_partitions", "Partitions cached in fetch sessions now",
         sessions.partitions),
        ("fetch_session_watched_partitions",
         "Partitions followers' fetch sessions watch as quiet now (their fetches skip them)",
         sessions.watched),
    ):  # fmt: skip
        yield _gauge(f"runnel_kafka_{name}", doc, labels, node_id, value)
    yield from _replication_counters(kafka, labels, node_id)


def _replication_counters(kafka: KafkaBroker, labels: list[str], node_id: str) -> Iterator[Metric]:
    """Counts since start-up: a fetcher (one per leader) lives until the broker stops, so
    their sums never go down."""
    fetchers = list(kafka.fetchers.fetchers.values())
    sessions = kafka.context.fetch_sessions
    for name, doc, value in (
        ("replica_fetches_total", "Follower fetches answered so far",
         sum(f.fetches for f in fetchers)),
        ("replica_full_fetches_total",
         "Follower fetches sent in full (opening a fetch session) so far",
         sum(f.full_fetches for f in fetchers)),
        ("replica_fetch_session_errors_total",
         "Follower fetches refused for their session so far",
         sum(f.session_errors for f in fetchers)),
        ("replica_appended_bytes_total", "Bytes appended as a follower so far",
         sum(f.bytes_appended for f in fetchers)),
        ("replica_truncations_total",
         "Follower truncations (diverging epochs, out of range) so far",
         sum(f.truncations for f in fetchers)),
        ("replica_metadata_rests_total",
         "Follower partitions rested briefly so far because the leader's metadata and ours "
         "disagreed", sum(f.metadata_rests for f in fetchers)),
        ("isr_changes_proposed_total", "ISR changes sent to the controller so far",
         kafka.alter_partition.sent),
        ("isr_changes_refused_total", "ISR changes the controller refused so far",
         kafka.alter_partition.refused),
        ("isr_change_requests_total",
         "AlterPartition requests (ISR changes batched) sent so far",
         kafka.alter_partition.requests),
        ("fetch_session_evictions_total", "Fetch sessions evicted to make room so far",
         sessions.evictions),
        ("fetch_session_expirations_total", "Fetch sessions dropped unused so far",
         sessions.expirations),
    ):  # fmt: skip
        yield _counter(f"runnel_kafka_{name}", doc, labels, node_id, value)


def _gauge(name: str, doc: str, labels: list[str], node_id: str, value: float) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(name, doc, labels=labels)
    gauge.add_metric([node_id], float(value))
    return gauge


def _counter(
    name: str, doc: str, labels: list[str], node_id: str, value: float
) -> CounterMetricFamily:
    """``name`` ends in ``_total``: prometheus_client strips it from the family's name and
    puts it on the sample's. A count of bytes ends in ``_bytes_total`` and declares its unit."""
    unit = "bytes" if name.endswith("_bytes_total") else ""
    counter = CounterMetricFamily(name, doc, labels=labels, unit=unit)
    counter.add_metric([node_id], float(value))
    return counter


def serve_metrics(node: RunnelNode, host: str, port: int) -> None:
    """Start the HTTP endpoint (a daemon thread; it reads state the event loop owns, which
    is safe for these plain reads: each value is read whole)."""
    registry = CollectorRegistry()
    registry.register(NodeCollector(node))
    start_http_server(port, addr=host, registry=registry)
