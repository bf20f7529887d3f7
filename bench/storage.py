"""Storage engine benchmark: the partition log against raw file I/O on the same disk.

How this works. Every figure is a pair measured in the same run, on the same directory:
the engine doing a job, and the plainest system calls that could do the same job. The ratio
engine/raw is what matters; absolute MB/s swing with the (shared, noisy) machine.

  append    ``Log.append_as_leader`` of one pre-built, uncompressed v2 batch, over and over,
            against ``os.write`` of the same bytes to a plain file. Page-cache durability
            (no fsync), as in Kafka's default. Batches are built once, outside the timing.
            Each side deletes its files when done, so the next write (the other side's)
            goes into memory just freed; an untimed write of the same size first does the
            same for the first round. On this VM memory freed a moment before is far
            cheaper to write into than new memory (docs/performance.md, "Page-cache
            memory"): every timed write meets the cheap kind, not whichever came.
  read      sequential consumer fetches, ``Log.read(offset, 1 MiB)`` and ``os.sendfile`` of
            the returned FileSlice to a loopback TCP socket, against ``os.sendfile`` of the
            same segment files in 1 MiB chunks to the same kind of socket. A separate process
            drains the socket, so its reads do not compete with the sender for the GIL.
  recovery  ``load_log`` after an unclean shutdown with recovery point 0: every batch is
            re-validated and both indexes rebuilt. Raw reference: ``os.pread`` of the same
            files in 8 MiB chunks plus CRC-32C over them, the least a recovery must do.

Each pair runs ``rounds`` times, alternating which side goes first, and the median of each
side is reported, so machine noise hits both. MB = 10**6 bytes, GB = 10**9 bytes.

Usage: ``python -m bench.storage [--quick] [--dir DIR]``. The last line printed is one JSON
object with every figure and the parameters.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c

from bench.common import git_state, work_dir
from storage.config import LogConfig
from storage.loader import load_log
from storage.log import Log
from storage.records import RecordInput, build_batch

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
MB = 1_000_000
GB = 1_000_000_000

APPEND_BATCH_BYTES = (16 * KIB, 64 * KIB, MIB)
LOG_BATCH_BYTES = 16 * KIB  # the log read and recovered: Kafka's default producer batch.size
VALUE_BYTES = 1024
SEGMENT_BYTES = 256 * MIB
FETCH_MAX_BYTES = MIB
RAW_RECOVERY_CHUNK_BYTES = 8 * MIB
DRAIN_BUFFER_BYTES = 4 * MIB
DRAIN_CONNECT_TIMEOUT_S = 60
LEADER_EPOCH = 1
ROUNDS = 5
WARMUP_BYTES = 32 * MIB  # per side, untimed, before the first round
_ACK = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class Params:
    quick: bool
    append_bytes: int  # written per side, per batch size, per round
    log_bytes: int  # size of the log that is recovered and read
    rounds: int


@dataclass(frozen=True, slots=True)
class Batch:
    """A pre-built batch and the number of records (offsets) it holds."""

    data: bytes
    records: int


@dataclass(frozen=True, slots=True)
class Pair:
    """Per-round rates (bytes/s) of the engine and of the raw baseline."""

    runnel: tuple[float, ...]
    raw: tuple[float, ...]

    @property
    def runnel_median(self) -> float:
        return statistics.median(self.runnel)

    @property
    def raw_median(self) -> float:
        return statistics.median(self.raw)

    @property
    def ratio(self) -> float:
        return self.runnel_median / self.raw_median


# --- batches ------------------------------------------------------------------------------


def build_exact_batch(size_bytes: int, now_ms: int) -> Batch:
    """An uncompressed v2 batch of exactly ``size_bytes``: records with 16-byte keys and
    1 KiB values, the last value sized to fill the batch exactly."""
    value = os.urandom(VALUE_BYTES)

    def record(i: int, data: bytes) -> RecordInput:
        return RecordInput(key=b"key-%012d" % i, value=data, timestamp_ms=now_ms)

    one = len(build_batch([record(0, value)]))
    per_record = len(build_batch([record(0, value), record(1, value)])) - one
    count = max(1, (size_bytes - one) // per_record)
    records = [record(i, value) for i in range(count)]
    gap = size_bytes - len(build_batch(records))
    for filler in range(gap, max(gap - 64, -1), -1):
        data = build_batch([*records, record(count, os.urandom(filler))])
        if len(data) == size_bytes:
            return Batch(data, count + 1)
    raise RuntimeError(f"cannot build a batch of exactly {size_bytes} bytes")


def log_config() -> LogConfig:
    """Default settings (page-cache durability) with 256 MiB segments, so long runs roll."""
    return LogConfig(segment_bytes=SEGMENT_BYTES)


# --- append -------------------------------------------------------------------------------


def runnel_append(root: Path, batch: Batch, total_bytes: int) -> float:
    """Bytes/s of ``append_as_leader`` on a fresh log."""
    directory = Path(tempfile.mkdtemp(prefix="append-runnel-", dir=root))
    log = load_log(directory / "bench-0", log_config())
    append = log.append_as_leader
    data = batch.data
    count = total_bytes // len(data)
    os.sync()
    start = time.perf_counter()
    for _ in range(count):
        append(data, LEADER_EPOCH)
    elapsed = time.perf_counter() - start
    log.abandon()  # close() would fsync, which the timing left out for both sides
    shutil.rmtree(directory)
    return count * len(data) / elapsed


def raw_append(root: Path, batch: Batch, total_bytes: int) -> float:
    """Bytes/s of ``os.write`` of the same bytes to a plain file."""
    directory = Path(tempfile.mkdtemp(prefix="append-raw-", dir=root))
    fd = os.open(directory / "raw.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    data = batch.data
    count = total_bytes // len(data)
    write = os.write
    os.sync()
    start = time.perf_counter()
    for _ in range(count):
        if write(fd, data) != len(data):
            raise RuntimeError("short write")
    elapsed = time.perf_counter() - start
    os.close(fd)
    shutil.rmtree(directory)
    return count * len(data) / elapsed


def alternate(rounds: int, runnel: Callable[[], float], raw: Callable[[], float]) -> Pair:
    """Run both sides ``rounds`` times, alternating which goes first."""
    runnel_rates: list[float] = []
    raw_rates: list[float] = []
    for r in range(rounds):
        if r % 2 == 0:
            runnel_rates.append(runnel())
            raw_rates.append(raw())
        else:
            raw_rates.append(raw())
            runnel_rates.append(runnel())
    return Pair(tuple(runnel_rates), tuple(raw_rates))


def bench_append(root: Path, params: Params, now_ms: int) -> dict[int, Pair]:
    warmup = build_exact_batch(APPEND_BATCH_BYTES[0], now_ms)
    runnel_append(root, warmup, WARMUP_BYTES)  # first allocations and imports, untimed
    raw_append(root, warmup, WARMUP_BYTES)
    results: dict[int, Pair] = {}
    for size in APPEND_BATCH_BYTES:
        batch = build_exact_batch(size, now_ms)
        raw_append(root, batch, params.append_bytes)  # untimed: frees as much memory
        results[size] = alternate(
            params.rounds,
            functools.partial(runnel_append, root, batch, params.append_bytes),
            functools.partial(raw_append, root, batch, params.append_bytes),
        )
    return results


# --- recovery -----------------------------------------------------------------------------


def write_log(directory: Path, batch: Batch, total_bytes: int) -> None:
    """Write ``total_bytes`` with the engine, then drop the log without a clean shutdown."""
    log = load_log(directory, log_config())
    for _ in range(total_bytes // len(batch.data)):
        log.append_as_leader(batch.data, LEADER_EPOCH)
    log.abandon()
    os.sync()  # data clean in the page cache, as long after a process crash


def runnel_recover(directory: Path, log_bytes: int) -> float:
    """Bytes/s of an unclean-shutdown load from recovery point 0 (the log is then dropped
    again, so every round recovers everything)."""
    start = time.perf_counter()
    log = load_log(directory, log_config(), had_clean_shutdown=False, recovery_point=0)
    elapsed = time.perf_counter() - start
    if log.size_bytes != log_bytes:
        raise RuntimeError(f"recovered {log.size_bytes} bytes, wrote {log_bytes}")
    log.abandon()
    return log_bytes / elapsed


def raw_recover(paths: Sequence[Path]) -> float:
    """Bytes/s of pread in large chunks plus CRC-32C over every byte."""
    fds = [os.open(path, os.O_RDONLY) for path in paths]
    total = 0
    start = time.perf_counter()
    for fd in fds:
        position = 0
        while chunk := os.pread(fd, RAW_RECOVERY_CHUNK_BYTES, position):
            crc32c.crc32c(chunk)
            position += len(chunk)
        total += position
    elapsed = time.perf_counter() - start
    for fd in fds:
        os.close(fd)
    return total / elapsed


# --- read ---------------------------------------------------------------------------------


def drain(port: int) -> None:
    """Reader process: for each connection, read to EOF into a discard buffer, reply with the
    byte count and wait for the sender to close. A connection carrying nothing ends it."""
    buffer = memoryview(bytearray(DRAIN_BUFFER_BYTES))
    while True:
        with socket.create_connection(("127.0.0.1", port)) as conn:
            total = 0
            while received := conn.recv_into(buffer):
                total += received
            conn.sendall(_ACK.pack(total))
            conn.recv(1)
        if total == 0:
            return


class Drain:
    """A loopback TCP listener whose peer is a :func:`drain` process."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(DRAIN_CONNECT_TIMEOUT_S)  # a dead reader fails, not hangs
        port = self._listener.getsockname()[1]
        self._process = multiprocessing.get_context("spawn").Process(
            target=drain, args=(port,), daemon=True
        )
        self._process.start()

    def timed_send(self, send: Callable[[int], int]) -> tuple[int, float]:
        """(bytes sent, seconds from the first byte sent until the reader has every byte)."""
        conn, _ = self._listener.accept()
        with conn:
            start = time.perf_counter()
            sent = send(conn.fileno())
            conn.shutdown(socket.SHUT_WR)
            (received,) = _ACK.unpack(recv_exactly(conn, _ACK.size))
            elapsed = time.perf_counter() - start
        if received != sent:
            raise RuntimeError(f"sent {sent} bytes, the reader got {received}")
        return sent, elapsed

    def rate(self, send: Callable[[int], int], expected_bytes: int) -> float:
        """Bytes/s of ``send``, which must send exactly ``expected_bytes``."""
        sent, elapsed = self.timed_send(send)
        if sent != expected_bytes:
            raise RuntimeError(f"sent {sent} bytes, expected {expected_bytes}")
        return sent / elapsed

    def close(self) -> None:
        self.timed_send(lambda _: 0)
        self._process.join(timeout=10)
        self._listener.close()


