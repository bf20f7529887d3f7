"""Prometheus metrics of one node, served over HTTP on ``metrics_port`` (127.0.0.1 only
unless the config's listeners bind elsewhere: the endpoint follows the CONTROLLER or
REPLICATION listener's host).

How this works. Nothing on the hot paths counts anything for metrics: a custom collector
reads the node's current state (Raft role, epoch, high watermark, the image, the broker's
lifecycle state) each time Prometheus scrapes, so a node without a scraper pays nothing. The
image digest is computed per scrape (a pass over the whole image: fine for thousands of
partitions; a large cluster would want it cached per offset).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import start_http_server
from prometheus_client.core import CollectorRegistry, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
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

    def collect(self) -> Iterator[GaugeMetricFamily]:
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


def _gauge(name: str, doc: str, labels: list[str], node_id: str, value: float) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(name, doc, labels=labels)
    gauge.add_metric([node_id], float(value))
    return gauge


def serve_metrics(node: RunnelNode, host: str, port: int) -> None:
    """Start the HTTP endpoint (a daemon thread; it reads state the event loop owns, which
    is safe for these plain reads: each value is read whole)."""
    registry = CollectorRegistry()
    registry.register(NodeCollector(node))
    start_http_server(port, addr=host, registry=registry)
