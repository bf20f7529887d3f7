"""The load processes of bench.produce_consume's replication runs, each run as ``python -m
bench.produce_consume_replication_load ROLE ...``: it prints ``ready ...`` when it can take
part and one JSON object as its last line, like the other roles (``produce_consume_procs``).

How this works.

  probe        the failover's producer: one acks=all Produce v9 (one 100-byte record, request
               timeout 5 s) every ``--interval-ms`` to the partition's leader, one in flight.
               The leader comes from a Metadata request to the first broker of ``--brokers``
               that answers (each answer's time and leader are reported too). On any
               error (a refused or broken connection, an error code, a timeout) it waits
               ``--backoff-ms``, asks for metadata again and sends to whichever broker it
               names. It prints ``ready`` at its first acknowledgement,
               and stops ``--stop-after-s`` after its first acknowledgement from a broker
               other than the first leader (or at ``--max-s``). Times are CLOCK_MONOTONIC
               ns, which every process of the machine shares, so the benchmark compares them
               with the moment it sent SIGKILL.
  raw-receive  the catch-up's raw baseline, receiving: listens, prints ``ready PORT``, takes
               one connection and ``recv_into`` + ``os.write``s it into a file (page cache,
               no fsync, as a follower's append), timed from the first byte to the last.
  raw-send     ``os.sendfile``s the given files (a leader's segments), after skipping
               ``--skip-bytes``, to the receiver in 1 MiB chunks, as a leader answers a
               follower's fetch.

Usage: ``python -m bench.produce_consume_replication_load probe --brokers H:P,H:P,H:P --topic
T`` (or ``raw-receive --dir D``, ``raw-send --address H:P --files F [F ...]``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.kafka_load import (
    PRODUCE_VERSION,
    VALUE_BYTES,
    Connection,
    LoadError,
    cpu_s,
)
from bench.produce_consume_cluster import partition_states
from bench.produce_consume_raw import SENDFILE_CHUNK_BYTES, copy_to_file, tune
from broker.protocol import ApiKey, ErrorCode, decode_response
from storage.records import RecordInput, build_batch

__all__ = ["main"]

PROBE_REQUEST_TIMEOUT_MS = 5_000  # the Produce request's timeout_ms
PROBE_SOCKET_TIMEOUT_S = 10.0  # any wait for a broker
RAW_TIMEOUT_S = 60.0


# --- the failover probe ---------------------------------------------------------------------


def _connect(address: str) -> Connection:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=PROBE_SOCKET_TIMEOUT_S)
    conn = Connection(sock)
    sock.settimeout(PROBE_SOCKET_TIMEOUT_S)
    return conn


def find_leader(brokers: Sequence[str], topic: str) -> tuple[int, str]:
    """(leader id, its address) from the first broker that answers Metadata; LoadError if
    none answers or the partition has no leader."""
    problems = []
    for address in brokers:
        try:
            conn = _connect(address)
        except OSError as e:
            problems.append(f"{address}: {e}")
            continue
        try:
            (state,) = partition_states(conn, topic)
            request = {"topics": [], "allow_auto_topic_creation": False}
            nodes = conn.call(ApiKey.METADATA, 12, request).brokers
        except (OSError, LoadError, ValueError) as e:
            problems.append(f"{address}: {e}")
            continue
        finally:
            conn.close()
        where = {b.node_id: f"{b.host}:{b.port}" for b in nodes}
        if state.leader in where:
            return state.leader, where[state.leader]
        problems.append(f"{address}: leader {state.leader} not among the brokers {sorted(where)}")
    raise LoadError("no leader: " + "; ".join(problems))


_BATCH = build_batch([RecordInput(None, os.urandom(VALUE_BYTES), int(time.time() * 1000))])


def produce_one(conn: Connection, topic: str) -> tuple[int, int]:
    """One acks=all write: (error code, base offset)."""
    correlation_id = conn.send_request(
        ApiKey.PRODUCE,
        PRODUCE_VERSION,
        {
            "transactional_id": None,
            "acks": -1,
            "timeout_ms": PROBE_REQUEST_TIMEOUT_MS,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": _BATCH}]}],
        },
    )
    got, response = decode_response(ApiKey.PRODUCE, PRODUCE_VERSION, conn.read_frame())
    if got != correlation_id:
        raise LoadError(f"produce: correlation id {got}, expected {correlation_id}")
    (partition,) = response.responses[0].partition_responses
    return int(partition.error_code), int(partition.base_offset)


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"


class Probe:
    """The probe's state: its connection, and what it has seen."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.brokers: list[str] = args.brokers.split(",")
        self.topic: str = args.topic
        self.conn: Connection | None = None
        self.leader = -1
        self.first_leader: int | None = None
        self.acks: list[tuple[int, int, int]] = []  # (monotonic ns, leader, base offset)
        self.errors: list[tuple[int, int, str]] = []  # (monotonic ns, leader, what)
        self.lookups: list[tuple[int, int]] = []  # (monotonic ns, leader Metadata named)

    def error(self, what: str) -> None:
        self.errors.append((time.monotonic_ns(), self.leader, what))
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def write(self) -> bool:
        """One attempt: True when acknowledged."""
        try:
            if self.conn is None:
                self.leader, address = find_leader(self.brokers, self.topic)
                self.lookups.append((time.monotonic_ns(), self.leader))
                self.conn = _connect(address)
            code, offset = produce_one(self.conn, self.topic)
        except (OSError, LoadError, ValueError) as e:
            self.error(str(e).split(":", 1)[0] if isinstance(e, LoadError) else type(e).__name__)
            return False
        if code != ErrorCode.NONE:
            self.error(_error_name(code))
            return False
        self.acks.append((time.monotonic_ns(), self.leader, offset))
        if self.first_leader is None:
            self.first_leader = self.leader
            print("ready", flush=True)
        return True


