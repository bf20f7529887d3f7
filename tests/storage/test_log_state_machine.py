"""Model-based test of the partition log: Hypothesis drives a real Log on real files through
appends, reads, truncations, rolls, retention, flushes, clean restarts and crashes, and
compares it after every step with a small in-memory model.

The model is a list of batches (base offset, leader epoch, values) since the last full
truncation, plus the log start offset, high watermark, log end offset and the durable offset
(everything below it has been fsynced). Segment layout is the engine's business: the model
reads it only to choose where a simulated machine crash may cut the active segment.

Two crash flavours:
  * a process crash: the page cache survives, so every appended byte must come back;
  * a machine crash: bytes of the active segment past its fsynced size may be lost, so the
    log must come back as a prefix of the model that still holds every durable offset.
"""

from __future__ import annotations

import itertools
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from support import FakeClock

from storage.batch import LOG_OVERHEAD
from storage.config import LogConfig
from storage.errors import (
    InvalidRecordError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
)
from storage.loader import load_log
from storage.log import Isolation, Log
from storage.records import DecodedBatch, RecordInput, build_batch, decode_batch

values_strategy = st.binary(max_size=30)
batch_strategy = st.lists(values_strategy, min_size=1, max_size=5)
append_strategy = st.lists(batch_strategy, min_size=1, max_size=3)


@dataclass(frozen=True, slots=True)
class ModelBatch:
    base: int
    epoch: int
    values: tuple[bytes, ...]

    @property
    def last(self) -> int:
        return self.base + len(self.values) - 1

    @property
    def next(self) -> int:
        return self.base + len(self.values)


@dataclass
class Model:
    """What the log must hold. ``batches`` may start below ``log_start`` (not yet deleted)."""

    batches: list[ModelBatch]
    log_start: int = 0
    hw: int = 0
    leo: int = 0
    durable: int = 0  # the recovery point: every offset below it has been fsynced
    max_epoch: int = 0  # leader epochs only ever grow

    def batch_holding(self, offset: int) -> ModelBatch:
        for batch in self.batches:
            if batch.base <= offset <= batch.last:
                return batch
        raise AssertionError(f"model holds no batch with offset {offset}")

    def cut_to(self, offset: int) -> None:
        """Forget every batch with an offset at or above ``offset`` (a batch boundary)."""
        self.batches = [b for b in self.batches if b.last < offset]
        self.leo = offset
        self.hw = min(self.hw, offset)
        self.durable = min(self.durable, offset)

    def epoch_ends(self) -> dict[int, int]:
        """For each epoch with a batch in [log start, LEO): the offset where it ended."""
        ends: dict[int, int] = {}
        for batch in self.batches:
            if batch.last >= self.log_start:
                ends[batch.epoch] = batch.next
        return ends


@dataclass(frozen=True, slots=True)
class Checkpoints:
    """The offsets the LogManager checkpoints and passes back to ``load_log``."""

    recovery_point: int
    log_start_offset: int
    high_watermark: int


def _complete_batches(buf: bytes) -> list[DecodedBatch]:
    """Decode the whole batches in a read slice; a slice may end inside the last one."""
    out, pos = [], 0
    while len(buf) - pos >= LOG_OVERHEAD:
        size = int.from_bytes(buf[pos + 8 : pos + 12], "big") + LOG_OVERHEAD
        if pos + size > len(buf):
            break
        out.append(decode_batch(buf, pos))
        pos += size
    return out