def recv_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise RuntimeError("reader closed the connection early")
        data += chunk
    return data


def sendfile_all(sock_fd: int, file_fd: int, position: int, length: int) -> None:
    while length:
        sent = os.sendfile(sock_fd, file_fd, position, length)
        if sent <= 0:
            raise RuntimeError(f"sendfile sent nothing at position {position}")
        position += sent
        length -= sent


def fetch_all(log: Log, batch: Batch, sock_fd: int) -> int:
    """Consume the log from its start to the high watermark in 1 MiB fetches."""
    offset, end, sent = log.log_start_offset, log.high_watermark, 0
    batch_bytes = len(batch.data)
    while offset < end:
        fetched = log.read(offset, FETCH_MAX_BYTES).slice
        if fetched is None or fetched.length < batch_bytes:
            raise RuntimeError(f"fetch at offset {offset} returned {fetched}")
        sendfile_all(sock_fd, fetched.fd, fetched.position, fetched.length)
        # A consumer continues after the last whole batch; here all batches are equal.
        offset += fetched.length // batch_bytes * batch.records
        sent += fetched.length
    return sent


def sendfile_files(files: Sequence[tuple[int, int]], sock_fd: int) -> int:
    """Send each (fd, size) file whole, in 1 MiB chunks."""
    for fd, size in files:
        for position in range(0, size, FETCH_MAX_BYTES):
            sendfile_all(sock_fd, fd, position, min(FETCH_MAX_BYTES, size - position))
    return sum(size for _, size in files)


