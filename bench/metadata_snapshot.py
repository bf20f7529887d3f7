"""bench.metadata's snapshot figures: size, load time and the loaded image's memory, measured in
a fresh process.

How this works. ``measure_snapshot(path)`` runs ``python -m bench.metadata --measure-snapshot
PATH``, which calls ``measure_file`` and prints one JSON line. That process reads the file
(the Raft snapshot header, raft/snapshots.py, around the image's container of records,
controller/records.py), then, in this order:

  1. the cold load: ``decode_snapshot`` once (the first in the process, as for a broker that
     just started), with the resident set size (/proc/self/statm) before and after;
  2. three more loads (each image dropped and collected first), and, as the raw baseline,
     three ``unpack_snapshot`` calls: parse and CRC-check the records without building an
     image;
  3. ``encode_snapshot`` of the image: what a node pays each time it takes a snapshot;
  4. one more load under ``tracemalloc``: the bytes still allocated afterwards are the image
     (the file's bytes were allocated before tracing started).

RSS counts what the allocator took from the OS (pymalloc keeps arenas), tracemalloc what
Python objects hold; the first is the one a machine feels, the second the one to compare.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench.metadata_figures import MEASURE_TIMEOUT_S, REPO, Distribution, SnapshotFigures
from controller.image import decode_snapshot, encode_snapshot
from controller.records import unpack_snapshot
from raft import snapshots
from raft.snapshots import SUFFIX

LOADS = 3


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure_file(path: Path) -> dict[str, Any]:
    """The figures of one snapshot file (module doc), as plain JSON values."""
    payload = snapshots.decode(path.read_bytes(), path.name)
    gc.collect()
    rss_before = _rss_bytes()
    started = time.perf_counter()
    image = decode_snapshot(payload)
    cold_s = time.perf_counter() - started
    gc.collect()
    rss_delta = _rss_bytes() - rss_before
    figures: dict[str, Any] = {"topics": len(image.topics), "image_offset": image.offset}
    figures |= {"partitions": image.partition_count(), "cold_load_s": cold_s}
    figures["rss_delta_bytes"] = rss_delta
    started = time.perf_counter()
    encode_snapshot(image)
    encode_s = time.perf_counter() - started
    loads = []
    for _ in range(LOADS):
        del image
        gc.collect()
        started = time.perf_counter()
        image = decode_snapshot(payload)
        loads.append(time.perf_counter() - started)
    del image
    gc.collect()
    parses = [_timed(lambda: unpack_snapshot(payload)) for _ in range(LOADS)]
    figures |= {"load_s": loads, "parse_s": statistics.median(parses), "encode_s": encode_s}
    figures["traced_bytes"] = _traced_load(payload)
    return figures


def _traced_load(payload: bytes) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        image = decode_snapshot(payload)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del image
    return after - before


def snapshot_end_offset(path: Path) -> int:
    """The end offset a snapshot file's name starts with (raft/snapshots.py)."""
    return int(path.name.removesuffix(SUFFIX).split("-")[0])


def measure_snapshot(path: Path) -> SnapshotFigures:
    """``measure_file`` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "bench.metadata", "--measure-snapshot", str(path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=MEASURE_TIMEOUT_S,
        check=True,
    )
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    return SnapshotFigures(
        file_name=path.name,
        size_bytes=path.stat().st_size,
        end_offset=snapshot_end_offset(path),
        image_offset=raw["image_offset"],
        topics=raw["topics"],
        partitions=raw["partitions"],
        cold_load_s=raw["cold_load_s"],
        load_s=Distribution(tuple(raw["load_s"])),
        parse_s=raw["parse_s"],
        encode_s=raw["encode_s"],
        rss_delta_bytes=raw["rss_delta_bytes"],
        traced_bytes=raw["traced_bytes"],
    )