class LogMachine(RuleBasedStateMachine):
    def __init__(self, root: Path) -> None:
        super().__init__()
        self.dir = root / "topic-0"
        shutil.rmtree(self.dir, ignore_errors=True)
        self.clock = FakeClock()
        self.model = Model([])
        self.config = LogConfig()
        self.log: Log | None = None

    # -- set-up and helpers ----------------------------------------------------------------
    @initialize(
        segment_bytes=st.integers(400, 2000),
        index_interval_bytes=st.integers(0, 300),
        retention_bytes=st.none() | st.integers(0, 3000),
        fsync_each_append=st.booleans(),
        segment_index_bytes=st.sampled_from([24, 48, 96, 10 * 1024 * 1024]),
    )
    def open(
        self,
        segment_bytes: int,
        index_interval_bytes: int,
        retention_bytes: int | None,
        fsync_each_append: bool,
        segment_index_bytes: int,
    ) -> None:
        # Tiny indexes fill up, which rolls segments and makes recovery index sparsely.
        self.config = LogConfig(
            segment_bytes=segment_bytes,
            index_interval_bytes=index_interval_bytes,
            segment_index_bytes=segment_index_bytes,
            retention_bytes=retention_bytes,
            retention_ms=None,
            fsync_each_append=fsync_each_append,
        )
        self.log = self._load(had_clean_shutdown=False)

    @property
    def lg(self) -> Log:
        assert self.log is not None
        return self.log

    def _load(self, *, had_clean_shutdown: bool, checkpoints: Checkpoints | None = None) -> Log:
        return load_log(
            self.dir,
            self.config,
            had_clean_shutdown=had_clean_shutdown,
            clock=self.clock,
            recovery_point=checkpoints.recovery_point if checkpoints else 0,
            log_start_offset=checkpoints.log_start_offset if checkpoints else None,
            high_watermark=checkpoints.high_watermark if checkpoints else None,
        )

    def _checkpoints(self, high_watermark: int) -> Checkpoints:
        """What the LogManager would pass back at start-up."""
        return Checkpoints(self.lg.recovery_point, self.lg.log_start_offset, high_watermark)

    def teardown(self) -> None:
        if self.log is not None:
            self.log.abandon()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- appends ---------------------------------------------------------------------------
    @rule(batches=append_strategy, epoch_bump=st.sampled_from([0, 0, 0, 1, 3]))
    def append_as_leader(self, batches: list[list[bytes]], epoch_bump: int) -> None:
        m = self.model
        epoch = m.max_epoch + epoch_bump
        self.clock.advance(7)
        data = b"".join(
            build_batch([RecordInput(None, v, self.clock.now_ms + i) for i, v in enumerate(vs)])
            for vs in batches
        )
        if len(data) > self.config.segment_bytes:
            with pytest.raises(RecordTooLargeError):
                self.lg.append_as_leader(data, leader_epoch=epoch)
            return
        info = self.lg.append_as_leader(data, leader_epoch=epoch)
        count = sum(len(vs) for vs in batches)
        assert (info.first_offset, info.last_offset) == (m.leo, m.leo + count - 1)
        assert info.record_count == count and info.size_bytes == len(data)
        self._model_append(batches, epoch)

    @rule(batches=append_strategy, epoch_bump=st.sampled_from([0, 0, 1]), stale=st.booleans())
    def append_as_follower(self, batches: list[list[bytes]], epoch_bump: int, stale: bool) -> None:
        """A follower copies the leader's batches with their offsets and epochs, from the log
        end on; a batch below the log end is refused without changing anything."""
        m = self.model
        epoch = m.max_epoch + epoch_bump
        self.clock.advance(7)
        data, base = b"", m.leo
        for vs in batches:
            records = [RecordInput(None, v, self.clock.now_ms + i) for i, v in enumerate(vs)]
            data += build_batch(records, base_offset=base, partition_leader_epoch=epoch)
            base += len(vs)
        if len(data) > self.config.segment_bytes:
            with pytest.raises(RecordTooLargeError):
                self.lg.append_as_follower(data)
            return
        if stale and m.leo > 0:
            old = build_batch([RecordInput(None, b"old", 0)], base_offset=m.leo - 1)
            with pytest.raises(InvalidRecordError):
                self.lg.append_as_follower(old)  # below the log end: refused, no change
        info = self.lg.append_as_follower(data)
        assert (info.first_offset, info.last_offset) == (m.leo, base - 1)
        self._model_append(batches, epoch)

    @rule(
        batches=st.lists(st.lists(st.binary(max_size=20), min_size=1, max_size=3), max_size=12),
        epoch_bumps=st.lists(st.sampled_from([0, 0, 0, 0, 1]), min_size=12, max_size=12),
        data=st.data(),
    )
    def append_burst(
        self, batches: list[list[bytes]], epoch_bumps: list[int], data: st.DataObject
    ) -> None:
        """Many small appends in one step, so logs grow past several segments; then the
        followers catch up part of the way and the leader moves the HW forward."""
        for values, bump in zip(batches, epoch_bumps, strict=False):
            self.append_as_leader([values], bump)
        m = self.model
        target = data.draw(st.integers(m.hw, m.leo), label="hw")
        assert self.lg.maybe_increment_high_watermark(target) == (target > m.hw)
        m.hw = max(m.hw, target)
        if m.leo > m.hw:
            with pytest.raises(OffsetOutOfRangeError):
                self.lg.maybe_increment_high_watermark(m.leo + 1)

    def _model_append(self, batches: list[list[bytes]], epoch: int) -> None:
        m = self.model
        for vs in batches:
            m.batches.append(ModelBatch(m.leo, epoch, tuple(vs)))
            m.leo += len(vs)
        m.max_epoch = epoch
        if self.config.fsync_each_append:
            m.durable = m.leo

    # -- reads -----------------------------------------------------------------------------
    @rule(
        data=st.data(),
        max_bytes=st.integers(1, 2500),
        isolation=st.sampled_from(Isolation),
    )
    def read(self, data: st.DataObject, max_bytes: int, isolation: Isolation) -> None:
        m = self.model
        bound = m.leo if isolation is Isolation.LOG_END else m.hw
        start = data.draw(
            st.integers(m.log_start, bound) | st.integers(m.log_start, m.leo), label="start"
        )
        self._check_read_from(start, max_bytes, isolation)

    @rule(offset=st.integers(0, 5))
    def read_out_of_range(self, offset: int) -> None:
        m = self.model
        for bad in (m.leo + 1 + offset, m.log_start - 1 - offset):
            if bad < 0:
                continue
            with pytest.raises(OffsetOutOfRangeError):
                self.lg.read(bad, 1000, isolation=Isolation.LOG_END)

    def _check_read_from(self, start: int, max_bytes: int, isolation: Isolation) -> None:
        """Read slice after slice from ``start`` up to the bound; compare with the model."""
        m = self.model
        bound = m.leo if isolation is Isolation.LOG_END else m.hw
        position = start
        while position < bound:
            fetched = self.lg.read(position, max_bytes, isolation=isolation)
            assert (fetched.log_start_offset, fetched.high_watermark) == (m.log_start, m.hw)
            assert fetched.log_end_offset == m.leo
            if fetched.slice is None:
                # Consumers never see a batch that reaches past the HW, even partly.
                assert isolation is Isolation.HIGH_WATERMARK, f"nothing read at {position}"
                assert m.batch_holding(position).last >= bound
                return
            decoded = _complete_batches(fetched.slice.read())
            assert decoded, f"read at {position} returned no whole batch"
            assert decoded[0].header.base_offset <= position <= decoded[0].header.last_offset
            for batch in decoded:
                self._check_batch(batch, bound)
            position = decoded[-1].header.next_offset

    def _check_batch(self, batch: DecodedBatch, bound: int) -> None:
        expected = self.model.batch_holding(batch.header.base_offset)
        assert batch.header.base_offset == expected.base
        assert batch.header.last_offset == expected.last < bound
        assert batch.header.partition_leader_epoch == expected.epoch
        assert [r.offset for r in batch.records] == list(range(expected.base, expected.next))
        assert tuple(r.value for r in batch.records) == expected.values

    # -- truncation ------------------------------------------------------------------------
    @rule(data=st.data())
    def truncate_to(self, data: st.DataObject) -> None:
        """A follower truncating to a batch boundary (where leader epochs change), to the log
        end or beyond, or below the log start (the log restarts there)."""
        m = self.model
        boundaries = [b.base for b in m.batches if b.base >= m.log_start]
        below_start = list(range(max(0, m.log_start - 3), m.log_start))
        offset = data.draw(
            st.sampled_from([*boundaries, *below_start, m.leo, m.leo + 2]), label="offset"
        )
        changed = self.lg.truncate_to(offset)
        assert changed == (offset < m.leo)
        if offset < m.log_start:
            self._model_restart_at(offset)  # below the log start the log restarts there
        elif offset < m.leo:
            m.cut_to(offset)

    @rule(data=st.data())
    def truncate_to_any_offset(self, data: st.DataObject) -> None:
        """A follower truncating to an offset that may lie inside a batch or below the log
        start: the whole batch holding it goes (Kafka's LogSegment.truncateTo)."""
        m = self.model
        offset = data.draw(st.integers(max(0, m.log_start - 3), m.leo + 3), label="offset")
        changed = self.lg.truncate_to(offset)
        assert changed == (offset < m.leo)
        if offset >= m.leo:
            return
        if offset < m.log_start or m.batch_holding(offset).base < m.log_start:
            # Below the log start, or inside the batch holding it: the log restarts there.
            self._model_restart_at(offset)
        else:
            m.cut_to(m.batch_holding(offset).base)

    @rule(data=st.data())
    def truncate_fully_and_start_at(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(0, self.model.leo + 50), label="offset")
        self.lg.truncate_fully_and_start_at(offset)
        self._model_restart_at(offset)
        assert [s.base_offset for s in self.lg.segments] == [offset]

    def _model_restart_at(self, offset: int) -> None:
        m = self.model
        m.batches = []
        m.log_start = m.hw = m.leo = m.durable = offset

    # -- segments, offsets, retention ------------------------------------------------------
    @rule()
    def roll(self) -> None:
        before = [s.base_offset for s in self.lg.segments]
        active = self.lg.active_segment
        self.lg.roll()
        after = [s.base_offset for s in self.lg.segments]
        if active.size == 0:
            assert after == before
        else:
            assert after == [*before, self.model.leo]

    @rule(data=st.data())
    def update_high_watermark(self, data: st.DataObject) -> None:
        m = self.model
        offset = data.draw(st.integers(m.log_start, m.leo) | st.integers(0, m.leo + 3), label="hw")
        assert self.lg.update_high_watermark(offset) == max(m.log_start, min(offset, m.leo))
        m.hw = max(m.log_start, min(offset, m.leo))

    @rule(data=st.data())
    def advance_log_start_and_delete(self, data: st.DataObject) -> None:
        m = self.model
        offset = data.draw(st.integers(m.log_start, m.hw), label="log_start")
        assert self.lg.maybe_increment_log_start_offset(offset) == (offset > m.log_start)
        m.log_start = offset
        if data.draw(st.booleans(), label="past_hw") and m.hw < m.leo:
            with pytest.raises(OffsetOutOfRangeError):
                self.lg.maybe_increment_log_start_offset(m.hw + 1)
        self._delete_old_segments()

    @rule()
    def delete_old_segments(self) -> None:
        self._delete_old_segments()

    def _delete_old_segments(self) -> None:
        m = self.model
        before = list(self.lg.segments)
        deleted = self.lg.delete_old_segments()
        after = list(self.lg.segments)
        assert after == before[deleted:], "only a prefix of the segments may go"
        bases = [s.base_offset for s in after]
        assert bases[0] <= m.hw, "retention deleted data at or above the high watermark"
        if len(bases) > 1:
            assert bases[1] > m.log_start, "a segment wholly below the log start was kept"
        limit = self.config.retention_bytes
        if limit is not None and len(after) > 1 and bases[1] <= m.hw:
            assert self.lg.size_bytes - limit < after[0].size, "retention kept too much"
        if deleted:
            assert not before[0].log_path.exists()
        m.log_start = max(m.log_start, bases[0])

    # -- durability and restarts -----------------------------------------------------------
    @rule()
    def flush(self) -> None:
        self.lg.flush()
        self.model.durable = self.model.leo

    @rule()
    def clean_restart(self) -> None:
        checkpoints = self._checkpoints(self.lg.high_watermark)
        self.lg.close()
        checkpoints = replace(checkpoints, recovery_point=self.lg.recovery_point)  # shutdown
        self.log = None
        self.log = self._load(had_clean_shutdown=True, checkpoints=checkpoints)
        self.model.durable = self.model.leo
        self._check_read_from(self.model.log_start, 1 << 20, Isolation.LOG_END)

    @rule(data=st.data())
    def process_crash(self, data: st.DataObject) -> None:
        """The process dies; the page cache keeps every written byte. The HW checkpoint may
        be stale (it is written periodically)."""
        m = self.model
        stale_hw = data.draw(st.integers(m.log_start, m.hw), label="hw_checkpoint")
        checkpoints = self._checkpoints(stale_hw)
        self.lg.abandon()
        self.log = None
        self.log = self._load(had_clean_shutdown=False, checkpoints=checkpoints)
        m.hw = stale_hw
        m.durable = m.leo
        self._check_read_from(m.log_start, 1 << 20, Isolation.LOG_END)

    @rule(data=st.data())
    def machine_crash(self, data: st.DataObject) -> None:
        """The machine dies: the active segment loses an arbitrary part of its unflushed
        tail. Every durable offset must survive and the log must be a prefix of the model."""
        m = self.model
        active = self.lg.active_segment
        layout = [
            (position, header)
            for segment, position, header in self.lg.batches(active.base_offset)
            if segment is active
        ]
        flushed = next((p for p, h in layout if h.base_offset >= m.durable), active.size)
        cut = data.draw(st.integers(flushed, active.size), label="cut")
        survivors = [h for p, h in layout if p + h.size_bytes <= cut]
        new_leo = survivors[-1].next_offset if survivors else active.base_offset
        checkpoints = self._checkpoints(m.hw)
        self.lg.abandon()
        self.log = None
        os.truncate(active.log_path, cut)
        self.log = self._load(had_clean_shutdown=False, checkpoints=checkpoints)
        assert new_leo >= m.durable, "a durable offset was lost"
        if new_leo < m.log_start:
            # Everything that survived lies below the log start: the log restarts there.
            self._model_restart_at(m.log_start)
        else:
            assert self.lg.log_end_offset == new_leo
            m.cut_to(new_leo)
            m.durable = new_leo
        self._check_read_from(m.log_start, 1 << 20, Isolation.LOG_END)

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def offsets_match_the_model(self) -> None:
        if self.log is None:
            return
        m, lg = self.model, self.lg
        assert lg.log_start_offset <= lg.high_watermark <= lg.log_end_offset
        assert (lg.log_start_offset, lg.high_watermark) == (m.log_start, m.hw)
        assert lg.log_end_offset == m.leo
        assert lg.recovery_point == m.durable

    @invariant()
    def segment_files_match_the_segments(self) -> None:
        if self.log is None:
            return
        bases = [s.base_offset for s in self.lg.segments]
        assert bases == sorted(set(bases))
        on_disk = sorted(int(p.name.split(".")[0]) for p in self.dir.glob("*.log"))
        assert on_disk == bases
        assert all(s.size == s.log_path.stat().st_size for s in self.lg.segments)

    @invariant()
    def epoch_cache_agrees_with_the_model(self) -> None:
        if self.log is None:
            return
        m, lg = self.model, self.lg
        entries = lg.epoch_cache.entries()
        for before, after in itertools.pairwise(entries):
            assert before.epoch < after.epoch and before.start_offset <= after.start_offset
        assert all(m.log_start <= e.start_offset <= m.leo for e in entries), entries
        ends = m.epoch_ends()
        for epoch, end in ends.items():
            assert lg.end_offset_for_epoch(epoch) == (epoch, end), (epoch, entries)
        if ends:
            assert lg.epoch_cache.latest_epoch == max(ends)
        assert lg.end_offset_for_epoch(m.max_epoch + 1) == (-1, -1)


