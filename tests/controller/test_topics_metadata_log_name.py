"""CreateTopics of ``__cluster_metadata`` (the metadata log's name) is refused as Kafka's
ControllerApis.createTopics refuses it: INVALID_REQUEST "Creation of internal topic
__cluster_metadata is prohibited.", after the duplicate-name rule and before every other
(it is taken out of the request first: it counts for no partitions and collides with no
name). To the name rules it is a legal name, as to Kafka's Topic.validate."""

from __future__ import annotations

import pytest
from test_topics import DEFAULTS, cluster, ids, topic

from controller.outcome import DecisionError
from controller.topic_names import check_topic_name
from controller.topics import (
    DUPLICATE_NAME,
    TOO_MANY_PARTITIONS,
    TopicLimits,
    create_topics,
)
from proto import controller_pb2 as cpb

NAME = "__cluster_metadata"
PROHIBITED = "Creation of internal topic __cluster_metadata is prohibited."


def test_it_is_a_legal_name() -> None:
    check_topic_name(NAME)  # raises if not


def test_creating_it_is_invalid_request_and_it_takes_no_part_in_the_rest() -> None:
    request = cpb.CreateTopicsRequest(
        topics=[topic(NAME, 9_000), topic("__cluster.metadata", 1, 1), topic("x", 2_000, 1)]
    )
    limits = TopicLimits(max_partitions_per_request=10_000)  # 11,000 with NAME's 9,000
    outcome = create_topics(cluster(), request, DEFAULTS, ids(), 0, limits)
    answers = [(t.name, t.error, t.message) for t in outcome.response.topics]
    assert answers == [
        (NAME, cpb.INVALID_REQUEST, PROHIBITED),
        ("__cluster.metadata", cpb.NONE, ""),  # differs from NAME only by '.': no collision
        ("x", cpb.NONE, ""),
    ]
    assert {r.topic.name for r in outcome.records if r.HasField("topic")} == {
        "__cluster.metadata",
        "x",
    }


def test_validate_only_answers_the_same_and_a_repeat_is_a_duplicate() -> None:
    request = cpb.CreateTopicsRequest(topics=[topic(NAME, 1, 1)], validate_only=True)
    (answer,) = create_topics(cluster(), request, DEFAULTS, ids(), 0).response.topics
    assert (answer.error, answer.message) == (cpb.INVALID_REQUEST, PROHIBITED)
    twice = cpb.CreateTopicsRequest(topics=[topic(NAME, 1, 1), topic(NAME, 1, 1)])
    (answer,) = create_topics(cluster(), twice, DEFAULTS, ids(), 0).response.topics
    assert (answer.error, answer.message) == (cpb.INVALID_REQUEST, DUPLICATE_NAME)


def test_the_whole_request_refusal_still_counts_the_others() -> None:
    request = cpb.CreateTopicsRequest(topics=[topic(NAME, 1, 1), topic("x", 20_000, 1)])
    with pytest.raises(DecisionError) as refused:
        create_topics(cluster(), request, DEFAULTS, ids(), 0)
    assert refused.value.message == TOO_MANY_PARTITIONS
