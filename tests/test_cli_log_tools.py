"""``runnel log dump|verify|produce`` run as real processes against logs the engine wrote.

A module fixture writes one partition log through ``load_log`` + ``append_as_leader``: every
codec, several segments, sparse index entries, leader epochs 0-2, keys, headers, binary
values and one idempotent batch. Tests check that dump and verify report exactly that, then
damage copies of it the ways disks and bugs do (a flipped byte, a torn or garbage tail, a
zero-filled hole, a replayed or vanished batch, bad index entries) and check that verify
names the file, byte position and offset, and that dump still prints every intact batch.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from storage.batch import BatchHeader, CompressionType, iter_headers
from storage.config import LogConfig
from storage.loader import load_log
from storage.log_manager import LogManager
from storage.records import RecordInput, build_batch
from storage.topic_partition import TopicPartition

REPO = Path(__file__).resolve().parent.parent
BASE_TS = 1_700_000_000_000
CODECS = list(CompressionType)
CONFIG = LogConfig(segment_bytes=1500, index_interval_bytes=200)
Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class Written:
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass(frozen=True)
class WrittenBatch:
    base_offset: int
    last_offset: int
    epoch: int
    codec: CompressionType
    records: tuple[Written, ...]


@dataclass(frozen=True)
class EngineLog:
    path: Path
    batches: tuple[WrittenBatch, ...]

    @property
    def records(self) -> list[Written]:
        return [r for b in self.batches for r in b.records]


def run(*args: str | Path, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "runnel", *map(str, args)],
        input=stdin,
        capture_output=True,
        env=env,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def _record(offset: int, i: int) -> tuple[RecordInput, Written]:
    key = None if i % 3 == 0 else f"key-{offset}".encode()
    value: bytes | None = f"value-{offset}".encode()
    headers: Headers = ()
    if i % 4 == 1:
        value = bytes([0, 255, offset % 256])  # not UTF-8: shown as hex
    if i % 5 == 2:
        headers = (("trace", f"t{offset}".encode()), ("empty", None))
    if offset == 13:
        value = None  # a tombstone
    return RecordInput(key, value, BASE_TS + offset, headers), Written(offset, key, value, headers)


def _write_engine_log(directory: Path) -> EngineLog:
    log = load_log(directory, CONFIG, clock=lambda: BASE_TS)
    batches: list[WrittenBatch] = []
    for n in range(24):
        codec, epoch, count = CODECS[n % len(CODECS)], n // 9, 3 + n % 5
        pairs = [_record(log.log_end_offset + i, i) for i in range(count)]
        idempotent = n == 5  # one batch from producer 7, which must be appended alone
        data = build_batch(
            [p[0] for p in pairs],
            compression=codec,
            producer_id=7 if idempotent else -1,
            producer_epoch=0 if idempotent else -1,
            base_sequence=0 if idempotent else -1,
        )
        info = log.append_as_leader(data, leader_epoch=epoch)
        written = tuple(p[1] for p in pairs)
        batches.append(WrittenBatch(info.first_offset, info.last_offset, epoch, codec, written))
    log.close()
    return EngineLog(directory, tuple(batches))


@pytest.fixture(scope="module")
def engine_log(tmp_path_factory: pytest.TempPathFactory) -> EngineLog:
    return _write_engine_log(tmp_path_factory.mktemp("engine") / "events-0")


@pytest.fixture
def damaged(engine_log: EngineLog, tmp_path: Path) -> Path:
    """A private copy of the engine log to corrupt."""
    return Path(shutil.copytree(engine_log.path, tmp_path / "events-0"))


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def headers_of(segment: Path) -> list[tuple[int, BatchHeader]]:
    return list(iter_headers(segment.read_bytes()))


def json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


def shown(data: bytes | None) -> tuple[str | None, str | None]:
    """What dump --json shows for bytes: text when printable UTF-8, else hex."""
    if data is None:
        return None, None
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return data.hex(), "hex"
    return (text, "utf8") if text.isprintable() else (data.hex(), "hex")


def patch(path: Path, position: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(data)


# -- a healthy log -------------------------------------------------------------------------


def test_engine_log_spans_several_segments_with_index_entries(engine_log: EngineLog) -> None:
    logs = segments(engine_log.path)
    assert len(logs) >= 3
    assert any(p.with_suffix(".index").stat().st_size >= 16 for p in logs)


def test_verify_accepts_the_engine_log(engine_log: EngineLog) -> None:
    done = run("log", "verify", engine_log.path, "--records")
    assert done.returncode == 0, done.stdout + done.stderr
    size = sum(p.stat().st_size for p in segments(engine_log.path))
    records = len(engine_log.records)
    batches = len(engine_log.batches)
    assert done.stdout.startswith(
        f"ok: {len(segments(engine_log.path))} segments, {batches} batches, "
        f"{records} records, {size} bytes; offsets 0-{records - 1}"
    )


def test_verify_accepts_one_segment_file(engine_log: EngineLog) -> None:
    done = run("log", "verify", segments(engine_log.path)[1])
    assert done.returncode == 0, done.stdout
    assert done.stdout.startswith("ok: 1 segment, ")


def test_dump_json_reports_every_batch_and_record_as_written(engine_log: EngineLog) -> None:
    done = run("log", "dump", engine_log.path, "--json", "--records")
    assert done.returncode == 0, done.stderr
    dumped = json_lines(done.stdout)
    assert len(dumped) == len(engine_log.batches)
    for got, want in zip(dumped, engine_log.batches, strict=True):
        assert (got["base_offset"], got["last_offset"], got["leader_epoch"]) == (
            want.base_offset,
            want.last_offset,
            want.epoch,
        )
        assert got["record_count"] == len(want.records)
        assert got["codec"] == want.codec.name.lower()
        assert got["crc_valid"] is True and got["records_error"] is None
        assert isinstance(got["records"], list)
        assert [_written(r) for r in got["records"]] == [_shown(r) for r in want.records]
    assert sum(int(str(b["size_bytes"])) for b in dumped) == sum(
        p.stat().st_size for p in segments(engine_log.path)
    )
    assert {b["segment"] for b in dumped} == {p.name for p in segments(engine_log.path)}
    assert (dumped[5]["producer_id"], dumped[5]["base_sequence"]) == (7, 0)


def _written(record: object) -> tuple[object, ...]:
    assert isinstance(record, dict)
    headers = tuple((h["key"], h["value"], h["value_encoding"]) for h in record["headers"])
    return (
        record["offset"],
        record["timestamp"],
        (record["key"], record["key_encoding"]),
        (record["value"], record["value_encoding"]),
        headers,
    )


def _shown(record: Written) -> tuple[object, ...]:
    headers = tuple((k, *shown(v)) for k, v in record.headers)
    return (
        record.offset,
        BASE_TS + record.offset,
        shown(record.key),
        shown(record.value),
        headers,
    )


def test_dump_text_has_a_line_per_batch_then_its_records(engine_log: EngineLog) -> None:
    done = run("log", "dump", engine_log.path, "--records")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    batch_lines = [line for line in lines if not line.startswith("  ")]
    assert len(batch_lines) == len(engine_log.batches)
    first = engine_log.batches[0]
    assert batch_lines[0].startswith(
        f"base_offset=0 last_offset={first.last_offset} leader_epoch=0 "
        f"record_count={len(first.records)} size_bytes="
    )
    assert "codec=none crc_valid=true position=0" in batch_lines[0]
    assert '  offset=0 timestamp=1700000000000 key=null value="value-0" headers=[]' in lines
    assert '  offset=1 timestamp=1700000000001 key="key-1" value=hex:00ff01 headers=[]' in lines
    assert any('headers=["trace"="t2", "empty"=null]' in line for line in lines)


def test_dump_reports_records_it_may_not_decompress(engine_log: EngineLog) -> None:
    done = run(
        "log", "dump", engine_log.path, "--json", "--records", "--max-decompressed-bytes", "8"
    )
    assert done.returncode == 1
    dumped = json_lines(done.stdout)
    assert all(b["records"] is None and "8 bytes" in str(b["records_error"]) for b in dumped[1:5])


def test_verify_accepts_an_open_log_with_preallocated_indexes(tmp_path: Path) -> None:
    log = load_log(tmp_path / "live-0", CONFIG, clock=lambda: BASE_TS)
    for n in range(6):
        values = [RecordInput(None, b"x" * 60, BASE_TS + n) for _ in range(4)]
        log.append_as_leader(build_batch(values, compression=CODECS[n % 5]), leader_epoch=0)
    log.flush()
    active = log.active_segment
    assert active.offset_index.path.stat().st_size > 8 * active.offset_index.entries
    done = run("log", "verify", tmp_path / "live-0")
    log.abandon()  # as if the process had crashed: indexes keep their zero-filled tails
    assert done.returncode == 0, done.stdout


def test_produce_appends_stdin_lines_that_dump_shows_back(tmp_path: Path) -> None:
    lines = [f"line {i} ✓" for i in range(50)]
    target = tmp_path / "produced-0"
    options = ["--codec", "zstd", "--batch-records", "7", "--segment-bytes", "400"]
    stdin = ("\n".join(lines) + "\n").encode()
    done = run("log", "produce", target, *options, "--leader-epoch", "3", stdin=stdin)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0].startswith("appended offsets 0-6: 7 records, ")
    assert out[-1].startswith("produced 50 records in 8 batches to ")
    assert "offsets 0-49, leader epoch 3; log end offset 50" in out[-1]
    assert len(segments(target)) > 1
    assert run("log", "verify", target).returncode == 0
    dumped = json_lines(run("log", "dump", target, "--json", "--records").stdout)
    assert {b["codec"] for b in dumped} == {"zstd"}
    assert {b["leader_epoch"] for b in dumped} == {3}
    values = [r["value"] for b in dumped for r in _list(b["records"])]
    assert values == lines


def _list(value: object) -> list[dict[str, object]]:
    assert isinstance(value, list)
    return value


def test_a_second_produce_appends_after_the_first(tmp_path: Path) -> None:
    target = tmp_path / "twice-0"
    assert run("log", "produce", target, stdin=b"a\nb\n").returncode == 0
    done = run("log", "produce", target, stdin=b"c\n")
    assert "offsets 2-2" in done.stdout
    assert run("log", "verify", target).returncode == 0


def test_produce_refuses_a_partition_of_a_data_dir_a_running_node_holds(tmp_path: Path) -> None:
    """The node appends to the same files: two writers corrupt the log (the tool's batches
    were overwritten by the broker's next append). The data directory's lock says whether a
    node runs there; once it has stopped, the tool may write."""
    data = tmp_path / "data"
    node = LogManager([data], LogConfig())  # what a running node holds
    node.startup()
    node.get_or_create_log(TopicPartition("t", 0))
    target = data / "t-0"
    refused = run("log", "produce", target, stdin=b"a\n")
    assert refused.returncode == 1, refused.stderr
    assert "not written" in refused.stderr and "in use by another process" in refused.stderr
    log = node.get_log(TopicPartition("t", 0))
    assert log is not None and log.log_end_offset == 0
    node.shutdown()
    done = run("log", "produce", target, stdin=b"a\n")
    assert done.returncode == 0 and "offsets 0-0" in done.stdout, done.stderr


# -- usage errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("log", "verify", "/nonexistent/events-0"), "no such file or directory"),
        (("log", "dump", "/nonexistent/0.log"), "no such file or directory"),
        (("log", "dump", "."), "no segment files"),
        (("log", "produce", "x", "--codec", "brotli"), "invalid choice"),
        (("log", "produce", "x", "--batch-records", "0"), "must be at least 1"),
        (("log",), "required"),
    ],
)
def test_usage_errors_exit_2(args: tuple[str, ...], message: str) -> None:
    done = run(*args)
    assert done.returncode == 2
    assert message in done.stderr


# -- damaged copies --------------------------------------------------------------------------


def test_flipped_byte_is_a_crc_mismatch_and_dump_continues(damaged: Path) -> None:
    segment = segments(damaged)[1]
    position, header = headers_of(segment)[1]
    flipped = position + header.size_bytes - 3  # inside the records section
    patch(segment, flipped, bytes([segment.read_bytes()[flipped] ^ 0x40]))

    done = run("log", "verify", damaged)
    assert done.returncode == 1
    assert done.stdout.startswith(
        f"{segment.name}: byte {position}: batch at offset {header.base_offset}: "
        f"CRC mismatch (stored {header.crc:#010x}, computed 0x"
    )
    dumped = run("log", "dump", damaged, "--json")
    assert dumped.returncode == 1
    batches = json_lines(dumped.stdout)
    bad = [b for b in batches if not b["crc_valid"]]
    assert [(b["segment"], b["position"]) for b in bad] == [(segment.name, position)]
    assert len(batches) == 24  # every batch, including those after the bad one


def test_garbage_tail_is_reported_at_its_byte_position(damaged: Path) -> None:
    segment = segments(damaged)[-1]
    size = segment.stat().st_size
    with open(segment, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x01\x00garbage!" * 3)

    done = run("log", "verify", damaged)
    assert done.returncode == 1
    assert done.stdout.startswith(f"{segment.name}: byte {size}: ")
    dumped = run("log", "dump", damaged)
    assert dumped.returncode == 1
    last = dumped.stdout.splitlines()[-1]
    assert last.startswith(f"error: {segment.name}: byte {size}: ")
    assert dumped.stdout.count("crc_valid=true") == 24


def test_batch_torn_in_the_middle(damaged: Path) -> None:
    segment = segments(damaged)[-1]
    position, header = headers_of(segment)[-1]
    os.truncate(segment, position + header.size_bytes // 2)

    done = run("log", "verify", damaged)
    assert done.returncode == 1
    assert done.stdout.startswith(f"{segment.name}: byte {position}: truncated batch")
    dumped = run("log", "dump", damaged, "--json")
    assert dumped.returncode == 1
    *batches, tail = json_lines(dumped.stdout)
    assert len(batches) == 23 and all(b["crc_valid"] for b in batches)
    assert tail["segment"] == segment.name
    assert tail["position"] == position
    assert "truncated" in str(tail["error"])


def test_zero_filled_hole_is_not_taken_for_a_batch(damaged: Path) -> None:
    segment = segments(damaged)[0]
    position, header = headers_of(segment)[2]
    patch(segment, position, bytes(header.size_bytes))

    done = run("log", "verify", damaged)
    assert done.returncode == 1
    assert done.stdout.startswith(f"{segment.name}: byte {position}: zero bytes")


def test_replayed_batch_makes_offsets_go_back(damaged: Path) -> None:
    segment = segments(damaged)[-1]
    data = segment.read_bytes()
    (_, first), (position, second) = headers_of(segment)[:2]
    segment.write_bytes(data + data[: first.size_bytes])  # the first batch again, at the end

    done = run("log", "verify", damaged)
    assert done.returncode == 1
    assert done.stdout.startswith(
        f"{segment.name}: byte {len(data)}: batch at offset {first.base_offset}: "
        f"offsets not increasing"
    )
    assert second.base_offset > first.base_offset and position == first.size_bytes


def test_vanished_middle_batch_breaks_the_offset_index(damaged: Path) -> None:
    segment = next(p for p in segments(damaged) if p.with_suffix(".index").stat().st_size >= 16)
    data = segment.read_bytes()
    position, header = headers_of(segment)[1]
    segment.write_bytes(data[:position] + data[position + header.size_bytes :])

    done = run("log", "verify", damaged)
    assert done.returncode == 1
    assert done.stdout.startswith(f"{segment.with_suffix('.index').name}: byte ")
    for suffix in (".index", ".timeindex"):
        segment.with_suffix(suffix).unlink()  # the loader would rebuild them
    done = run("log", "verify", damaged)
    assert done.returncode == 0, done.stdout
    assert done.stdout.rstrip().endswith("; 1 gap between offsets (fine only if compacted)")
    assert run("log", "dump", damaged).returncode == 0  # every remaining batch is intact


def test_offset_index_entry_pointing_inside_a_batch(damaged: Path) -> None:
    index = next(p for p in sorted(damaged.glob("*.index")) if p.stat().st_size >= 16)
    relative, position = struct.unpack_from(">ii", index.read_bytes(), 8)
    patch(index, 12, struct.pack(">i", position + 1))

    done = run("log", "verify", damaged)
    assert done.returncode == 1
    offset = int(index.stem) + relative
    assert done.stdout.startswith(
        f"{index.name}: byte 8: entry 1 (offset {offset} at position {position + 1}): "
        f"position is not the start of a batch"
    )


def test_time_index_entry_going_back_in_time(damaged: Path) -> None:
    index = next(p for p in sorted(damaged.glob("*.timeindex")) if p.stat().st_size >= 24)
    first_ts, _ = struct.unpack_from(">qi", index.read_bytes(), 0)
    patch(index, 12, struct.pack(">q", first_ts - 1))

    done = run("log", "verify", damaged)
    assert done.returncode == 1
    assert done.stdout.startswith(f"{index.name}: byte 12: entry 1 (timestamp {first_ts - 1} ")
    assert "timestamp went back" in done.stdout


def test_index_file_of_partial_entries(damaged: Path) -> None:
    index = segments(damaged)[0].with_suffix(".timeindex")
    with open(index, "ab") as f:
        f.write(b"\x01\x02\x03")

    done = run("log", "verify", damaged)
    assert done.returncode == 1
    assert done.stdout.startswith(f"{index.name}: byte {index.stat().st_size - 3}: file size")


def test_segment_renamed_above_its_batches(damaged: Path) -> None:
    segment = segments(damaged)[1]
    for suffix in (".index", ".timeindex"):
        segment.with_suffix(suffix).unlink()
    first = headers_of(segment)[0][1]
    renamed = segment.rename(damaged / f"{first.base_offset + 1:020d}.log")

    done = run("log", "verify", damaged)
    assert done.returncode == 1
    assert done.stdout.startswith(
        f"{renamed.name}: byte 0: batch at offset {first.base_offset}: base offset is below "
        f"the segment's base offset {first.base_offset + 1}"
    )


def test_leader_epoch_going_back(damaged: Path) -> None:
    segment = segments(damaged)[-1]
    position, header = headers_of(segment)[-1]
    assert header.partition_leader_epoch == 2
    patch(segment, position + 12, struct.pack(">i", 1))  # not covered by the CRC

    done = run("log", "verify", damaged)
    assert done.returncode == 1
    assert f"byte {position}: batch at offset {header.base_offset}: leader epoch 1" in done.stdout


def test_dump_and_verify_leave_a_damaged_log_untouched(damaged: Path) -> None:
    segment = segments(damaged)[-1]
    os.truncate(segment, segment.stat().st_size - 5)
    before = {p.name: p.read_bytes() for p in damaged.iterdir()}

    assert run("log", "verify", damaged).returncode == 1
    assert run("log", "dump", damaged, "--records").returncode == 1
    assert {p.name: p.read_bytes() for p in damaged.iterdir()} == before


def test_codec_choices_are_the_engines_codecs() -> None:
    from runnel import log_tools

    assert tuple(c.name.lower() for c in CompressionType) == log_tools.CODEC_NAMES


def test_main_returns_exit_codes_instead_of_exiting(capsys: pytest.CaptureFixture[str]) -> None:
    from runnel.cli import main

    assert main(["--help"]) == 0
    assert "log" in capsys.readouterr().out
    assert main(["log", "dump"]) == 2
    assert main(["nonsense"]) == 2