def run_probe(args: argparse.Namespace) -> dict[str, Any]:
    probe = Probe(args)
    interval_s, backoff_s = args.interval_ms / 1000, args.backoff_ms / 1000
    cpu0, start = cpu_s(), time.monotonic()
    deadline, stop_at = start + args.max_s, None
    while time.monotonic() < (deadline if stop_at is None else min(deadline, stop_at)):
        sent = time.monotonic()
        if not probe.write():
            time.sleep(backoff_s)
            continue
        if stop_at is None and probe.leader != probe.first_leader:
            stop_at = time.monotonic() + args.stop_after_s
        time.sleep(max(0.0, sent + interval_s - time.monotonic()))
    if probe.conn is not None:
        probe.conn.close()
    return {
        "acks": probe.acks,
        "errors": probe.errors,
        "lookups": probe.lookups,
        "first_leader": probe.first_leader,
        "cpu_s": cpu_s() - cpu0,
    }


# --- the catch-up's raw baseline ----------------------------------------------------------


def run_raw_receive(args: argparse.Namespace) -> dict[str, Any]:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(RAW_TIMEOUT_S)
    print(f"ready {listener.getsockname()[1]}", flush=True)
    path = Path(args.dir) / "raw-catch-up.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        sock = tune(listener.accept()[0], RAW_TIMEOUT_S)
        cpu0 = cpu_s()
        with sock:
            total, first = copy_to_file(sock, fd)
        seconds = time.perf_counter() - first
        cpu = cpu_s() - cpu0
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
        listener.close()
    return {"bytes": total, "seconds": seconds, "cpu_s": cpu}


def run_raw_send(args: argparse.Namespace) -> dict[str, Any]:
    host, port = args.address.rsplit(":", 1)
    sock = tune(socket.create_connection((host, int(port)), timeout=RAW_TIMEOUT_S), RAW_TIMEOUT_S)
    print("ready", flush=True)
    skip, sent = args.skip_bytes, 0
    cpu0, start = cpu_s(), time.perf_counter()
    with sock:
        for name in args.files:
            with open(name, "rb") as file:
                size = os.fstat(file.fileno()).st_size
                offset, skip = min(skip, size), max(0, skip - size)
                while offset < size:
                    n = sock.sendfile(file, offset, min(SENDFILE_CHUNK_BYTES, size - offset))
                    offset, sent = offset + n, sent + n
    return {"bytes": sent, "seconds": time.perf_counter() - start, "cpu_s": cpu_s() - cpu0}


# --- command line ---------------------------------------------------------------------------

ROLES = {"probe": run_probe, "raw-receive": run_raw_receive, "raw-send": run_raw_send}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.produce_consume_replication_load", description=__doc__
    )
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--brokers", help="probe: every broker's HOST:PORT, comma-separated")
    parser.add_argument("--topic")
    parser.add_argument("--interval-ms", type=float, default=10.0)
    parser.add_argument("--backoff-ms", type=float, default=50.0)
    parser.add_argument("--max-s", type=float, default=60.0)
    parser.add_argument("--stop-after-s", type=float, default=1.0)
    parser.add_argument("--dir", default=".")
    parser.add_argument("--address", metavar="HOST:PORT")
    parser.add_argument("--files", nargs="*", default=[])
    parser.add_argument("--skip-bytes", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    print(json.dumps(ROLES[args.role](args)), flush=True)


if __name__ == "__main__":
    try:
        main()
    except (LoadError, OSError) as e:
        print(f"produce_consume_replication_load: {e}", file=sys.stderr)
        sys.exit(1)
