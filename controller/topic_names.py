"""Kafka's topic name rules (Topic.validate), shared by the topic and config decisions.

A name is legal when it is 1 to 249 ASCII letters, digits, '.', '_' and '-', and neither
"." nor "..". ``__cluster_metadata`` (the metadata log's name) keeps the rules: only
CreateTopics refuses it (``controller/topics.py``).
"""

from __future__ import annotations

import re

from controller.outcome import DecisionError
from proto import controller_pb2 as cpb

__all__ = ["MAX_TOPIC_NAME_CHARS", "check_topic_name", "topic_name_problem"]

MAX_TOPIC_NAME_CHARS = 249
_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]+")


def check_topic_name(name: str) -> None:
    """``DecisionError`` (INVALID_TOPIC_EXCEPTION) if ``name`` breaks the rules."""
    problem = topic_name_problem(name)
    if problem:
        raise DecisionError(cpb.INVALID_TOPIC_EXCEPTION, problem)


def topic_name_problem(name: str) -> str:
    """What breaks Kafka's topic name rules in ``name``, or "" if nothing does."""
    if not name:
        return "a topic name cannot be empty"
    if name in (".", ".."):
        return f"a topic cannot be named {name!r}"
    if len(name) > MAX_TOPIC_NAME_CHARS:
        return (
            f"topic name {name[:20]!r}... has {len(name)} characters, "
            f"more than {MAX_TOPIC_NAME_CHARS}"
        )
    if not _LEGAL_NAME.fullmatch(name):
        return (
            f"topic name {name!r} has a character other than ASCII letters, digits, "
            "'.', '_' and '-'"
        )
    return ""
