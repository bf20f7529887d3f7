"""Crash recovery of the partition log on real files.

* A real writer process (crash_writer.py) is SIGKILLed at random moments; every offset it
  acknowledged must survive, with the right content, and the next writer carries on.
* Torn tails, garbage tails and bytes overwritten inside a segment: recovery keeps exactly
  the valid prefix and deletes the segments after the damage.
* Missing or corrupt index files are rebuilt, after a clean shutdown as after a crash.
* Segment files deleted behind the engine's back are reported, never silently wiped.
* Machine crashes that lose unflushed bytes, and the epoch cache across recovery.

Every random choice comes from a seeded RNG whose seed is in the failure message.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import crash_writer
import pytest
from support import FakeClock

from storage.batch import BatchHeader, validate_batch
from storage.checkpoint import OffsetCheckpointFile
from storage.config import LogConfig
from storage.errors import InconsistentLogError
from storage.loader import load_log
from storage.log import Isolation, Log
from storage.log_manager import RECOVERY_POINT_CHECKPOINT, LogManager
from storage.records import RecordInput, build_batch, decode_batch
from storage.topic_partition import TopicPartition

REPO_ROOT = Path(__file__).resolve().parents[2]
WRITER = Path(__file__).resolve().parent / "crash_writer.py"
TIMESTAMP_MS = 1_700_000_000_000
CONFIG = LogConfig(segment_bytes=900, index_interval_bytes=80, retention_ms=None)


def value_for(offset: int) -> bytes:
    return b"v%d." % offset + bytes([65 + offset % 26]) * (offset % 23)


@dataclass(frozen=True, slots=True)
class Written:
    """A batch as the test wrote it."""

    base: int
    epoch: int
    count: int

    @property
    def next(self) -> int:
        return self.base + self.count


def append_batches(log: Log, count: int, *, epoch_every: int = 0) -> list[Written]:
    """Append ``count`` batches of 1-3 records; the epoch grows every ``epoch_every``."""
    written = []
    for i in range(count):
        base = log.log_end_offset
        n = 1 + base % 3
        records = [
            RecordInput(None, value_for(base + j), TIMESTAMP_MS + base + j) for j in range(n)
        ]
        epoch = i // epoch_every if epoch_every else 0
        info = log.append_as_leader(build_batch(records), leader_epoch=epoch)
        assert info.first_offset == base
        written.append(Written(base, epoch, n))
    return written


def read_everything(log: Log) -> list[tuple[int, int, bytes | None, int]]:
    """(offset, epoch, value, batch base) of every record from the log start to the LEO,
    decoding (and so CRC-checking) every batch."""
    out: list[tuple[int, int, bytes | None, int]] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        fetched = log.read(offset, 1 << 20, isolation=Isolation.LOG_END)
        assert fetched.slice is not None, f"nothing to read at {offset} below the LEO"
        buf, pos = fetched.slice.read(), 0
        while pos < len(buf):
            batch = decode_batch(buf, pos)
            epoch = batch.header.partition_leader_epoch
            out += [(r.offset, epoch, r.value, batch.header.base_offset) for r in batch.records]
            pos += batch.header.size_bytes
        offset = out[-1][0] + 1
    return out


def assert_holds_prefix(log: Log, written: list[Written], end: int) -> None:
    """The log holds exactly the written batches below ``end``, contiguous from its start."""
    expected = [b for b in written if b.next <= end]
    assert log.log_end_offset == end == (expected[-1].next if expected else written[0].base)
    records = read_everything(log)
    assert [r[0] for r in records] == list(range(log.log_start_offset, end))
    by_offset = {b.base + j: b for b in expected for j in range(b.count)}
    for offset, epoch, value, base in records:
        assert value == value_for(offset)
        assert (base, epoch) == (by_offset[offset].base, by_offset[offset].epoch)


def layout(directory: Path) -> list[tuple[Path, list[tuple[int, BatchHeader]]]]:
    """Each .log file with the (position, header) of its batches, read straight off disk."""
    out = []
    for path in sorted(directory.glob("*.log")):
        data, pos, batches = path.read_bytes(), 0, []
        while pos < len(data):
            header = validate_batch(data, pos)
            batches.append((pos, header))
            pos += header.size_bytes
        out.append((path, batches))
    return out


def make_template(
    root: Path, batches: int, config: LogConfig = CONFIG
) -> tuple[Path, list[Written]]:
    """A cleanly closed log in ``root/template``, for tests that damage copies of it."""
    directory = root / "template" / "topic-0"
    log = load_log(directory, config, clock=FakeClock())
    written = append_batches(log, batches, epoch_every=7)
    log.close()
    return directory, written


def copy_of(template: Path, root: Path, name: str) -> Path:
    target = root / name / "topic-0"
    shutil.copytree(template, target)
    return target


# -- a real writer process, killed at random --------------------------------------------------


class Writer:
    """crash_writer.py in a child process; stdout is drained by a thread so it never blocks."""

    def __init__(self, directory: Path, epoch: int, stderr_path: Path) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(WRITER.parent)]))
        self.stderr_path = stderr_path
        with stderr_path.open("wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, str(WRITER), str(directory), str(epoch)],
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=REPO_ROOT,
                env=env,
            )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode().strip())

    def wait_for_first_ack(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.lines) < 2:
            if self.proc.poll() is not None:
                raise AssertionError(f"writer exited early:\n{self.stderr_path.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no acknowledgement from the writer in {timeout_s} s")
            time.sleep(0.005)

    def kill(self) -> None:
        """SIGKILL and reap (bounded); returns once every line it printed has been read."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        assert not self._reader.is_alive(), "writer stdout still open after kill"
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def ready_offset(self) -> int | None:
        """The log end offset the writer started from; None if killed before opening it."""
        if not self.lines:
            return None
        word, offset = self.lines[0].split()
        assert word == "ready", self.lines[0]
        return int(offset)

    def acked(self) -> list[int]:
        return [int(line) for line in self.lines[1:]]


