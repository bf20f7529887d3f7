"""The raw baseline of bench.produce_consume: the produce request stream over a plain loopback
TCP socket into a file, and ``os.sendfile`` of that file back out to a reader.

How this works. Two processes, placed like the broker and the load generator:

  receive  listens, prints ``ready PORT``; takes one connection and ``recv_into`` +
           ``os.write``s everything to a file in ``--dir`` (page cache, no fsync, as the
           broker), answers the byte count (8 bytes) at EOF; then takes a second connection
           and ``os.sendfile``s the file to it in ``SENDFILE_CHUNK_BYTES`` chunks (a
           consumer's 1 MiB partition fetch). Prints one JSON line and exits.
  send     ``sendmsg`` of the very Produce requests the generator sends (same template,
           same sizes), back to back with no responses, until ``--bytes``; shuts its side
           down and waits for the count: that is the write's time. Then connects again and
           reads the file back into a reused buffer: the read's time. Prints one JSON line.

No framing is parsed and nothing is acknowledged per request: the least any broker must do to
take these bytes in and hand them out again.

Usage: ``python -m bench.produce_consume_raw receive --dir DIR`` and ``python -m
bench.produce_consume_raw send --address HOST:PORT --bytes N [--batch-bytes B]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.kafka_load import SOCKET_BUFFER_BYTES, SOCKET_TIMEOUT_S, cpu_s, produce_template
from bench.produce_consume_procs import machine_busy_s

__all__ = ["main"]

RECV_BUFFER_BYTES = 4 << 20
SENDFILE_CHUNK_BYTES = 1 << 20
_COUNT = struct.Struct(">q")


def tune(sock: socket.socket, timeout_s: float = SOCKET_TIMEOUT_S) -> socket.socket:
    """The raw baselines' socket: a timeout on every wait, large kernel buffers."""
    sock.settimeout(timeout_s)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
    return sock


def copy_to_file(sock: socket.socket, fd: int) -> tuple[int, float]:
    """``recv_into`` + ``os.write`` until the peer closes its side: (bytes, perf_counter
    of the first byte, 0.0 if none came)."""
    buffer = bytearray(RECV_BUFFER_BYTES)
    view = memoryview(buffer)
    total, first = 0, 0.0
    while n := sock.recv_into(buffer):
        if not total:
            first = time.perf_counter()
        if os.write(fd, view[:n]) != n:
            raise OSError("short write")
        total += n
    return total, first


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed by the peer")
        data += chunk
    return bytes(data)


def run_receive(args: argparse.Namespace) -> dict[str, Any]:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(SOCKET_TIMEOUT_S)
    print(f"ready {listener.getsockname()[1]}", flush=True)
    path = Path(args.dir) / "raw-produce-stream.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        cpu0, kernel0 = cpu_s(), os.times().system
        received = _receive_to_file(tune(listener.accept()[0]), fd)
        cpu_write, kernel_write = cpu_s() - cpu0, os.times().system - kernel0
        cpu0 = cpu_s()
        _sendfile_out(tune(listener.accept()[0]), fd, received)
        cpu_read = cpu_s() - cpu0
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
        listener.close()
    return {
        "bytes": received,
        "cpu_write_s": cpu_write,
        "cpu_write_kernel_s": kernel_write,
        "cpu_read_s": cpu_read,
    }


def _receive_to_file(sock: socket.socket, fd: int) -> int:
    with sock:
        total, _ = copy_to_file(sock, fd)
        sock.sendall(_COUNT.pack(total))
    return total


def _sendfile_out(sock: socket.socket, fd: int, size: int) -> None:
    with sock, os.fdopen(fd, "rb", closefd=False) as file:
        offset = 0
        while offset < size:  # socket.sendfile waits for room within the socket's timeout
            offset += sock.sendfile(file, offset, min(SENDFILE_CHUNK_BYTES, size - offset))


def run_send(args: argparse.Namespace) -> dict[str, Any]:
    host, port = args.address.rsplit(":", 1)
    template = produce_template(args.topic, args.partitions, args.batch_bytes)
    body = memoryview(template.body)
    requests = max(1, args.bytes // template.wire_bytes)
    sock = tune(socket.create_connection((host, int(port)), timeout=SOCKET_TIMEOUT_S))
    cpu0, busy0, start = cpu_s(), machine_busy_s(), time.perf_counter()
    for i in range(requests):
        head = template.head(i)
        sent = sock.sendmsg((head, body))
        if sent < template.wire_bytes:  # the rest of a partial send
            sock.sendall(b"".join((head, body))[sent:])
    sock.shutdown(socket.SHUT_WR)
    (written,) = _COUNT.unpack(_recv_exactly(sock, _COUNT.size))
    write_s = time.perf_counter() - start
    cpu_write, busy_write = cpu_s() - cpu0, machine_busy_s() - busy0
    sock.close()
    cpu0, busy0 = cpu_s(), machine_busy_s()
    read, read_s = _read_back(host, int(port), written)
    cpu_read, busy_read = cpu_s() - cpu0, machine_busy_s() - busy0
    return {
        "bytes": written,
        "requests": requests,
        "records": requests * template.records,
        "write_s": write_s,
        "read_bytes": read,
        "read_s": read_s,
        "cpu_write_s": cpu_write,
        "cpu_read_s": cpu_read,
        "busy_write_s": busy_write,
        "busy_read_s": busy_read,
    }


def _read_back(host: str, port: int, size: int) -> tuple[int, float]:
    buffer = bytearray(RECV_BUFFER_BYTES)
    start = time.perf_counter()
    total = 0
    with tune(socket.create_connection((host, port), timeout=SOCKET_TIMEOUT_S)) as sock:
        while total < size:
            n = sock.recv_into(buffer)
            if not n:
                break
            total += n
    return total, time.perf_counter() - start


ROLES = {"receive": run_receive, "send": run_send}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.produce_consume_raw", description=__doc__
    )
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--dir", default=".")
    parser.add_argument("--address", metavar="HOST:PORT")
    parser.add_argument("--bytes", type=int, default=1 << 30)
    parser.add_argument("--topic", default="bench")
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--batch-bytes", type=int, default=16_384)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    print(json.dumps(ROLES[args.role](args)), flush=True)


if __name__ == "__main__":
    try:
        main()
    except OSError as e:
        print(f"produce_consume_raw: {e}", file=sys.stderr)
        sys.exit(1)
