"""``runnel replicas verify``: do all replicas of each partition hold the same batches?

    runnel replicas verify [--topic T] [--json] [--bootstrap HOST:PORT[,...] | --data-dir DIR]

How this works. The active controller names the brokers with their listeners
(DescribeCluster) and every partition with its replicas and leader (DescribeTopics, for one
topic or all); ``replicas_verify.py`` then reads each replica's batch metadata from its
broker (``ReadBatches``, ``proto/replica.proto``) and compares them below the smallest high
watermark, byte for byte above where compaction (which each broker runs on its own) may
have rewritten a replica and by offsets and leader epochs below it (``replica_compare.py``).
One line per partition says ``ok``, ``DIVERGED`` (then one indented line per replica that
differs from the reference: the first differing offset and what differs) or ``NOT CHECKED``
(then why, per replica); a last line sums up. With ``--json``, one JSON object holds the
same.

A partition of which only one replica was read has nothing to compare: its line says so
(``only one replica``) and it is not counted as agreement. With replication factor 1 that is
no problem (exit 0, honestly worded); when other replicas could not be read it is NOT CHECKED.

Exit codes: 0 every replica was read and they all agree (or a partition has a single replica:
nothing to compare); 1 a divergence, or a replica that could not be read (it was not checked,
so nothing is known of it), or the controller could not be asked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from proto import controller_pb2 as cpb
from runnel.admin import add_target_options, call, error_name, resolve_controllers
from runnel.commands import EXIT_OK, EXIT_PROBLEM, CommandError, Subparsers, set_handler
from runnel.replicas_verify import (
    PartitionReport,
    PartitionTarget,
    replica_read_addresses,
    verify_partitions,
)

__all__ = ["register"]


def register(groups: Subparsers) -> None:
    """Add the ``replicas`` command group to the top-level parser."""
    replicas = groups.add_parser(
        "replicas",
        help="compare the replicas of partitions",
        description="Check the partitions' replicas against each other, on their brokers.",
    )
    commands = replicas.add_subparsers(dest="replicas_command", metavar="COMMAND", required=True)
    verify = commands.add_parser(
        "verify",
        help="compare every replica's batches below the high watermark",
        description="Read the batch metadata (offsets, leader epoch, CRC, size) of every "
        "replica of each partition from its broker and compare them below the smallest high "
        "watermark. Exit 1 on any divergence or any replica that could not be read; a partition "
        "with a single replica has nothing to compare (exit 0).",
    )
    verify.add_argument("--topic", metavar="T", help="this topic only (default: every topic)")
    verify.add_argument("--json", action="store_true", help="print one JSON object")
    add_target_options(verify)
    set_handler(verify, _verify)


def _verify(args: argparse.Namespace) -> int:
    targets, brokers = _describe(args)
    reports = asyncio.run(verify_partitions(targets, replica_read_addresses(brokers)))
    print(json.dumps(_as_json(reports), indent=2) if args.json else _as_text(reports))
    return EXIT_OK if all(r.ok for r in reports) else EXIT_PROBLEM


def _describe(args: argparse.Namespace) -> tuple[list[PartitionTarget], list[Any]]:
    """The partitions to verify, and the brokers (DescribeCluster's)."""
    controllers = resolve_controllers(args)
    names = [args.topic] if args.topic is not None else []
    topics = call(controllers, "DescribeTopics", cpb.DescribeTopicsRequest(names=names)).topics
    cluster = call(controllers, "DescribeCluster", cpb.DescribeClusterRequest())
    targets = []
    for topic in topics:
        if topic.error != 0:
            raise CommandError(f"topic {topic.name!r}: {error_name(topic.error)}")
        for p in topic.partitions:
            replicas = tuple(p.replicas)
            target = PartitionTarget(topic.name, topic.topic_id, p.partition_id, replicas, p.leader)
            targets.append(target)
    return targets, list(cluster.brokers)


# -- output ------------------------------------------------------------------------------------


def _as_text(reports: list[PartitionReport]) -> str:
    lines = []
    for r in reports:
        lines.append(_partition_line(r))
        lines.extend(
            f"  replica {d.replica} differs from {d.reference} at offset {d.offset}: {d.detail}"
            for d in r.divergences
        )
        lines.extend(
            f"  replica {b} not checked: {why}" for b, why in sorted(r.not_checked.items())
        )
    lines.append(_summary(reports))
    return "\n".join(lines)


def _partition_line(r: PartitionReport) -> str:
    t = r.target
    name = f"{t.topic}-{t.partition}"
    replicas = ", ".join(f"{b} (leader)" if b == t.leader else str(b) for b in t.replicas)
    status = "DIVERGED" if r.divergences else "NOT CHECKED" if r.not_checked else "ok"
    if r.reference is None:
        return f"{name}: {status}: replicas {replicas}: none could be read"
    if _replicas_read(r) < 2:
        what = "only one replica" if len(t.replicas) == 1 else f"only replica {r.reference} read"
        return f"{name}: {status}: replicas {replicas}; {what}: nothing to compare"
    if r.start_offset >= r.end_offset:
        what = "nothing below the high watermark to compare"
    else:
        what = (
            f"offsets [{r.start_offset}, {r.end_offset}), {_batches(r.batches_compared)} compared"
        )
    if r.compacted_below > r.start_offset and r.start_offset < r.end_offset:
        what += (
            f"; below {r.compacted_below} (compacted by each replica on its own) "
            "by offsets and leader epoch only"
        )
    return f"{name}: {status}: replicas {replicas}; {what}"


def _replicas_read(r: PartitionReport) -> int:
    """How many replicas were read (the reference among them)."""
    return 0 if r.reference is None else len(set(r.target.replicas) - set(r.not_checked))


def _compared(r: PartitionReport) -> int:
    """The batches compared between replicas: none when fewer than two were read."""
    return r.batches_compared if _replicas_read(r) >= 2 else 0


def _summary(reports: list[PartitionReport]) -> str:
    compared = sum(_compared(r) for r in reports)
    diverged = sum(1 for r in reports if r.divergences)
    unchecked = sum(1 for r in reports if r.not_checked)
    alone = sum(1 for r in reports if r.ok and _replicas_read(r) < 2)
    problems = []
    if diverged:
        problems.append(f"{diverged} diverged")
    if unchecked:
        problems.append(f"{unchecked} with replicas not checked")
    if problems:
        outcome = ", ".join(problems)
    elif alone == len(reports):
        outcome = "nothing to compare (only one replica of each partition)"
    else:
        outcome = "all replicas agree"
    if alone and alone < len(reports):
        outcome += f"; {alone} with only one replica, nothing to compare"
    return f"{_count(len(reports), 'partition')} checked, {_batches(compared)} compared: {outcome}"


def _as_json(reports: list[PartitionReport]) -> dict[str, Any]:
    return {
        "ok": all(r.ok for r in reports),
        "partitions_checked": len(reports),
        "batches_compared": sum(_compared(r) for r in reports),
        "partitions": [_partition_json(r) for r in reports],
    }


def _partition_json(r: PartitionReport) -> dict[str, Any]:
    t = r.target
    return {
        "topic": t.topic,
        "partition": t.partition,
        "replicas": list(t.replicas),
        "leader": t.leader,
        "reference": r.reference,
        "ok": r.ok,
        "start_offset": r.start_offset,
        "end_offset": r.end_offset,
        "compacted_below": r.compacted_below,
        "replicas_read": _replicas_read(r),
        "batches_compared": _compared(r),
        "divergences": [
            {
                "reference": d.reference,
                "replica": d.replica,
                "offset": d.offset,
                "fields": list(d.fields),
                "detail": d.detail,
            }
            for d in r.divergences
        ],
        "not_checked": [{"replica": b, "error": why} for b, why in sorted(r.not_checked.items())],
    }


def _batches(n: int) -> str:
    return _count(n, "batch", "batches")


def _count(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
