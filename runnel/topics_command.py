"""``runnel topics create|list|describe|delete``: topics, through the active controller.

    runnel topics create NAME [--partitions N] [--replication-factor R] [--config k=v ...]
                              [--validate-only]
    runnel topics list [--json]
    runnel topics describe NAME [--json]
    runnel topics delete NAME
    runnel topics elect [NAME [--partition P ...]] [--unclean]

Every command takes ``--bootstrap HOST:PORT[,HOST:PORT]`` (controller addresses) or, by
default, reaches the local cluster of ``--data-dir`` (see ``admin.py``). The controller
decides and validates (names, counts, replication factor against the unfenced brokers,
configs); an error it returns is printed with its Kafka error code name and message and the
command exits with 1, having changed nothing. Topic ids are shown as Kafka shows them:
URL-safe base64 without padding.

``elect`` is Kafka's ElectLeaders (``kafka-leader-election.sh``): by default a preferred
election (leadership back to each partition's first replica, where it is alive and in the
ISR); with ``--unclean``, a leader for each partition that has none, outside the ISR if no
ISR member is alive (records only the old ISR had are lost: the controller logs it at ERROR),
whatever ``unclean.leader.election.enable`` says. Without NAME, every partition (those that
need nothing are not listed). Each partition's outcome is printed; the command exits with 1
if any partition could not be elected (one that needed no election is not a failure).
"""

from __future__ import annotations

import argparse
import base64
import json
from typing import Any

from runnel.admin import add_target_options, call, error_name, resolve_controllers
from runnel.commands import (
    EXIT_OK,
    CommandError,
    Subparsers,
    UsageError,
    non_negative_int,
    positive_int,
    set_handler,
)

__all__ = ["register"]

CLUSTER_DEFAULT = -1  # CreatableTopic: the controller's num_partitions / replication factor


def register(groups: Subparsers) -> None:
    """Add the ``topics`` command group to the top-level parser."""
    topics = groups.add_parser(
        "topics",
        help="create, list, describe and delete topics",
        description="Manage topics through the cluster's active controller.",
    )
    commands = topics.add_subparsers(dest="topics_command", metavar="COMMAND", required=True)
    _register_create(commands)
    listing = commands.add_parser("list", help="the topics' names")
    listing.add_argument("--json", action="store_true", help="print one JSON array")
    set_handler(listing, _list)
    describe = commands.add_parser("describe", help="a topic's partitions and configs")
    describe.add_argument("name", metavar="NAME")
    describe.add_argument("--json", action="store_true", help="print one JSON object")
    set_handler(describe, _describe)
    delete = commands.add_parser("delete", help="delete a topic")
    delete.add_argument("name", metavar="NAME")
    set_handler(delete, _delete)
    elect = commands.add_parser("elect", help="elect leaders: preferred, or --unclean")
    elect.add_argument("name", metavar="NAME", nargs="?", help="default: every partition")
    elect.add_argument(
        "--partition",
        type=non_negative_int,
        action="append",
        metavar="P",
        help="a partition of NAME (repeatable; default: all of them)",
    )
    elect.add_argument(
        "--unclean",
        action="store_true",
        help="elect partitions without a leader, outside the ISR if need be (loses data)",
    )
    set_handler(elect, _elect)
    for command in (listing, describe, delete, elect):
        add_target_options(command)


def _register_create(commands: Subparsers) -> None:
    create = commands.add_parser("create", help="create a topic")
    create.add_argument("name", metavar="NAME")
    create.add_argument(
        "--partitions",
        type=positive_int,
        default=CLUSTER_DEFAULT,
        metavar="N",
        help="default: the cluster's",
    )
    create.add_argument(
        "--replication-factor",
        type=positive_int,
        default=CLUSTER_DEFAULT,
        metavar="R",
        help="default: the cluster's",
    )
    create.add_argument(
        "--config",
        type=_config_entry,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a topic config (repeat for more), e.g. retention.ms=86400000",
    )
    create.add_argument(
        "--validate-only", action="store_true", help="check the request, create nothing"
    )
    add_target_options(create)
    set_handler(create, _create)


def _config_entry(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"not KEY=VALUE: {text!r}")
    return key.strip(), value


def _create(args: argparse.Namespace) -> int:
    from proto import controller_pb2 as cpb

    topic = cpb.CreatableTopic(
        name=args.name,
        num_partitions=args.partitions,
        replication_factor=args.replication_factor,
        configs=[cpb.ConfigEntry(name=k, value=v) for k, v in args.config],
    )
    request = cpb.CreateTopicsRequest(topics=[topic], validate_only=args.validate_only)
    response = call(resolve_controllers(args), "CreateTopics", request)
    (result,) = response.topics
    _check(result.name, result.error, result.message)
    what = "would create" if args.validate_only else "created"
    print(
        f"{what} topic {result.name} ({result.num_partitions} partitions, replication factor "
        f"{result.replication_factor})"
        + (f", id {topic_id_text(result.topic_id)}" if result.topic_id else "")
    )
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    topics = _describe_topics(args, [])
    if args.json:
        print(json.dumps([_topic_json(t) for t in topics], indent=2))
    else:
        for t in topics:
            print(t.name)
    return EXIT_OK


