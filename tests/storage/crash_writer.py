"""Child process for test_crash.py: append to a log until killed, acknowledging each batch.

Usage: ``python crash_writer.py <log dir> <leader epoch>``. Opens the log as after a crash
(unclean, recovering everything), prints ``ready <log end offset>``, then appends forever
with ``fsync_each_append``, printing each batch's last offset once the append returned, so
every printed offset is on disk. The content is a pure function of the offsets
(:func:`batch_size_at`, :func:`value_for`), so the parent can check any survivor.
"""

from __future__ import annotations

import sys
from pathlib import Path

from storage.config import LogConfig
from storage.loader import load_log
from storage.records import RecordInput, build_batch

# Small segments so the writer rolls often; indexes sized to a segment (they never fill).
CONFIG = LogConfig(
    segment_bytes=4096,
    segment_index_bytes=4096,
    index_interval_bytes=256,
    fsync_each_append=True,
    retention_ms=None,
)
TIMESTAMP_MS = 1_700_000_000_000


def batch_size_at(base_offset: int) -> int:
    return 1 + base_offset % 4


def value_for(offset: int) -> bytes:
    return b"value-%d-" % offset + bytes([97 + offset % 26]) * (offset % 61)


def main(directory: Path, epoch: int) -> None:
    log = load_log(directory, CONFIG, had_clean_shutdown=False)
    print("ready", log.log_end_offset, flush=True)
    while True:
        base = log.log_end_offset
        records = [
            RecordInput(None, value_for(base + i), TIMESTAMP_MS + base + i)
            for i in range(batch_size_at(base))
        ]
        info = log.append_as_leader(build_batch(records), leader_epoch=epoch)
        print(info.last_offset, flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