def test_sigkilled_writer_loses_no_acknowledged_batch(tmp_path: Path) -> None:
    """Ten writers in turn, each SIGKILLed at a random moment (some while starting up and
    recovering the log, most while appending); after each, the log is recovered here and
    checked against what the writers acknowledged."""
    seed = int(os.environ.get("RUNNEL_CRASH_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    directory = tmp_path / "topic-0"
    epoch_starts: dict[int, int] = {}  # writer i appends with epoch i from this offset on
    log_end = 0
    for iteration in range(10):
        err = tmp_path / f"writer-{iteration}.err"
        writer = Writer(directory, iteration, err)
        try:
            if rng.random() < 0.3:
                time.sleep(rng.uniform(0.0, 0.3))  # perhaps before or during its recovery
            else:
                writer.wait_for_first_ack(timeout_s=30)
                time.sleep(rng.uniform(0.0, 0.12))
        finally:
            writer.kill()
        context = f"seed {seed} (set RUNNEL_CRASH_SEED to replay), writer {iteration}"
        context += f"\nwriter stderr:\n{err.read_text()}"
        assert writer.proc.returncode == -signal.SIGKILL, context
        ready = writer.ready_offset()
        acked = writer.acked()
        assert ready in (None, log_end), context
        assert acked == sorted(acked) and all(a >= log_end for a in acked), context
        if ready is not None:
            epoch_starts[iteration] = ready

        log = load_log(directory, crash_writer.CONFIG, had_clean_shutdown=False)
        try:
            log_end = log.log_end_offset
            assert log_end > max(acked, default=-1), f"acknowledged offset lost; {context}"
            _check_writer_log(log, epoch_starts, context)
        finally:
            log.close()


def _check_writer_log(log: Log, epoch_starts: dict[int, int], context: str) -> None:
    records = read_everything(log)
    assert [r[0] for r in records] == list(range(log.log_end_offset)), context
    for offset, epoch, value, base in records:
        assert value == crash_writer.value_for(offset), (offset, context)
        assert offset - base < crash_writer.batch_size_at(base), (offset, context)
        expected_epoch = max(e for e, start in epoch_starts.items() if start <= base)
        assert epoch == expected_epoch, (offset, context)
    starts = sorted(epoch_starts.items())
    ends = [start for _, start in starts[1:]] + [log.log_end_offset] if starts else []
    for (epoch, start), end in zip(starts, ends, strict=True):
        if start < end:  # the writer got a batch in before it died
            assert log.end_offset_for_epoch(epoch) == (epoch, end), (epoch, context)


# -- torn and garbage tails, damage inside a segment ------------------------------------------


@pytest.mark.parametrize("recover_from_zero", [False, True])
def test_a_torn_last_batch_is_cut_at_every_byte(tmp_path: Path, recover_from_zero: bool) -> None:
    template, written = make_template(tmp_path, 20)
    last_path, batches = layout(template)[-1]
    position, header = batches[-1]
    recovery_point = 0 if recover_from_zero else int(last_path.name[:20])
    for cut in range(position, position + header.size_bytes):
        directory = copy_of(template, tmp_path, f"cut-{cut}")
        os.truncate(directory / last_path.name, cut)
        log = load_log(directory, CONFIG, recovery_point=recovery_point, clock=FakeClock())
        try:
            assert_holds_prefix(log, written, header.base_offset)
            assert (directory / last_path.name).stat().st_size == position
            info = log.append_as_leader(build_batch([RecordInput(None, b"next", 1)]), 9)
            assert info.first_offset == header.base_offset
            assert read_everything(log)[-1][2] == b"next"
        finally:
            log.abandon()
        shutil.rmtree(directory.parent)


@pytest.mark.parametrize("seed", range(6))
def test_garbage_after_the_last_batch_is_cut(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    template, written = make_template(tmp_path, 15)
    last_path, _ = layout(template)[-1]
    size = last_path.stat().st_size
    directory = copy_of(template, tmp_path, "damaged")
    length = rng.randint(1, 300)
    garbage = bytes(length) if seed % 2 else rng.randbytes(length)  # zeros: a preallocated tail
    with (directory / last_path.name).open("ab") as f:
        f.write(garbage)
    log = load_log(directory, CONFIG, recovery_point=0, clock=FakeClock())
    try:
        assert_holds_prefix(log, written, written[-1].next)
        assert (directory / last_path.name).stat().st_size == size, f"seed {seed}"
    finally:
        log.abandon()


# Bytes [0, 8) (base offset) and [12, 16) (partition leader epoch) are outside the CRC in the
# v2 format, so damage there cannot be told from data by any recovery; everything else can.
_UNPROTECTED = set(range(0, 8)) | set(range(12, 16))


@pytest.mark.parametrize("seed", range(25))
def test_bytes_overwritten_inside_a_segment_cut_the_log_at_the_first_damaged_batch(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    template, written = make_template(tmp_path, 40)
    files = layout(template)
    assert len(files) >= 4
    victim = rng.randrange(len(files))
    path, batches = files[victim]
    damaged: list[BatchHeader] = []
    directory = copy_of(template, tmp_path, "damaged")
    data = bytearray(path.read_bytes())
    for _ in range(rng.randint(1, 3)):
        position, header = rng.choice(batches)
        offset_in_batch = rng.choice([i for i in range(header.size_bytes) if i not in _UNPROTECTED])
        data[position + offset_in_batch] ^= rng.randint(1, 255)
        damaged.append(header)
    (directory / path.name).write_bytes(data)
    first_bad = min(damaged, key=lambda h: h.base_offset)
    log = load_log(directory, CONFIG, recovery_point=0, clock=FakeClock())
    context = f"seed {seed}: damaged {sorted(h.base_offset for h in damaged)} in {path.name}"
    try:
        assert_holds_prefix(log, written, first_bad.base_offset)
        survivors = sorted(p.name for p in directory.glob("*.log"))
        assert survivors == [p.name for p, _ in files[: victim + 1]], context
        assert [s.base_offset for s in log.segments] == [int(n[:20]) for n in survivors]
    finally:
        log.abandon()


# -- index files ---------------------------------------------------------------------------


def _offset_index_entries(log: Log) -> dict[int, list[tuple[int, int]]]:
    return {
        s.base_offset: [s.offset_index.entry(n) for n in range(s.offset_index.entries)]
        for s in log.segments
    }


def _assert_lookups_work(log: Log, written: list[Written]) -> None:
    for batch in written:
        for offset in range(batch.base, batch.next):
            fetched = log.read(offset, 1, isolation=Isolation.LOG_END)
            assert fetched.slice is not None
            assert decode_batch(fetched.slice.read()).header.base_offset == batch.base
        # Each batch has a newer timestamp than all before it.
        ts = TIMESTAMP_MS + batch.next - 1
        assert log.offset_for_timestamp(ts) == (batch.base, ts)


def _damage_index(path: Path, how: str, rng: random.Random) -> None:
    size = path.stat().st_size
    if how == "delete":
        path.unlink()
    elif how == "garbage":
        path.write_bytes(rng.randbytes(max(size, 24)))
    elif how == "zeros":
        path.write_bytes(bytes(max(size, 24)))
    elif how == "odd_size":
        path.write_bytes(path.read_bytes() + b"\x01\x02\x03")
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
@pytest.mark.parametrize("suffix", [".index", ".timeindex", "both"])
@pytest.mark.parametrize("how", ["delete", "garbage", "zeros", "odd_size"])
def test_missing_or_corrupt_indexes_are_rebuilt(
    tmp_path: Path, clean: bool, suffix: str, how: str
) -> None:
    rng = random.Random(f"{clean}{suffix}{how}")
    template, written = make_template(tmp_path, 40)
    original = load_log(template, CONFIG, had_clean_shutdown=True, clock=FakeClock())
    expected_entries = _offset_index_entries(original)
    leo = original.log_end_offset
    original.close()
    assert sum(len(e) > 1 for e in expected_entries.values()) >= 3, "indexes too sparse"
    directory = copy_of(template, tmp_path, "damaged")
    bases = sorted(int(p.name[:20]) for p in directory.glob("*.log"))
    for base in (bases[0], bases[len(bases) // 2], bases[-1]):
        for sfx in (".index", ".timeindex") if suffix == "both" else (suffix,):
            _damage_index(directory / f"{base:020d}{sfx}", how, rng)
    log = load_log(
        directory, CONFIG, had_clean_shutdown=clean, recovery_point=leo, clock=FakeClock()
    )
    try:
        assert_holds_prefix(log, written, leo)
        assert _offset_index_entries(log) == expected_entries
        _assert_lookups_work(log, written)
    finally:
        log.abandon()


def test_a_zeroed_time_index_does_not_make_fresh_data_expire(tmp_path: Path) -> None:
    """Zero-filled index files are a classic power-loss artefact (pre-allocated, never
    written back). Trusting one would read the segment's max timestamp as 0 and make time
    retention delete data written a moment ago; the load-time sanity check must reject it."""
    clock = FakeClock()
    config = LogConfig(retention_ms=7 * 24 * 3600 * 1000)
    directory = tmp_path / "topic-0"
    log = load_log(directory, config, clock=clock)
    log.append_as_leader(build_batch([RecordInput(None, b"fresh", clock.now_ms)]), 0)
    log.roll()
    log.append_as_leader(build_batch([RecordInput(None, b"newer", clock.now_ms)]), 0)
    log.update_high_watermark(2)
    log.close()
    time_index = directory / f"{0:020d}.timeindex"
    time_index.write_bytes(bytes(max(time_index.stat().st_size, 12)))
    reopened = load_log(
        directory,
        config,
        recovery_point=2,
        high_watermark=2,
        had_clean_shutdown=True,
        clock=clock,
    )
    try:
        assert reopened.delete_old_segments() == 0
        assert reopened.log_start_offset == 0
    finally:
        reopened.abandon()


# -- files deleted behind the engine's back ---------------------------------------------------


@pytest.mark.parametrize(
    ("clean", "recovery_point"),
    [(True, None), (False, None)],
    ids=["clean", "unclean"],
)
def test_a_deleted_middle_segment_is_reported_not_wiped(
    tmp_path: Path, clean: bool, recovery_point: int | None
) -> None:
    template, written = make_template(tmp_path, 40)
    directory = copy_of(template, tmp_path, "damaged")
    logs = sorted(directory.glob("*.log"))
    assert len(logs) >= 4
    logs[len(logs) // 2].unlink()
    before = {p.name: p.read_bytes() for p in directory.glob("*.log")}
    with pytest.raises(InconsistentLogError, match="missing"):
        load_log(
            directory,
            CONFIG,
            had_clean_shutdown=clean,
            recovery_point=written[-1].next if recovery_point is None else recovery_point,
            log_start_offset=0,
            high_watermark=written[-1].next,
            clock=FakeClock(),
        )
    assert {p.name: p.read_bytes() for p in directory.glob("*.log")} == before


def test_a_gap_above_the_recovery_point_counts_as_lost_unflushed_data(tmp_path: Path) -> None:
    """Above the recovery point nothing is known to be on disk, so a missing middle segment
    there looks exactly like a machine crash that lost a rolled segment's unflushed data.
    Recovery keeps the contiguous prefix and drops what follows the gap (a follower fetches
    it again), rather than refusing to open."""
    template, written = make_template(tmp_path, 40)
    directory = copy_of(template, tmp_path, "damaged")
    logs = sorted(directory.glob("*.log"))
    victim = len(logs) // 2
    logs[victim].unlink()
    gap_start = int(logs[victim].name[:20])
    log = load_log(
        directory,
        CONFIG,
        had_clean_shutdown=False,
        recovery_point=0,
        log_start_offset=0,
        high_watermark=written[-1].next,
        clock=FakeClock(),
    )
    try:
        assert_holds_prefix(log, written, gap_start)
        assert sorted(p.name for p in directory.glob("*.log")) == [p.name for p in logs[:victim]]
    finally:
        log.abandon()


@pytest.mark.parametrize("clean", [True, False], ids=["after-shutdown", "after-crash"])
def test_all_segments_deleted_while_checkpoints_remember_them(tmp_path: Path, clean: bool) -> None:
    data_dir = tmp_path / "data"
    tp = TopicPartition("events", 0)
    manager = LogManager([data_dir], CONFIG, clock=FakeClock())
    manager.startup()
    log = manager.get_or_create_log(tp)
    written = append_batches(log, 30)
    log.update_high_watermark(written[-1].next)
    log.flush()
    if clean:
        manager.shutdown()
    else:
        manager.run_maintenance()  # the periodic checkpoint, then the process dies
        log.abandon()
        manager.release_locks()  # as the process's death does
    partition_dir = data_dir / tp.dir_name()
    for path in partition_dir.glob("*.log"):
        path.unlink()
    survivors = sorted(p.name for p in partition_dir.iterdir())

    restarted = LogManager([data_dir], CONFIG, clock=FakeClock())
    restarted.startup()
    assert data_dir in restarted.offline_dirs, "missing segments went unreported"
    assert "deleted" in restarted.offline_dirs[data_dir]
    assert restarted.get_log(tp) is None
    assert not list(partition_dir.glob("*.log")), "an empty log was created in their place"
    remaining = {p.name for p in partition_dir.iterdir()}
    kept = {n for n in survivors if not n.endswith((".index", ".timeindex"))}  # orphans go
    assert "leader-epoch-checkpoint" in kept <= remaining
    with pytest.raises(InconsistentLogError):
        load_log(
            partition_dir,
            CONFIG,
            recovery_point=written[-1].next,
            log_start_offset=0,
            high_watermark=written[-1].next,
            had_clean_shutdown=clean,
        )


# -- machine crashes and the epoch cache: findings --------------------------------------------


def test_machine_crash_losing_the_unflushed_tail_of_a_rolled_segment(tmp_path: Path) -> None:
    """A roll does not fsync the old segment, so a power loss may drop whole batches at its
    end while the next segment's file survives. That gap lies above the recovery point: it
    is lost unflushed data, not files deleted behind the engine's back, and the log must
    open with every fsynced offset (here: offset 0)."""
    log = load_log(tmp_path / "topic-0", CONFIG, clock=FakeClock())
    written = append_batches(log, 1)
    log.flush()
    durable_size = log.active_segment.size
    written += append_batches(log, 2)
    rolled = log.active_segment.log_path
    log.roll()
    written += append_batches(log, 2)
    recovery_point = log.recovery_point
    log.abandon()
    os.truncate(rolled, durable_size)  # the rolled segment lost both unflushed batches
    reopened = load_log(
        tmp_path / "topic-0",
        CONFIG,
        recovery_point=recovery_point,
        log_start_offset=0,
        high_watermark=0,
        had_clean_shutdown=False,
        clock=FakeClock(),
    )
    try:
        assert_holds_prefix(reopened, written, written[0].next)
    finally:
        reopened.abandon()


def test_a_truncation_checkpoints_its_lower_recovery_point_before_the_log_grows_again(
    tmp_path: Path,
) -> None:
    """A follower truncates below its flushed offsets, then appends again and rolls. The
    recovery-point checkpoint must name the lower point before those appends: with the old
    one on disk, a power loss that drops the unflushed end of the rolled segment (while the
    next file survives) leaves a gap below the checkpointed point, and the directory would
    not load. Found by the replication simulation (seed 10451 of its failovers shape)."""
    tp = TopicPartition("topic", 0)
    manager = LogManager([tmp_path], CONFIG, clock=FakeClock())
    manager.startup()
    log = manager.get_or_create_log(tp)
    written = append_batches(log, 4)
    log.flush()
    manager.checkpoint(tmp_path)  # the recovery point on disk: the end of all four
    log.truncate_to(written[1].base)  # no event loop here: checkpointed at once
    durable_size = log.active_segment.size
    again = written[:1] + append_batches(log, 2)
    rolled = log.active_segment.log_path
    log.roll()
    again += append_batches(log, 2)
    log.abandon()  # the machine crashed: no clean-shutdown marker
    manager.release_locks()  # as the process's death does
    os.truncate(rolled, durable_size)  # and lost the rolled segment's unflushed batches
    reopened = LogManager([tmp_path], CONFIG, clock=FakeClock())
    reopened.startup()
    assert tmp_path not in reopened.offline_dirs, reopened.offline_dirs
    found = reopened.get_log(tp)
    assert found is not None
    assert_holds_prefix(found, again, written[0].next)
    reopened.shutdown()


def test_a_truncation_below_the_high_watermark_checkpoints_the_lower_one(tmp_path: Path) -> None:
    """Only after an unclean election does a follower truncate below its high watermark. It
    then appends the new leader's batches, not committed yet, and crashes before the
    periodic checkpoint: restarted with the old HW on disk (clamped to its log end) it
    would call them committed. The lower HW is checkpointed before the log grows again.
    Found by the replication simulation (seed 41290 of its unclean shape)."""
    tp = TopicPartition("topic", 0)
    manager = LogManager([tmp_path], CONFIG, clock=FakeClock())
    manager.startup()
    log = manager.get_or_create_log(tp)
    written = append_batches(log, 4)
    log.update_high_watermark(written[-1].next)  # all four committed under the old leader
    manager.checkpoint(tmp_path)  # the HW on disk: the end of all four
    assert log.recovery_point < written[1].base  # nothing flushed: only the HW is lowered
    log.truncate_to(written[1].base)  # no event loop here: checkpointed at once
    append_batches(log, 2)  # the new leader's, not committed
    log.abandon()  # the process died: no clean-shutdown marker
    manager.release_locks()
    reopened = LogManager([tmp_path], CONFIG, clock=FakeClock())
    reopened.startup()
    found = reopened.get_log(tp)
    assert found is not None
    assert found.high_watermark == written[1].base
    reopened.shutdown()


def _checkpointed_recovery_point(data_dir: Path) -> int:
    (point,) = OffsetCheckpointFile(data_dir / RECOVERY_POINT_CHECKPOINT).read().values()
    return point


def test_truncations_in_one_event_loop_turn_share_one_checkpoint_at_the_next(
    tmp_path: Path,
) -> None:
    manager = LogManager([tmp_path], CONFIG, clock=FakeClock())
    manager.startup()
    log = manager.get_or_create_log(TopicPartition("topic", 0))
    written = append_batches(log, 4)
    log.flush()
    manager.checkpoint(tmp_path)
    writes: list[Path] = []
    real = manager.checkpoint

    def counted(data_dir: Path, *, include_closed: bool = False) -> None:
        writes.append(data_dir)
        real(data_dir, include_closed=include_closed)

    manager.checkpoint = counted  # type: ignore[method-assign]

    async def main() -> tuple[int, int]:
        log.truncate_to(written[3].base)
        before = _checkpointed_recovery_point(tmp_path)
        log.truncate_to(written[2].base)  # the same turn: one write for both
        await asyncio.sleep(0)
        return before, _checkpointed_recovery_point(tmp_path)

    before, after = asyncio.run(main())
    assert before == written[3].next and after == written[2].base
    assert writes == [tmp_path]
    manager.shutdown()


def test_machine_crash_losing_data_under_the_log_start_offset(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The log start may pass the recovery point (DeleteRecords up to the HW, which does not
    wait for fsync). If the machine then loses the unflushed tail, the log start checkpoint
    lies beyond the log end, yet no file was deleted behind the engine's back: the log must
    open, the records below the log start must stay deleted, and a warning names the
    directory, the log start and the log end found."""
    log = load_log(tmp_path / "topic-0", CONFIG, clock=FakeClock())
    append_batches(log, 1)
    log.flush()
    durable_size = log.active_segment.size
    append_batches(log, 3)
    log.update_high_watermark(log.log_end_offset)
    log.maybe_increment_log_start_offset(log.log_end_offset - 1)
    recovery_point, log_start = log.recovery_point, log.log_start_offset
    high_watermark = log.high_watermark
    path = log.active_segment.log_path
    log.abandon()
    os.truncate(path, durable_size)
    reopened = load_log(
        tmp_path / "topic-0",
        CONFIG,
        recovery_point=recovery_point,
        log_start_offset=log_start,
        high_watermark=high_watermark,
        had_clean_shutdown=False,
        clock=FakeClock(),
    )
    try:
        assert reopened.log_start_offset == log_start
        assert reopened.log_start_offset <= reopened.high_watermark <= reopened.log_end_offset
    finally:
        reopened.abandon()
    found_end = recovery_point  # what survived: the flushed prefix
    said = f"log start offset {log_start} is beyond the log end offset {found_end}"
    [warning] = [r for r in caplog.records if said in r.getMessage()]
    assert warning.levelname == "WARNING"
    assert warning.getMessage().startswith(f"{tmp_path / 'topic-0'}: ")


def test_a_machine_crash_before_the_first_flush_may_take_every_segment(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The HW and log start checkpoints move without a flush, so a power loss before a log's
    first flush can take its segment files while those checkpoints name offsets above 0:
    lost unflushed data, not files deleted behind the engine's back. The log opens empty
    at its log start (its replicas fetch the rest again) and says so."""
    directory = tmp_path / "topic-0"
    log = load_log(directory, CONFIG, clock=FakeClock())
    written = append_batches(log, 5)
    assert log.recovery_point == 0
    log.abandon()
    for path in directory.glob("*.log"):
        path.unlink()
    for log_start in (0, 3):
        reopened = load_log(
            directory,
            CONFIG,
            recovery_point=0,
            log_start_offset=log_start,
            high_watermark=written[-1].next,
            had_clean_shutdown=False,
            clock=FakeClock(),
        )
        try:
            assert (reopened.log_start_offset, reopened.log_end_offset) == (log_start, log_start)
            assert reopened.high_watermark == log_start
        finally:
            reopened.abandon()
        for path in directory.glob("*.log"):
            path.unlink()
    assert "a machine crash lost the log" in caplog.text


def _fsynced_paths(
    monkeypatch: pytest.MonkeyPatch, listings: list[tuple[str, list[int]]] | None = None
) -> list[str]:
    """Record the path behind every os.fsync (the engine fdatasyncs segment data and fsyncs
    directories and checkpoint files); in ``listings``, each directory synced with the base
    offsets of the segment files in it at that moment."""
    synced: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        synced.append(path)
        if listings is not None and os.path.isdir(path):
            bases = sorted(int(p.name[:20]) for p in Path(path).glob("*.log"))
            listings.append((path, bases))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return synced


def test_a_flush_makes_new_segment_files_durable_by_syncing_their_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsync of a file does not make its name durable: a flush that covers a segment created
    since the directory's last fsync syncs the directory too, or a power loss could drop a
    flushed segment whole (below the recovery point: the log could not open). The data
    directory is synced once, for the log directory this process created."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    directory = data_dir / "topic-0"
    log = load_log(directory, CONFIG, clock=FakeClock())
    synced = _fsynced_paths(monkeypatch)

    def syncs_by(step: Callable[[], object]) -> tuple[int, int]:
        """How often ``step`` fsynced (the log directory, the data directory); the epoch
        checkpoint's own writes sync the log directory too, so appends stay out of it."""
        synced.clear()
        step()
        return synced.count(str(directory)), synced.count(str(data_dir))

    try:
        append_batches(log, 3)
        assert syncs_by(log.flush) == (1, 1)
        append_batches(log, 3)
        assert syncs_by(log.flush) == (0, 0), "no new segment file: no directory sync"
        append_batches(log, 2)
        log.roll()
        append_batches(log, 2)
        # as maintenance: the rolled segment's unflushed end, and the new file's name
        assert syncs_by(lambda: log.flush(log.active_segment.base_offset)) == (1, 0)
    finally:
        log.abandon()
    other = directory.parent / "topic-1"  # no epochs or snapshots: their files sync nothing
    empty = load_log(other, CONFIG, clock=FakeClock())
    try:
        empty.flush()
        synced.clear()
        empty.truncate_fully_and_start_at(100)  # the recovery point moves to 100 at once
        assert synced.count(str(other)) == 1, "a full truncation's new file was not synced"
    finally:
        empty.abandon()
    reopened = load_log(directory, CONFIG, clock=FakeClock())
    try:
        append_batches(reopened, 1)
        # after a restart the directory's state is unknown: synced once
        assert syncs_by(reopened.flush) == (1, 0)
    finally:
        reopened.abandon()


def test_a_roll_makes_the_older_segment_names_durable_before_creating_a_newer_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Otherwise a file system that commits directory changes out of order could keep a new
    segment and lose an older one in a power loss, and the log would reopen with offsets
    missing below its start or in its middle. A roll writes a producer snapshot, whose
    fsync of the directory does it (``Log._roll`` counts on that)."""
    directory = tmp_path / "topic-0"
    log = load_log(directory, CONFIG, clock=FakeClock())
    listings: list[tuple[str, list[int]]] = []
    _fsynced_paths(monkeypatch, listings)

    def syncs_by(step: Callable[[], object]) -> list[list[int]]:
        """The log directory's fsyncs during ``step``, each with the segments it held (the
        epoch checkpoint's writes sync it too, so appends stay out of this)."""
        listings.clear()
        step()
        return [bases for path, bases in listings if path == str(directory)]

    try:
        append_batches(log, 1)
        first = log.log_end_offset
        assert syncs_by(log.roll) == [[0]]  # the producer snapshot's, before segment 1
        append_batches(log, 1)
        assert syncs_by(log.roll) == [[0, first]]
        assert syncs_by(log.roll) == []  # the active segment is empty: no roll at all
    finally:
        log.abandon()


def test_recovery_syncs_the_directory_before_moving_the_recovery_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crashed process may never have synced its newest segments' names; recovery fsyncs
    their data and moves the recovery point to the log end, so it syncs the names too."""
    directory = tmp_path / "topic-0"
    log = load_log(directory, CONFIG, clock=FakeClock())
    append_batches(log, 2)
    log.roll()
    append_batches(log, 2)
    end = log.log_end_offset
    log.abandon()
    synced = _fsynced_paths(monkeypatch)
    reopened = load_log(directory, CONFIG, had_clean_shutdown=False, clock=FakeClock())
    try:
        assert reopened.recovery_point == reopened.log_end_offset == end
        assert str(directory) in synced
    finally:
        reopened.abandon()


def _epoch_log(directory: Path) -> tuple[Log, list[Written]]:
    """Epoch 0 at offsets 0-5, epoch 1 from 6, epoch 2 from 12, segments cut inside epochs."""
    log = load_log(directory, LogConfig(retention_ms=None), clock=FakeClock())
    written: list[Written] = []
    for epoch, count in ((0, 6), (1, 6), (2, 3)):
        for _ in range(count):
            base = log.log_end_offset
            batch = build_batch([RecordInput(None, value_for(base), TIMESTAMP_MS + base)])
            log.append_as_leader(batch, leader_epoch=epoch)
            written.append(Written(base, epoch, 1))
            if base in (3, 9):
                log.roll()  # segments at 0, 4 and 10: each starts inside an epoch
    assert [s.base_offset for s in log.segments] == [0, 4, 10]
    return log, written


def test_recovery_from_the_middle_of_an_epoch_keeps_the_epoch_cache(tmp_path: Path) -> None:
    """Unclean recovery replays the batches from the segment holding the recovery point.
    The first one it replays belongs to an epoch that started earlier; re-assigning that
    epoch at the replayed offset must not move the epoch's start (Kafka's recover only
    assigns epochs above the cache's latest)."""
    log, written = _epoch_log(tmp_path / "topic-0")
    log.flush()  # recovery will start at segment 10, inside epoch 1 (which started at 6)
    log.append_as_leader(build_batch([RecordInput(None, value_for(15), TIMESTAMP_MS)]), 2)
    written.append(Written(15, 2, 1))
    recovery_point = log.recovery_point
    log.abandon()
    reopened = load_log(
        tmp_path / "topic-0",
        LogConfig(retention_ms=None),
        recovery_point=recovery_point,
        had_clean_shutdown=False,
        clock=FakeClock(),
    )
    try:
        assert_holds_prefix(reopened, written, 16)
        entries = [(e.epoch, e.start_offset) for e in reopened.epoch_cache.entries()]
        assert entries == [(0, 0), (1, 6), (2, 12)]
        assert reopened.end_offset_for_epoch(0) == (0, 6)  # a follower truncates here
    finally:
        reopened.abandon()


def test_an_index_rebuild_after_a_clean_shutdown_keeps_the_epoch_cache(tmp_path: Path) -> None:
    """A clean start rebuilds only the segments whose indexes are missing; replaying one in
    the middle of the log must leave the epochs of the other segments alone."""
    log, written = _epoch_log(tmp_path / "topic-0")
    log.close()
    (tmp_path / "topic-0" / f"{4:020d}.index").unlink()
    reopened = load_log(
        tmp_path / "topic-0",
        LogConfig(retention_ms=None),
        recovery_point=15,
        had_clean_shutdown=True,
        clock=FakeClock(),
    )
    try:
        assert_holds_prefix(reopened, written, 15)
        entries = [(e.epoch, e.start_offset) for e in reopened.epoch_cache.entries()]
        assert entries == [(0, 0), (1, 6), (2, 12)]
        for epoch, answer in {0: (0, 6), 1: (1, 12), 2: (2, 15)}.items():
            assert reopened.end_offset_for_epoch(epoch) == answer
    finally:
        reopened.abandon()


def test_recovery_of_a_segment_whose_index_filled_up_after_a_truncation(tmp_path: Path) -> None:
    """Live appends count index-interval bytes from the last truncation or reopen, recovery
    from the segment start, so a rebuilt index can need more entries than the live one had.
    With an index that filled up (and made the segment roll) recovery must still open the
    log instead of failing an invariant."""
    config = LogConfig(segment_index_bytes=48, index_interval_bytes=0, retention_ms=None)
    log = load_log(tmp_path / "topic-0", config, clock=FakeClock())
    written = append_batches(log, 3)
    log.truncate_to(written[-1].base)
    written = written[:-1] + append_batches(log, 3)
    recovery_point = log.recovery_point
    log.abandon()
    reopened = load_log(
        tmp_path / "topic-0",
        config,
        recovery_point=recovery_point,
        had_clean_shutdown=False,
        clock=FakeClock(),
    )
    try:
        assert_holds_prefix(reopened, written, written[-1].next)
    finally:
        reopened.abandon()
