"""Reaching a cluster's controllers from the command line (``runnel cluster status``,
``runnel topics ...``).

How this works. A command names the controllers with ``--bootstrap HOST:PORT[,HOST:PORT]``
or, by default, takes them from the local cluster saved in ``--data-dir`` (its
``cluster.json``, see ``local_cluster.py``). Only a local cluster tells us the controllers'
node ids; bootstrap addresses get stand-in ids below zero, since ``ControllerClient`` keys
addresses by id and learns the real ids from NOT_CONTROLLER answers.

:func:`call` makes one request through ``ControllerClient`` (which finds the active
controller and retries within its time limit) and turns "no controller answered" and an
error in the response header into ``CommandError`` (exit code 1), naming Kafka's error code.
Per-item errors (one topic of a CreateTopics) are left to the caller.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runnel.commands import CommandError, UsageError
from runnel.local_cluster import ClusterSpec

__all__ = [
    "DEFAULT_DATA_DIR",
    "Controllers",
    "add_target_options",
    "call",
    "error_name",
    "add_data_dir_option",
    "parse_bootstrap",
    "resolve_controllers",
]

DEFAULT_DATA_DIR = Path("data/cluster")
CALL_TIMEOUT_MS = 15_000  # a whole call, retries through elections included
_ADDRESS = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$")


@dataclass(frozen=True, slots=True)
class Controllers:
    """The controllers a command talks to."""

    addresses: dict[int, str]  # node id -> host:port; ids below 0 stand in for unknown ids
    cluster: ClusterSpec | None  # the local cluster they came from, if any

    @property
    def described(self) -> str:
        return ",".join(self.addresses.values())


def add_target_options(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap`` or ``--data-dir``: which cluster a client command talks to."""
    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "--bootstrap",
        metavar="HOST:PORT[,HOST:PORT]",
        help="controller addresses (their controller listener); "
        "default: the local cluster's, from --data-dir",
    )
    add_data_dir_option(target)


def add_data_dir_option(target: argparse._MutuallyExclusiveGroup) -> None:
    """``--data-dir``: the local cluster a command reaches when no address is given."""
    target.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        metavar="DIR",
        help=f"the local cluster's data dir (default: ./{DEFAULT_DATA_DIR})",
    )


def parse_bootstrap(text: str) -> list[str]:
    """``host:port,host:port`` -> the addresses; raises UsageError naming a bad one."""
    addresses = [item.strip() for item in text.split(",") if item.strip()]
    if not addresses:
        raise UsageError("--bootstrap names no address; give HOST:PORT[,HOST:PORT]")
    for address in addresses:
        match = _ADDRESS.match(address)
        if match is None or not 0 < int(match[2]) < 65536:
            raise UsageError(f"--bootstrap: {address!r} is not HOST:PORT")
    return list(dict.fromkeys(addresses))


def resolve_controllers(args: argparse.Namespace) -> Controllers:
    """The controllers named by ``args.bootstrap``, else the local cluster's."""
    if args.bootstrap is not None:
        addresses = parse_bootstrap(args.bootstrap)
        return Controllers({-1 - i: a for i, a in enumerate(addresses)}, None)
    data_dir: Path = args.data_dir
    cluster = ClusterSpec.load(data_dir)
    if cluster is None:
        raise CommandError(
            f"no local cluster in {data_dir.absolute()} (no cluster.json): start one with "
            "`runnel cluster up`, or name the controllers with --bootstrap HOST:PORT"
        )
    return Controllers(cluster.controller_addresses(), cluster)


def error_name(code: int) -> str:
    from proto import controller_pb2 as cpb

    try:
        return cpb.ErrorCode.Name(code)
    except ValueError:
        return f"error {code}"


def call(controllers: Controllers, method: str, request: Any) -> Any:
    """One request to the active controller (``method`` is the RPC's name); returns the
    response. Raises CommandError when no controller answers in time or the response
    header carries an error."""
    response = asyncio.run(_call(controllers, method, request))
    header = response.header
    if header.error != 0:
        raise CommandError(f"{method}: {error_name(header.error)}: {header.message}")
    return response


async def _call(controllers: Controllers, method: str, request: Any) -> Any:
    from controller.client import ControllerClient, ControllerUnavailable, RetryPolicy

    policy = RetryPolicy(timeout_ms=CALL_TIMEOUT_MS, rpc_timeout_ms=3_000)
    client = ControllerClient(controllers.addresses, policy)
    try:
        return await client.call(method, request)
    except ControllerUnavailable as e:
        raise CommandError(
            f"no active controller answered at {controllers.described} within "
            f"{CALL_TIMEOUT_MS // 1000} s: {e}"
        ) from None
    finally:
        await client.close()
