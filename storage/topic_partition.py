"""Partition identity and the ``<topic>-<partition>`` directory naming Kafka uses."""

from __future__ import annotations

import re
from typing import NamedTuple

_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def dir_name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def __str__(self) -> str:
        return self.dir_name()


def is_legal_topic_name(topic: str) -> bool:
    return bool(_LEGAL_TOPIC.match(topic)) and topic not in (".", "..")


def parse_dir_name(name: str) -> TopicPartition:
    """Invert :meth:`TopicPartition.dir_name`; raises ValueError for other names."""
    topic, sep, partition = name.rpartition("-")
    if not sep or not topic or not partition.isdigit() or not is_legal_topic_name(topic):
        raise ValueError(f"{name!r} is not a <topic>-<partition> directory name")
    return TopicPartition(topic, int(partition))