_SETTINGS = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.slow  # about 5 s
def test_log_matches_its_model(tmp_path: Path) -> None:
    class Machine(LogMachine):
        def __init__(self) -> None:
            super().__init__(tmp_path)

    run_state_machine_as_test(Machine, settings=_SETTINGS)


# -- falsifying examples the machine found, as plain tests -----------------------------------


def test_multi_batch_append_into_a_nearly_full_index(tmp_path: Path) -> None:
    """The roll check before an append makes room for one index entry, but an append of
    several batches can add one entry per batch: with 24-byte indexes (a time index of two
    slots, one kept for the roll entry) the second entry fails an invariant mid-append."""
    config = LogConfig(segment_index_bytes=24, index_interval_bytes=0)
    log = load_log(tmp_path / "topic-0", config, clock=FakeClock())
    try:
        data = b"".join(build_batch([RecordInput(None, b"v", 1 + i)]) for i in range(3))
        info = log.append_as_leader(data, leader_epoch=0)
        assert (info.first_offset, info.last_offset) == (0, 2)
        assert log.log_end_offset == 3
    finally:
        log.abandon()


def test_truncate_inside_the_batch_that_holds_the_log_start(tmp_path: Path) -> None:
    """The log start may lie inside a batch (DeleteRecords takes any offset up to the HW).
    Truncating to an offset inside that same batch removes the whole batch, so the log end
    would fall below the log start (once an invariant failure that left the offsets
    inconsistent). Expected: either the offsets stay ordered (the log restarts at the
    truncation offset, as below the log start) or a typed error refuses the truncation
    before anything changes."""
    log = load_log(tmp_path / "topic-0", LogConfig(), clock=FakeClock())
    try:
        records = [RecordInput(None, b"v%d" % i, 1) for i in range(4)]
        log.append_as_leader(build_batch(records), leader_epoch=0)  # offsets 0-3
        log.append_as_leader(build_batch([RecordInput(None, b"v4", 2)]), leader_epoch=0)
        log.update_high_watermark(5)
        log.maybe_increment_log_start_offset(2)
        try:
            log.truncate_to(3)
        except StorageError:  # refusing is fine too, if nothing changed
            assert (log.log_start_offset, log.log_end_offset) == (2, 5)
            assert log.active_segment.size == log.active_segment.log_path.stat().st_size
        else:
            assert log.log_start_offset <= log.high_watermark <= log.log_end_offset <= 3
        info = log.append_as_leader(build_batch([RecordInput(None, b"new", 3)]), 1)
        assert info.first_offset == log.log_end_offset - 1
    finally:
        log.abandon()