def bench_read(log: Log, batch: Batch, rounds: int) -> Pair:
    paths = [segment.log_path for segment in log.segments]
    files = [(os.open(path, os.O_RDONLY), path.stat().st_size) for path in paths]
    log_bytes = sum(size for _, size in files)
    drain_peer = Drain()
    try:
        return alternate(
            rounds,
            lambda: drain_peer.rate(lambda fd: fetch_all(log, batch, fd), log_bytes),
            lambda: drain_peer.rate(lambda fd: sendfile_files(files, fd), log_bytes),
        )
    finally:
        drain_peer.close()
        for fd, _ in files:
            os.close(fd)


# --- the run ------------------------------------------------------------------------------


def bench_log(root: Path, params: Params, now_ms: int) -> tuple[Pair, Pair, int]:
    """Write one log, recover it ``rounds`` times, then read it. Returns (recovery, read,
    segment count)."""
    batch = build_exact_batch(LOG_BATCH_BYTES, now_ms)
    directory = root / "log" / "bench-0"
    write_log(directory, batch, params.log_bytes)
    log_bytes = params.log_bytes // len(batch.data) * len(batch.data)
    paths = sorted(directory.glob("*.log"))
    recovery = alternate(
        params.rounds, lambda: runnel_recover(directory, log_bytes), lambda: raw_recover(paths)
    )
    log = load_log(directory, log_config(), had_clean_shutdown=False, recovery_point=0)
    try:
        log.update_high_watermark(log.log_end_offset)
        read = bench_read(log, batch, params.rounds)
        return recovery, read, len(log.segments)
    finally:
        log.abandon()


