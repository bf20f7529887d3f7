"""Printing a partition log's batches and records, read-only (``runnel log dump``).

Output formats, one line per batch (see ``batch_fields`` for the keys, in order):

- text: a ``# <segment>.log: <size> bytes`` line per segment, then ``key=value`` pairs per
  batch; with records, one indented ``offset=... timestamp=... key=... value=...
  headers=[...]`` line per record after its batch.
- JSON (``--json``): exactly one JSON object per line per batch, ``records`` inside it.

Record keys, values and header values are shown as text when they are printable UTF-8 and as
hexadecimal otherwise. Text mode writes ``null``, a JSON-quoted string, or ``hex:<digits>``;
JSON mode writes the string (or null) with a ``*_encoding`` key beside it: ``"utf8"``,
``"hex"`` or null.

When the framing of a segment breaks (a torn or garbage tail), its last line is an error
naming the byte position (``error: <file>: byte <n>: ...``, or a JSON object with
``"error"``) and the dump goes on with the next segment. A batch whose CRC fails is printed
with ``crc_valid`` false and the dump goes on. :func:`dump_log` returns False if anything
was wrong (broken tail, CRC mismatch, records that do not decode).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from runnel.segment_reader import BrokenTail, ScannedBatch, SegmentFile, scan_segment
from storage.batch import ATTR_COMPRESSION_MASK, CompressionType
from storage.errors import StorageError

if TYPE_CHECKING:
    from storage.records import Record

Fields = dict[str, object]
_TEXT_ONLY_IF_INVALID = "computed_crc"


@dataclass(frozen=True, slots=True)
class DumpOptions:
    json: bool = False
    records: bool = False
    max_decompressed_bytes: int | None = None  # None: the engine's limit


def dump_log(segments: Sequence[SegmentFile], options: DumpOptions, out: TextIO) -> bool:
    """Print every segment in order; returns whether everything printed was sound."""
    sound = True
    for segment in segments:
        if not options.json:
            out.write(f"# {segment.name}: {segment.path.stat().st_size} bytes\n")
        for item in scan_segment(segment.path):
            if isinstance(item, BrokenTail):
                out.write(_error_line(segment, item, options) + "\n")
                sound = False
                break
            sound = _dump_batch(segment, item, options, out) and sound
    return sound


def _dump_batch(
    segment: SegmentFile, batch: ScannedBatch, options: DumpOptions, out: TextIO
) -> bool:
    fields = batch_fields(segment, batch)
    records, error = _records(batch, options) if options.records else ((), None)
    if options.json:
        if options.records:
            fields["records"] = None if error else [record_fields(r) for r in records]
            fields["records_error"] = error
        out.write(json.dumps(fields) + "\n")
    else:
        out.write(_text_batch(fields) + "\n")
        for record in records:
            out.write("  " + _text_record(record) + "\n")
        if error:
            out.write(f"  ! records not decoded: {error}\n")
    return batch.crc_valid and error is None


def _records(batch: ScannedBatch, options: DumpOptions) -> tuple[Sequence[Record], str | None]:
    if not batch.crc_valid:
        return (), "CRC mismatch"
    try:
        decoded = batch.decode(options.max_decompressed_bytes)
    except StorageError as e:
        return (), str(e)
    return decoded.records, None


def batch_fields(segment: SegmentFile, batch: ScannedBatch) -> Fields:
    """Everything known about one batch, as an ordered mapping of JSON-ready values."""
    h = batch.header
    return {
        "base_offset": h.base_offset,
        "last_offset": h.last_offset,
        "leader_epoch": h.partition_leader_epoch,
        "record_count": h.record_count,
        "size_bytes": h.size_bytes,
        "codec": codec_name(h.attributes),
        "crc_valid": batch.crc_valid,
        "segment": segment.name,
        "position": batch.position,
        "crc": f"{h.crc:#010x}",
        "computed_crc": f"{batch.computed_crc:#010x}",
        "producer_id": h.producer_id,
        "producer_epoch": h.producer_epoch,
        "base_sequence": h.base_sequence,
        "timestamp_type": h.timestamp_type.name.lower(),
        "base_timestamp": h.base_timestamp,
        "max_timestamp": h.max_timestamp,
        "transactional": h.is_transactional,
        "control": h.is_control,
    }


def codec_name(attributes: int) -> str:
    codec_id = attributes & ATTR_COMPRESSION_MASK
    try:
        return CompressionType(codec_id).name.lower()
    except ValueError:
        return f"unknown({codec_id})"


def record_fields(record: Record) -> Fields:
    key, key_encoding = render_bytes(record.key)
    value, value_encoding = render_bytes(record.value)
    headers: list[Fields] = []
    for header_key, header_value in record.headers:
        shown, encoding = render_bytes(header_value)
        headers.append({"key": header_key, "value": shown, "value_encoding": encoding})
    return {
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": key,
        "key_encoding": key_encoding,
        "value": value,
        "value_encoding": value_encoding,
        "headers": headers,
    }


def render_bytes(data: bytes | None) -> tuple[str | None, str | None]:
    """(shown, encoding): printable UTF-8 as itself ("utf8"), anything else as hex."""
    if data is None:
        return None, None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data.hex(), "hex"
    return (text, "utf8") if text.isprintable() else (data.hex(), "hex")


def _text_batch(fields: Fields) -> str:
    pairs = []
    for key, value in fields.items():
        if key == "segment" or (key == _TEXT_ONLY_IF_INVALID and fields["crc_valid"]):
            continue
        pairs.append(f"{key}={_text_scalar(value)}")
    return " ".join(pairs)


def _text_record(record: Record) -> str:
    headers = ", ".join(
        f"{json.dumps(k, ensure_ascii=False)}={_text_bytes(v)}" for k, v in record.headers
    )
    return (
        f"offset={record.offset} timestamp={record.timestamp} key={_text_bytes(record.key)} "
        f"value={_text_bytes(record.value)} headers=[{headers}]"
    )


def _text_bytes(data: bytes | None) -> str:
    shown, encoding = render_bytes(data)
    if shown is None:
        return "null"
    return json.dumps(shown, ensure_ascii=False) if encoding == "utf8" else f"hex:{shown}"


def _text_scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _error_line(segment: SegmentFile, tail: BrokenTail, options: DumpOptions) -> str:
    if options.json:
        return json.dumps(
            {"segment": segment.name, "position": tail.position, "error": tail.reason}
        )
    return f"error: {segment.name}: byte {tail.position}: {tail.reason}"
