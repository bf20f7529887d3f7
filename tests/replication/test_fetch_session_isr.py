"""Follower fetch sessions on real processes (1 controller, 3 brokers: ``cluster.py``): idle
partitions' followers fetch incrementally, naming nothing, and still stay in the ISR for many
times ``replica_lag_time_max_ms``, because the leader fetches every partition of a session
and so hears each follower's position at every fetch.

Each broker's metrics endpoint gives the counts the test reads: a follower's fetches and how
many were full, a leader's ISR proposals and its open fetch sessions.
"""

from __future__ import annotations

import re
import time

import fault_cluster as rc
import pytest

replication_cluster = rc.replication_cluster
Cluster = rc.Cluster

LAG_MS = 1500
WINDOW_LAGS = 4  # how many lag times the ISR is watched for
_SAMPLE = re.compile(r'^runnel_kafka_(\w+)\{node_id="(\d+)"\} (\S+)$', re.MULTILINE)


def metrics(c: Cluster, broker: int) -> dict[str, float]:
    text = c.metrics_text(broker)
    return {name: float(value) for name, _, value in _SAMPLE.findall(text)}


@pytest.mark.slow
@rc.with_settings(broker={"replica_lag_time_max_ms": LAG_MS})
def test_idle_followers_stay_in_the_isr_on_incremental_fetches(
    replication_cluster: Cluster,
) -> None:
    c, topic = replication_cluster, "idle-sessions"
    views = c.create_topic(topic, 3)  # a full ISR; nothing is ever produced
    leaders = {v.leader for v in views}
    # A follower fetches from each leader it follows in one session, opened by a full fetch;
    # a leader holds one session per broker following it.
    followed = {
        b: {v.leader for v in views if b in v.replicas and v.leader != b} for b in rc.BROKERS
    }
    followers = {
        b: {r for v in views if v.leader == b for r in v.replicas if r != b} for b in leaders
    }

    def sessions_opened() -> bool | None:
        now = {b: metrics(c, b) for b in rc.BROKERS}
        full = all(now[b]["replica_full_fetches_total"] >= len(followed[b]) for b in rc.BROKERS)
        held = all(now[b]["fetch_sessions"] >= len(followers[b]) for b in leaders)
        return (full and held) or None

    rc.wait_for("every follower's first (full) fetch to open its session", sessions_opened, 15)
    before = {b: metrics(c, b) for b in rc.BROKERS}
    c.note(f"watching the ISR of {topic} for {WINDOW_LAGS} lag times of {LAG_MS} ms")
    deadline = time.monotonic() + WINDOW_LAGS * LAG_MS / 1000
    watched = 0
    while time.monotonic() < deadline:
        for broker in rc.BROKERS:
            for view in c.partitions(topic, [broker]):
                assert view.isr == rc.BROKERS, f"{view} as {broker} sees it\n{c.story()}"
        watched += 1
        time.sleep(0.2)
    after = {b: metrics(c, b) for b in rc.BROKERS}
    c.note(f"{watched} ISR checks; metrics before {before}, after {after}")
    for broker in rc.BROKERS:
        was, now = before[broker], after[broker]
        assert now["isr_changes_proposed_total"] == was["isr_changes_proposed_total"], broker
        assert now["replica_full_fetches_total"] == was["replica_full_fetches_total"] >= 1, broker
        assert now["replica_fetch_session_errors_total"] == 0, broker
        # Idle: each fetch long-polls replica_fetch_wait_max_ms (500) and comes back empty,
        # and the follower kept fetching, incrementally (no full fetch, above).
        assert now["replica_fetches_total"] > was["replica_fetches_total"], (broker, was, now)
    for leader in leaders:  # a session from each of its partitions' followers
        assert after[leader]["fetch_sessions"] >= 2, (leader, after[leader])
        # ... which watch its idle partitions: two followers of each partition it leads,
        # except those looked at afresh in this very fetch (every second).
        led = sum(1 for v in views if v.leader == leader)
        assert 0 < after[leader]["fetch_session_watched_partitions"] <= 2 * led, after[leader]