def size_label(size: int) -> str:
    return f"{size // MIB} MiB" if size >= MIB else f"{size // KIB} KiB"


def size_key(size: int) -> str:
    return f"{size // MIB}mib" if size >= MIB else f"{size // KIB}kib"


def mb(rate: float) -> float:
    return round(rate / MB, 1)


def report(
    params: Params,
    append: dict[int, Pair],
    recovery: Pair,
    read: Pair,
    segments: int,
    load_at_start: float,
) -> dict[str, Any]:
    """The JSON summary: headline ratios, both sides' medians, samples and parameters."""
    out: dict[str, Any] = {}
    for size, pair in append.items():
        key = size_key(size)
        out[f"append_ratio_{key}"] = round(pair.ratio, 3)
        out[f"append_runnel_mb_per_s_{key}"] = mb(pair.runnel_median)
        out[f"append_raw_mb_per_s_{key}"] = mb(pair.raw_median)
    out["read_ratio"] = round(read.ratio, 3)
    out["read_runnel_mb_per_s"] = mb(read.runnel_median)
    out["read_raw_mb_per_s"] = mb(read.raw_median)
    out["recovery_gb_per_s"] = round(recovery.runnel_median / GB, 3)
    out["recovery_raw_gb_per_s"] = round(recovery.raw_median / GB, 3)
    out["recovery_ratio"] = round(recovery.ratio, 3)
    named = {f"append_{size_key(s)}": p for s, p in append.items()}
    named |= {"read": read, "recovery": recovery}
    out["samples_mb_per_s"] = {
        name: {"runnel": [mb(r) for r in p.runnel], "raw": [mb(r) for r in p.raw]}
        for name, p in named.items()
    }
    out |= {
        "quick": params.quick,
        "rounds": params.rounds,
        "aggregate": "median of alternating rounds",
        "append_bytes": params.append_bytes,
        "log_bytes": params.log_bytes,
        "log_batch_bytes": LOG_BATCH_BYTES,
        "log_segments": segments,
        "segment_bytes": SEGMENT_BYTES,
        "fetch_max_bytes": FETCH_MAX_BYTES,
        "value_bytes": VALUE_BYTES,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "load_average_1m_at_start": round(load_at_start, 2),
    }
    return out | source_version()


