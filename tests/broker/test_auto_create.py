"""auto_create_topics_enable on a real cluster: a producer's Metadata request for an unknown
topic creates it (through the active controller, with the controller's defaults), and the
records arrive. Off by default: the other cluster tests see UNKNOWN_TOPIC_OR_PARTITION."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from test_local_cluster import COMMAND_TIMEOUT_S, REPO, Cluster, cluster

__all__ = ["cluster"]  # the fixture

pytestmark = pytest.mark.slow
WAIT_S = 30


def test_a_producer_creates_an_unknown_topic_when_auto_create_is_on(cluster: Cluster) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RUNNEL_BROKER__AUTO_CREATE_TOPICS_ENABLE": "true",  # the nodes inherit it
    }
    up = subprocess.run(
        [sys.executable, "-m", "runnel", "cluster", "up", "--once", "--controllers", "1",
         "--brokers", "1", "--base-port", str(cluster.base_port), "--data-dir",
         str(cluster.data_dir)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    match = re.search(r"^bootstrap: (\S+)", up.stdout, re.MULTILINE)
    assert match is not None, up.stdout
    bootstrap = match[1]

    producer = KafkaProducer(bootstrap_servers=bootstrap, max_block_ms=WAIT_S * 1000)
    try:
        stored = producer.send("made-on-demand", b"first").get(timeout=WAIT_S)
    finally:
        producer.close()
    assert (stored.topic, stored.partition, stored.offset) == ("made-on-demand", 0, 0)

    described = cluster.describe("made-on-demand")
    assert [p["partition"] for p in described["partitions"]] == [0]  # the controller's default

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=WAIT_S * 1000)
    try:
        consumer.assign([TopicPartition("made-on-demand", 0)])
        consumer.seek(TopicPartition("made-on-demand", 0), 0)
        assert next(iter(consumer)).value == b"first"
    finally:
        consumer.close()
    assert "stopped" in cluster.ok("cluster", "down")
