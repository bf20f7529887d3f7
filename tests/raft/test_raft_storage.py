"""The Raft node's durable pieces on real files: quorum state, snapshots, the log store."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from raft.core import encode_records
from raft.log_store import DEFAULT_LOG_CONFIG, METADATA_LOG_DIR, RaftLogStore
from raft.messages import Batch, LogWrite, QuorumState, SnapshotId
from raft.quorum_state import QuorumStateError, QuorumStateStore
from raft.snapshots import SnapshotError, SnapshotStore, file_name
from storage.batch import validate_batch


def test_quorum_state_round_trips_and_starts_at_epoch_zero(tmp_path: Path) -> None:
    store = QuorumStateStore(tmp_path)
    assert store.load() == QuorumState()
    store.save(QuorumState(7, 2, -1))
    assert QuorumStateStore(tmp_path).load() == QuorumState(7, 2, -1)
    doc = json.loads(store.path.read_text())
    assert (doc["leaderEpoch"], doc["votedId"], doc["leaderId"]) == (7, 2, -1)
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("damage", ["garbage", "checksum", "version", "empty"])
def test_a_corrupt_quorum_state_refuses_to_load(tmp_path: Path, damage: str) -> None:
    store = QuorumStateStore(tmp_path)
    store.save(QuorumState(3, 1, 1))
    doc = json.loads(store.path.read_text())
    if damage == "garbage":
        store.path.write_text("{not json")
    elif damage == "checksum":
        doc["votedId"] = 2
        store.path.write_text(json.dumps(doc))
    elif damage == "version":
        doc["data_version"] = 9
        store.path.write_text(json.dumps(doc))
    else:
        store.path.write_text("")
    with pytest.raises(QuorumStateError):
        store.load()


def test_snapshots_save_load_and_replace_older_ones(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    assert store.latest() is None
    first, second = SnapshotId(100, 2), SnapshotId(250, 3)
    store.save(first, b"state at 100")
    assert store.latest() == first and store.load(first) == b"state at 100"
    assert (tmp_path / file_name(first)).name == "00000000000000000100-0000000002.checkpoint"
    store.save(second, b"state at 250")
    assert store.latest() == second
    assert not store.path(first).exists()


def test_a_snapshot_arrives_in_chunks_and_a_corrupt_one_is_refused(tmp_path: Path) -> None:
    source = SnapshotStore(tmp_path / "leader")
    snapshot = SnapshotId(40, 1)
    source.save(snapshot, bytes(range(256)) * 40)
    target = SnapshotStore(tmp_path / "follower")
    size, position = source.size(snapshot), 0
    target.begin(snapshot)
    while position < size:
        chunk = source.read(snapshot, position, 1000)
        target.write_chunk(snapshot, position, chunk)
        position += len(chunk)
    target.finish(snapshot)
    assert target.load(snapshot) == bytes(range(256)) * 40

    broken = SnapshotStore(tmp_path / "broken")
    data = bytearray(source.read(snapshot, 0, size))
    data[-1] ^= 1
    broken.begin(snapshot)
    broken.write_chunk(snapshot, 0, bytes(data))
    with pytest.raises(SnapshotError):
        broken.finish(snapshot)
    assert broken.latest() is None
    SnapshotStore(tmp_path / "broken")  # reopening clears the failed transfer
    assert not list((tmp_path / "broken").glob("*.partial"))


def batch(base: int, count: int, epoch: int, control: bool = False) -> Batch:
    records = [b"r%d" % (base + i) for i in range(count)]
    return Batch(base, base + count - 1, epoch, encode_records(records), control)


def test_the_log_store_writes_kafka_batches_at_raft_offsets(tmp_path: Path) -> None:
    store = RaftLogStore(tmp_path)
    written = (batch(0, 1, 1, control=True), batch(1, 3, 1), batch(4, 2, 2))
    store.apply(LogWrite(batches=written))
    assert store.read(0, 1 << 20) == written
    assert store.read(2, 1 << 20)[0] == written[1]  # a read from inside a batch
    meta = store.meta(None)
    assert (meta.start_offset, meta.end_offset, meta.epochs) == (0, 6, ((1, 0), (2, 4)))
    raw = (tmp_path / METADATA_LOG_DIR / "00000000000000000000.log").read_bytes()
    first = validate_batch(raw)
    assert first.partition_leader_epoch == 1 and first.is_control
    store.close()
    reopened = RaftLogStore(tmp_path)
    assert reopened.read(0, 1 << 20) == written
    reopened.close()


def test_the_log_store_truncates_and_restarts(tmp_path: Path) -> None:
    store = RaftLogStore(tmp_path)
    store.apply(LogWrite(batches=(batch(0, 2, 1), batch(2, 2, 1), batch(4, 2, 2))))
    store.apply(LogWrite(truncate_to=4, batches=(batch(4, 1, 3),)))
    assert [b.epoch for b in store.read(0, 1 << 20)] == [1, 1, 3]
    assert store.meta(None).epochs == ((1, 0), (3, 4))
    store.apply(LogWrite(restart_at=100))
    meta = store.meta(SnapshotId(100, 3))
    assert (meta.start_offset, meta.end_offset) == (100, 100)
    store.apply(LogWrite(batches=(batch(100, 1, 3),)))
    assert store.read(100, 1 << 20) == (batch(100, 1, 3),)
    store.close()


def _random_writes(rng: random.Random, steps: int) -> list[tuple[str, LogWrite | int]]:
    """Appends, truncations (also inside a batch), restarts and deletions, as a core might
    ask for them; the end offset is tracked so appends stay contiguous."""
    end, epoch, start, ops = 0, 1, 0, []
    for _ in range(steps):
        kind = rng.choices(["append", "truncate", "restart", "delete"], [8, 2, 1, 1])[0]
        if kind == "truncate" and end > start:
            end = rng.randrange(start, end + 1)
            epoch += 1
            ops.append(("write", LogWrite(truncate_to=end)))
        elif kind == "restart":
            end = start = end + rng.randrange(0, 5)
            ops.append(("write", LogWrite(restart_at=end)))
        elif kind == "delete" and end > start:
            start = rng.randrange(start, end + 1)
            ops.append(("delete", start))
        else:
            batches = []
            for _ in range(rng.randint(1, 3)):
                count = rng.randint(1, 4)
                batches.append(batch(end, count, epoch))
                end += count
            ops.append(("write", LogWrite(batches=tuple(batches))))
    return ops


@pytest.mark.parametrize("cache_bytes", [64, 1 << 20])
def test_reads_from_the_tail_cache_equal_reads_decoded_from_the_log(
    tmp_path: Path, cache_bytes: int
) -> None:
    cached = RaftLogStore(tmp_path / "cached", tail_cache_bytes=cache_bytes)
    plain = RaftLogStore(tmp_path / "plain", tail_cache_bytes=0)
    rng = random.Random(7)
    try:
        for op, arg in _random_writes(rng, 80):
            for store in (cached, plain):
                if isinstance(arg, LogWrite):
                    store.apply(arg)
                else:
                    store.delete_before(arg)
            log = plain.log
            assert cached.log.log_end_offset == log.log_end_offset, op
            for offset in range(log.log_start_offset, log.log_end_offset):
                assert cached.read(offset, 1) == plain.read(offset, 1), (op, offset)
                assert cached.read(offset, 1 << 20) == plain.read(offset, 1 << 20), (op, offset)
    finally:
        cached.close()
        plain.close()


def test_a_negative_tail_cache_budget_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tail_cache_bytes"):
        RaftLogStore(tmp_path, tail_cache_bytes=-1)


def test_the_log_store_tells_the_core_the_largest_batch_it_stores(tmp_path: Path) -> None:
    store = RaftLogStore(tmp_path)
    # 16 MiB less the Kafka batch header: the core counts each record's framing itself.
    assert store.meta(None).max_batch_bytes == 16 * 1024 * 1024 - 61
    store.close()


def test_a_write_of_many_batches_beyond_a_segment_is_appended_in_parts(tmp_path: Path) -> None:
    # A burst of proposals is many batches in one Ready. They went to the log in one append,
    # which the log refuses beyond segment_bytes (RecordTooLargeError), stopping the node.
    config = replace(DEFAULT_LOG_CONFIG, segment_bytes=4096, max_message_bytes=1024)
    store = RaftLogStore(tmp_path, config)
    written = tuple(batch(base, 10, 1) for base in range(0, 400, 10))  # about 6 KB in all
    store.apply(LogWrite(batches=written))
    assert store.read(0, 1 << 20) == written
    store.close()
    reopened = RaftLogStore(tmp_path, config)
    assert reopened.meta(None).end_offset == 400
    assert reopened.read(0, 1 << 20) == written
    reopened.close()


@pytest.mark.parametrize("cache_bytes", [0, 1 << 20])
def test_a_read_stays_within_max_bytes_past_its_first_batch(
    tmp_path: Path, cache_bytes: int
) -> None:
    # A record larger than max_batch_bytes is alone in a batch; a fetch answer that added it
    # after others could exceed what the transport carries, and be dropped at every retry.
    store = RaftLogStore(tmp_path, tail_cache_bytes=cache_bytes)
    small = Batch(0, 0, 1, encode_records([b"s" * 100]))
    large = Batch(1, 1, 1, encode_records([b"L" * 5000]))
    store.apply(LogWrite(batches=(small, large)))
    assert store.read(0, 1000) == (small,)
    assert store.read(1, 1000) == (large,)  # one batch always comes, however large
    assert store.read(0, 1 << 20) == (small, large)
    store.close()