def source_version() -> dict[str, Any]:
    """The commit measured, and whether storage/ had uncommitted changes."""
    commit, dirty = git_state("storage")
    return {"git_commit": commit, "storage_uncommitted_changes": dirty}


def print_table(params: Params, append: dict[int, Pair], recovery: Pair, read: Pair) -> None:
    rows: list[tuple[str, Pair, str]] = [
        (
            f"append {size_label(s)} batches",
            p,
            ">= 0.8" if s == MIB else ">= 0.5" if s == 64 * KIB else "-",
        )
        for s, p in append.items()
    ]
    rows.append(("read 1 MiB fetches, sendfile to TCP", read, ">= 0.7"))
    rows.append(("recovery, unclean, from offset 0", recovery, "runnel >= 1000 MB/s"))
    print(f"{'what':<38}{'runnel MB/s':>12}{'raw MB/s':>10}{'ratio':>8}  target")
    for label, pair, target in rows:
        print(
            f"{label:<38}{pair.runnel_median / MB:>12.0f}{pair.raw_median / MB:>10.0f}"
            f"{pair.ratio:>8.2f}  {target}"
        )
    print(
        f"\nmedian of {params.rounds} rounds per side, alternating which side goes first; "
        f"MB = 10^6 bytes.\n"
        f"append: {size_label(params.append_bytes)} per side per round, uncompressed v2 "
        f"batches of 1 KiB values, {size_label(SEGMENT_BYTES)} segments, no fsync "
        f"(page-cache durability); raw = os.write of the same bytes.\n"
        f"recovery and read: a {size_label(params.log_bytes)} log of "
        f"{size_label(LOG_BATCH_BYTES)} batches, synced, so it is clean in the page cache "
        f"(reads come from memory, not disk).\n"
        f"recovery raw = pread in {size_label(RAW_RECOVERY_CHUNK_BYTES)} chunks + CRC-32C; "
        f"read raw = sendfile of the same segment files in 1 MiB chunks; the socket is drained "
        f"by another process."
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.storage", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under a minute")
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "data",
        help="a directory on the disk to measure (a temporary subdirectory is used)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    quick: bool = args.quick
    params = Params(
        quick=quick,
        append_bytes=128 * MIB if quick else 512 * MIB,
        log_bytes=256 * MIB if quick else GIB,
        rounds=ROUNDS,
    )
    now_ms = time.time_ns() // 1_000_000
    load_at_start = os.getloadavg()[0]
    started = time.perf_counter()
    with work_dir(args.dir, "bench-storage-") as root:
        print(
            f"runnel storage benchmark in {root} (quick={quick}, "
            f"load average {load_at_start:.2f} at start)",
            flush=True,
        )
        append = bench_append(root, params, now_ms)
        recovery, read, segments = bench_log(root, params, now_ms)
    print_table(params, append, recovery, read)
    print(f"finished in {time.perf_counter() - started:.1f} s")
    print(json.dumps(report(params, append, recovery, read, segments, load_at_start)))


if __name__ == "__main__":
    main()
