"""Unclean leader election on real processes (the controller's static
``unclean_leader_election_enable``, or the topic config ``unclean.leader.election.enable``
over a controller that leaves it off): when the last in-sync replica dies, an out-of-sync
replica is elected, loudly, and what only the dead leader had is lost; the old leader comes
back as a follower and truncates its divergent tail, so the replicas agree again.

The followers are paused (SIGSTOP) until the leader shrinks the ISR to itself (the lag time
is 2 s) but not past the session timeout (10 s), so the controller still counts them alive:
the leader's metadata must still list them, unfenced, when it is killed.
Records acknowledged by the leader alone (min.insync.replicas 1) then die with it: the test
checks that they are gone and that everything before them survives, which is what "unclean"
means.
"""

from __future__ import annotations

import re
from typing import Any

import fault_cluster as rc
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

replication_cluster = rc.replication_cluster
CONTROLLER = 1
SESSION_MS = 10_000
LAG_MS = 2_000
# Unclean election left off by the controller (its default); topic configs may allow it.
CONTROLLER_DEFAULT_OFF = rc.with_settings(
    controller={"broker_session_timeout_ms": SESSION_MS},
    broker={"replica_lag_time_max_ms": LAG_MS},
)


def produce(c: Any, topic: str, values: list[str]) -> dict[str, int]:
    """acks=all, each value once; every one must be acknowledged: value -> offset."""
    acked: dict[str, int] = {}
    errors: list[str] = []

    def report(error: Any, message: Any) -> None:
        if error is None:
            acked[message.value().decode()] = message.offset()
        else:
            errors.append(f"{message.value().decode()}: {error.name()}")

    producer = Producer(
        {
            "bootstrap.servers": ",".join(c.address(b) for b in c.live()),
            "acks": "all",
            "enable.idempotence": False,
            "retries": 0,
            "message.timeout.ms": 10_000,
            "logger": rc.NULL_LOGGER,
            "error_cb": lambda _: None,
        }
    )
    for value in values:
        producer.produce(topic, value.encode(), partition=0, on_delivery=report)
    left = producer.flush(30)
    assert left == 0 and not errors and len(acked) == len(values), (left, errors, c.story())
    return acked


@pytest.mark.slow
@rc.with_settings(
    controller={"broker_session_timeout_ms": SESSION_MS, "unclean_leader_election_enable": "true"},
    broker={"replica_lag_time_max_ms": LAG_MS},
)
def test_an_out_of_sync_replica_is_elected_loudly_and_the_old_leader_truncates(
    replication_cluster: Any,
) -> None:
    elected_unclean(replication_cluster, {})


@pytest.mark.slow
@CONTROLLER_DEFAULT_OFF
def test_the_topic_config_enables_unclean_election_over_the_controller_default(
    replication_cluster: Any,
) -> None:
    elected_unclean(replication_cluster, {"unclean.leader.election.enable": "true"})


@pytest.mark.slow
@CONTROLLER_DEFAULT_OFF
def test_allowing_unclean_election_for_an_offline_partition_elects_an_alive_replica(
    replication_cluster: Any,
) -> None:
    """The operator's way out of an offline partition whose out-of-sync replicas are alive:
    set unclean.leader.election.enable on the topic (the controller elects at once)."""
    elected_unclean(replication_cluster, {}, allow_when_offline=True)


def allow_unclean_election(c: Any, topic: str, via: list[int]) -> None:
    resource = ConfigResource(
        "TOPIC",
        topic,
        incremental_configs=[
            ConfigEntry(
                "unclean.leader.election.enable",
                "true",
                incremental_operation=AlterConfigOpType.SET,
            )
        ],
    )
    admin = c.admin(via)  # it must outlive the future
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def kill_the_leader_alone_in_the_isr(
    c: Any, topic: str, leader: int, followers: list[int]
) -> dict[str, int]:
    """Pause the followers until partition 0's ISR is ``leader`` alone (they stay unfenced),
    have it acknowledge records alone (returned: they die with it), kill it and resume the
    followers: the partition then has only out-of-sync replicas alive."""
    for follower in followers:
        c.pause(follower)
    c.wait_partitions(
        f"the ISR down to the leader {leader}",
        topic,
        lambda v: v[0].isr == (leader,),
        SESSION_MS / 1000 - 3,
        via=[leader],
    )
    lost = produce(c, topic, [f"lost-{i}" for i in range(10)])  # on the leader alone
    listed = c.unfenced(leader)
    assert set(followers) <= set(listed), f"followers fenced ({listed} listed)\n{c.story()}"
    c.kill(leader)
    for follower in followers:
        c.resume(follower)
    return lost


def wait_offline(c: Any, topic: str, leader: int, followers: list[int]) -> None:
    c.wait_partitions(
        f"no leader once {leader} is fenced (unclean election not allowed)",
        topic,
        lambda v: v[0].leader == -1,
        SESSION_MS / 1000 + 15,
        via=followers,
    )


def offline_partitions(c: Any, node: int) -> float:
    """The node's ``runnel_metadata_offline_partitions`` (partitions without a leader in its
    image), from its metrics endpoint."""
    text = c.metrics_text(node)
    found = re.search(r"^runnel_metadata_offline_partitions\{[^}]*\} (\S+)$", text, re.MULTILINE)
    assert found is not None, text
    return float(found.group(1))


def elected_unclean(c: Any, configs: dict[str, str], *, allow_when_offline: bool = False) -> None:
    topic = "unclean"
    [view] = c.create_topic(topic, 1, min_insync=1, configs=configs)
    leader = view.leader
    followers = [b for b in view.replicas if b != leader]
    kept = produce(c, topic, [f"kept-{i}" for i in range(10)])
    log_position = c.log_size(CONTROLLER)
    lost = kill_the_leader_alone_in_the_isr(c, topic, leader, followers)
    if allow_when_offline:
        wait_offline(c, topic, leader, followers)
        # the controller's image has it too (the brokers' images came from it)
        assert offline_partitions(c, CONTROLLER) == 1, c.story()
        allow_unclean_election(c, topic, followers)

    views = c.wait_partitions(
        f"an out-of-sync replica elected in place of {leader}",
        topic,
        lambda v: v[0].leader in followers,
        SESSION_MS / 1000 + 15,
        via=followers,
    )
    new = views[0].leader
    rc.wait_for(
        "no offline partition in the controller's metrics",
        lambda: True if offline_partitions(c, CONTROLLER) == 0 else None,
        10,
    )
    said = [
        line for line in c.log_since(CONTROLLER, log_position) if "UNCLEAN LEADER ELECTION" in line
    ]
    assert said and "level=ERROR" in said[0], c.log_excerpt(CONTROLLER)
    c.note(f"unclean election of {new}: {said[0][-160:]}")

    after = produce(c, topic, [f"after-{i}" for i in range(10)])
    c.start(leader)
    c.wait_full_isr(topic, 60)
    hws = c.wait_replicas_caught_up(topic, 1)
    disagreements = c.replica_disagreements(topic, 0, hws[0])
    assert not disagreements, "\n".join(disagreements) + c.story()

    values = [value for _, value in c.read_all(topic, 1)[0]]
    assert values == [*kept, *after], (values, c.story())  # kept in order, lost gone
    assert not set(lost) & set(values)
    assert [after[v] for v in after] == list(range(len(kept), len(kept) + len(after)))
