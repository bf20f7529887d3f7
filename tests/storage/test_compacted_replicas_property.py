"""What ``runnel replicas verify`` relies on, as a property of real logs: replicas of a
compacted partition, each compacted by itself at any time, copying from whichever replica
leads (clean leader changes with truncation of the others to the new leader's log end), hold
the leader's batches byte for byte from their ``compacted_below`` on, so any two agree
between the larger of their values and the smaller of their high watermarks. And compaction
loses nothing it may not: no record ever changes, and every replica's table of latest values
per key below the committed offset is the producer's.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path

from conftest import stored_batches
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from support import FakeClock

from runnel.replica_compare import BatchMeta, ReplicaBatches, compare_replicas
from storage.batch import LOG_OVERHEAD
from storage.cleaner import compact
from storage.config import LogConfig
from storage.loader import load_log
from storage.log import Isolation, Log
from storage.records import RecordInput, build_batch, iter_decoded

CONFIG = LogConfig(
    cleanup_policy="compact", segment_bytes=300, index_interval_bytes=128, retention_ms=None
)
REPLICAS = 3
KEYS = [b"a", b"b", b"c", b"d", b"e"]
NOW = 1_700_000_000_000
Record = tuple[bytes, bytes | None]  # key, value (None: a tombstone)


def whole_batches(data: bytes) -> bytes:
    """``data`` up to the end of its last whole batch (a fetch answer may end mid-batch; a
    follower keeps the whole ones). The first batch is always whole."""
    end = 0
    while end + LOG_OVERHEAD <= len(data):
        size = LOG_OVERHEAD + int.from_bytes(data[end + 8 : end + LOG_OVERHEAD], "big")
        if end + size > len(data):
            break
        end += size
    return data[:end]


def records(log: Log) -> dict[int, Record]:
    """Offset -> (key, value) of every record the log holds."""
    out: dict[int, Record] = {}
    for data in stored_batches(log).values():
        for batch in iter_decoded(data):
            for r in batch.records:
                assert r.key is not None
                out[r.offset] = (r.key, r.value)
    return out


def table(items: dict[int, Record], below: int) -> dict[bytes, bytes]:
    """Latest value per key among ``items`` below offset ``below`` (a tombstone deletes)."""
    out: dict[bytes, bytes] = {}
    for offset in sorted(o for o in items if o < below):
        key, value = items[offset]
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def metas(log: Log) -> list[BatchMeta]:
    return [
        BatchMeta(h.base_offset, h.last_offset, h.partition_leader_epoch, h.crc, h.size_bytes)
        for _, _, h in log.batches()
    ]


class CompactedReplicas(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="compacted-replicas-"))
        self.logs = [
            load_log(self.directory / f"r{i}" / "t-0", CONFIG, clock=FakeClock(NOW))
            for i in range(REPLICAS)
        ]
        self.leader = 0
        self.epoch = 0
        self.isr = set(range(REPLICAS))
        self.values = itertools.count()
        self.appended: dict[int, Record] = {}  # every record any leader appended, by offset
        self.as_appended: dict[int, bytes] = {}  # every batch as its leader stored it
        self.committed = 0  # the largest high watermark any replica was given

    def teardown(self) -> None:
        for log in self.logs:
            log.abandon()
        shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def lead(self) -> Log:
        return self.logs[self.leader]

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4), tombstone=st.booleans())
    def produce(self, keys: list[bytes], tombstone: bool) -> None:
        items: list[Record] = [(k, b"v%d" % next(self.values)) for k in keys]
        if tombstone:
            items[-1] = (items[-1][0], None)
        info = self.lead.append_as_leader(
            build_batch([RecordInput(k, v, NOW) for k, v in items]), self.epoch
        )
        for offset, item in enumerate(items, info.first_offset):
            self.appended[offset] = item
        self.as_appended.update(stored_batches(self.lead, info.first_offset))

    @rule(replica=st.integers(0, REPLICAS - 1), max_bytes=st.sampled_from([1, 200, 10_000]))
    def fetch(self, replica: int, max_bytes: int) -> None:
        """The follower copies what the leader holds from its log end (a whole first batch
        at least), as a follower fetch does."""
        follower = self.logs[replica]
        if replica == self.leader or follower.log_end_offset >= self.lead.log_end_offset:
            return
        data = self.lead.read(follower.log_end_offset, max_bytes, isolation=Isolation.LOG_END)
        if data.slice is not None:
            follower.append_as_follower(whole_batches(data.slice.read()))

    @rule()
    def catch_up(self) -> None:
        """Every follower in the ISR copies all the leader holds, and the high watermark
        follows."""
        for replica in self.isr:
            while replica != self.leader and (
                self.logs[replica].log_end_offset < self.lead.log_end_offset
            ):
                self.fetch(replica, 10_000)
        self.commit()

    @rule()
    def leader_compacts_ahead(self) -> None:
        """The leader rolls, the ISR catches up and the leader compacts: a follower out of
        the ISR then has compacted output to copy."""
        self.lead.roll()
        self.catch_up()
        self.compact(self.leader)

    @rule()
    def commit(self) -> None:
        """The high watermark: the smallest log end in the ISR; a follower's is its own log
        end when that is smaller (as a fetch answer tells it)."""
        hw = min(self.logs[i].log_end_offset for i in self.isr)
        self.committed = max(self.committed, hw)
        for log in self.logs:
            log.update_high_watermark(max(hw, log.high_watermark))

    @rule(replica=st.integers(0, REPLICAS - 1))
    def shrink(self, replica: int) -> None:
        """A follower leaves the ISR: the high watermark no longer waits for it, so the
        others may compact what it has not copied yet, and it copies their output."""
        if replica != self.leader:
            self.isr.discard(replica)

    @rule(replica=st.integers(0, REPLICAS - 1))
    def expand(self, replica: int) -> None:
        if self.logs[replica].log_end_offset >= self.lead.high_watermark:
            self.isr.add(replica)

    @rule(replica=st.integers(0, REPLICAS - 1))
    def roll(self, replica: int) -> None:
        self.logs[replica].roll()

    @rule(replica=st.integers(0, REPLICAS - 1))
    def compact(self, replica: int) -> None:
        log = self.logs[replica]
        compact(log, NOW, first_dirty_offset=log.compacted_below)

    @rule(replica=st.integers(0, REPLICAS - 1))
    def elect(self, replica: int) -> None:
        """A clean election: the new leader holds every committed record; the others drop
        what it does not have (what epoch-based truncation would find)."""
        if replica not in self.isr:
            return
        self.leader, self.epoch = replica, self.epoch + 1
        for log in self.logs:
            if log is not self.lead and log.log_end_offset > self.lead.log_end_offset:
                log.truncate_to(self.lead.log_end_offset)
        for offset in [o for o in self.appended if o >= self.lead.log_end_offset]:
            del self.appended[offset]  # never committed: gone with the old leader
        for base in [b for b in self.as_appended if b >= self.lead.log_end_offset]:
            del self.as_appended[base]

    @invariant()
    def records_never_change(self) -> None:
        for log in self.logs:
            for offset, item in records(log).items():
                assert self.appended[offset] == item, (offset, item)

    @invariant()
    def batches_are_as_appended_from_compacted_below_on(self) -> None:
        """From its compacted_below to its log end a replica holds every batch its leaders
        appended there, byte for byte: none rewritten, none missing."""
        for i, log in enumerate(self.logs):
            start, end = log.compacted_below, log.log_end_offset
            held = {b: d for b, d in stored_batches(log, start).items() if b >= start}
            expected = {b: d for b, d in self.as_appended.items() if start <= b < end}
            assert held == expected, (i, start, sorted(held), sorted(expected))

    @invariant()
    def replicas_agree_where_verify_compares(self) -> None:
        replicas = [
            ReplicaBatches(
                i, log.log_start_offset, log.high_watermark, metas(log), log.compacted_below
            )
            for i, log in enumerate(self.logs)
        ]
        assert compare_replicas(replicas, self.leader).divergences == ()

    @invariant()
    def every_replica_has_the_producers_table(self) -> None:
        expected = table(self.appended, self.committed)
        for i, log in enumerate(self.logs):
            if log.log_end_offset >= self.committed:
                assert table(records(log), self.committed) == expected, i


CompactedReplicas.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_compacted_replicas = CompactedReplicas.TestCase