def _describe(args: argparse.Namespace) -> int:
    (topic,) = _describe_topics(args, [args.name])
    _check(topic.name, topic.error, "no such topic")
    print(json.dumps(_topic_json(topic), indent=2) if args.json else _topic_text(topic))
    return EXIT_OK


def _delete(args: argparse.Namespace) -> int:
    from proto import controller_pb2 as cpb

    request = cpb.DeleteTopicsRequest(names=[args.name])
    response = call(resolve_controllers(args), "DeleteTopics", request)
    (result,) = response.topics
    _check(result.name, result.error, result.message)
    print(f"deleted topic {result.name}")
    return EXIT_OK


def _elect(args: argparse.Namespace) -> int:
    from proto import controller_pb2 as cpb

    if args.partition and args.name is None:
        raise UsageError("--partition needs a topic NAME")
    partitions = []
    if args.name is not None:
        numbers = sorted(set(args.partition or ()))
        if not numbers:
            (topic,) = _describe_topics(args, [args.name])
            _check(topic.name, topic.error, "no such topic")
            numbers = [p.partition_id for p in topic.partitions]
        partitions = [cpb.TopicPartitions(topic=args.name, partitions=numbers)]
    kind = cpb.UNCLEAN if args.unclean else cpb.PREFERRED
    request = cpb.ElectLeadersRequest(partitions=partitions, election_type=kind)
    response = call(resolve_controllers(args), "ElectLeaders", request)
    failed = 0
    for r in response.partitions:
        if r.error == 0:
            outcome = "elected"
        elif r.error == cpb.ELECTION_NOT_NEEDED:
            outcome = f"no election needed ({r.message})"
        else:
            outcome = f"{error_name(r.error)}: {r.message}"
            failed += 1
        print(f"{r.topic}-{r.partition}: {outcome}")
    if not response.partitions:
        print("no partition needed an election")
    if failed:
        raise CommandError(f"{failed} partition(s) not elected")
    return EXIT_OK


def _describe_topics(args: argparse.Namespace, names: list[str]) -> list[Any]:
    from proto import controller_pb2 as cpb

    request = cpb.DescribeTopicsRequest(names=names)
    response = call(resolve_controllers(args), "DescribeTopics", request)
    return list(response.topics)


def _check(name: str, error: int, message: str) -> None:
    if error != 0:
        raise CommandError(f"topic {name!r}: {error_name(error)}: {message}")


# -- output ------------------------------------------------------------------------------------


def topic_id_text(topic_id: bytes) -> str:
    """As Kafka shows a topic id: URL-safe base64 of its 16 bytes, without padding."""
    return base64.urlsafe_b64encode(topic_id).decode().rstrip("=")


def _topic_json(t: Any) -> dict[str, Any]:
    return {
        "name": t.name,
        "topic_id": topic_id_text(t.topic_id),
        "partitions": [
            {
                "partition": p.partition_id,
                "leader": p.leader,
                "leader_epoch": p.leader_epoch,
                "partition_epoch": p.partition_epoch,
                "replicas": list(p.replicas),
                "isr": list(p.isr),
            }
            for p in t.partitions
        ],
        "configs": {c.name: c.value for c in t.configs},
    }


def _topic_text(t: Any) -> str:
    """Kafka's ``kafka-topics --describe`` layout, with the partition epoch added."""
    rf = len(t.partitions[0].replicas) if t.partitions else 0
    configs = ",".join(f"{c.name}={c.value}" for c in t.configs)
    lines = [
        f"Topic: {t.name}\tTopicId: {topic_id_text(t.topic_id)}\tPartitionCount: "
        f"{len(t.partitions)}\tReplicationFactor: {rf}\tConfigs: {configs}"
    ]
    for p in t.partitions:
        lines.append(
            f"\tTopic: {t.name}\tPartition: {p.partition_id}\tLeader: {_leader(p.leader)}"
            f"\tLeaderEpoch: {p.leader_epoch}\tPartitionEpoch: {p.partition_epoch}"
            f"\tReplicas: {_ids(p.replicas)}\tIsr: {_ids(p.isr)}"
        )
    return "\n".join(lines)


def _leader(leader: int) -> str:
    return "none" if leader < 0 else str(leader)


def _ids(ids: Any) -> str:
    return ",".join(map(str, ids))
