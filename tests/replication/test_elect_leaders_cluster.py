"""ElectLeaders (Kafka API 43) from confluent-kafka's ``AdminClient.elect_leaders`` on real
processes, as an operator uses it (``kafka-leader-election.sh`` sends the same request):

* PREFERRED hands a partition back to its first replica once leadership moved away from it
  (the controller's own rebalancing is off here, so only the request moves it), and the
  broker asked answers once its own metadata shows the move;
* UNCLEAN brings back an offline partition whose last in-sync replica died while an
  out-of-sync one is alive, with ``unclean.leader.election.enable`` left off everywhere:
  the request is the operator's explicit choice to lose what only the dead leader had, as
  in Kafka. The controller logs it at ERROR (``UNCLEAN LEADER ELECTION``) as every unclean
  election, and the records acknowledged by the dead leader alone are gone.

A partition that needs no election is answered ELECTION_NOT_NEEDED, for either type.
"""

from __future__ import annotations

from typing import Any

import fault_cluster as rc
import pytest
from confluent_kafka import ElectionType, KafkaError, TopicPartition
from test_unclean_election_cluster import (
    CONTROLLER_DEFAULT_OFF,
    kill_the_leader_alone_in_the_isr,
    produce,
    wait_offline,
)

replication_cluster = rc.replication_cluster
CONTROLLER = 1
ELECT_TIMEOUT_S = 30  # one elect_leaders round trip (milliseconds here), generous


def elect(c: Any, via: int, election: ElectionType, topic: str | None) -> dict[Any, Any]:
    """elect_leaders for partition 0 of ``topic`` (None: every partition), asked of broker
    ``via`` alone: its answer, partition -> None (elected) or its KafkaError."""
    admin = c.admin([via])  # it must outlive the future
    partitions = None if topic is None else [TopicPartition(topic, 0)]
    # (no request_timeout: confluent-kafka 2.16.1 raises SystemError for it)
    future = admin.elect_leaders(election, partitions)
    answer = future.result(timeout=ELECT_TIMEOUT_S)
    c.note(f"elect_leaders {election.name} {topic or 'every partition'} via {via}: {answer}")
    return {(tp.topic, tp.partition): error for tp, error in answer.items()}


def not_needed(answer: dict[Any, Any], topic: str) -> bool:
    error = answer[(topic, 0)]
    return error is not None and error.code() == KafkaError.ELECTION_NOT_NEEDED


@pytest.mark.slow
@rc.with_settings(controller={"auto_leader_rebalance_enable": "false"})
def test_preferred_election_hands_leadership_back_to_the_first_replica(
    replication_cluster: Any,
) -> None:
    c = replication_cluster
    topic = "preferred"
    [view] = c.create_topic(topic, 1)
    preferred = view.replicas[0]
    assert view.leader == preferred, view
    assert not_needed(elect(c, preferred, ElectionType.PREFERRED, topic), topic)

    c.kill(preferred)
    moved_to = rc.wait_new_leader(c, topic, 0, preferred, c.session_s + 15)
    c.start(preferred)
    c.wait_full_isr(topic, 60)
    assert c.partition(topic, 0).leader == moved_to  # nothing moves it back but the request

    asked = moved_to  # any broker forwards it; this one sees the move before answering
    assert elect(c, asked, ElectionType.PREFERRED, topic) == {(topic, 0): None}
    assert c.partition(topic, 0, via=[asked]).leader == preferred
    c.wait_partitions(
        f"{topic}-0 led by {preferred} everywhere", topic, lambda v: v[0].leader == preferred, 15
    )
    assert not_needed(elect(c, asked, ElectionType.PREFERRED, topic), topic)
    assert elect(c, asked, ElectionType.PREFERRED, None) == {}  # every one led: none listed


@pytest.mark.slow
@CONTROLLER_DEFAULT_OFF
def test_unclean_election_brings_back_an_offline_partition_with_unclean_election_off(
    replication_cluster: Any,
) -> None:
    c = replication_cluster
    topic = "offline"
    [view] = c.create_topic(topic, 1, min_insync=1)
    leader = view.leader
    followers = [b for b in view.replicas if b != leader]
    kept = produce(c, topic, [f"kept-{i}" for i in range(10)])
    assert not_needed(elect(c, leader, ElectionType.UNCLEAN, topic), topic)

    lost = kill_the_leader_alone_in_the_isr(c, topic, leader, followers)
    wait_offline(c, topic, leader, followers)
    log_position = c.log_size(CONTROLLER)

    asked = followers[0]
    assert elect(c, asked, ElectionType.UNCLEAN, topic) == {(topic, 0): None}
    new = c.partition(topic, 0, via=[asked]).leader
    assert new in followers, new
    said = [
        line for line in c.log_since(CONTROLLER, log_position) if "UNCLEAN LEADER ELECTION" in line
    ]
    assert said and "level=ERROR" in said[0], c.log_excerpt(CONTROLLER)
    assert not_needed(elect(c, asked, ElectionType.UNCLEAN, topic), topic)

    values = [value for _, value in c.read_all(topic, 1)[0]]
    assert values == list(kept), (values, c.story())  # what only the dead leader had is gone
    assert not set(lost) & set(values)
