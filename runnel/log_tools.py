"""``runnel log ...``: tools for partition logs on disk.

    runnel log dump PATH [--json] [--records] [--max-decompressed-bytes N]
    runnel log verify PATH [--records] [--max-decompressed-bytes N]
    runnel log produce PATH [--codec C] [--batch-records N] [--leader-epoch E]
                            [--segment-bytes B] [--quiet]

PATH is a partition directory (every ``<20 digits>.log`` segment, in base-offset order) or,
for dump and verify, a single segment file. Dump and verify only ever read (see
``segment_reader.py``); produce writes through the engine. This module holds the argument
parsing and the mapping to exit codes; the work is in ``log_dump``, ``log_verify`` and
``log_produce``.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from runnel.commands import (
    EXIT_OK,
    EXIT_PROBLEM,
    CommandError,
    Subparsers,
    UsageError,
    non_negative_int,
    positive_int,
    set_handler,
)

if TYPE_CHECKING:
    from runnel.segment_reader import SegmentFile
    from storage.dir_lock import DirLock

# The tool modules (and through them the storage engine and its compression libraries) are
# imported by the handlers, so ``runnel --help`` and every other command group stay quick.
# For the same reason the engine's defaults are resolved by the handlers, not shown here.
CODEC_NAMES = ("none", "gzip", "snappy", "lz4", "zstd")  # storage.batch.CompressionType
DEFAULT_BATCH_RECORDS = 100


def register(groups: Subparsers) -> None:
    """Add the ``log`` command group to the top-level parser."""
    log = groups.add_parser(
        "log",
        help="dump, verify and write partition logs on disk",
        description="Tools for partition logs on disk. Dump and verify never modify files.",
    )
    commands = log.add_subparsers(dest="log_command", metavar="COMMAND", required=True)
    _register_dump(commands)
    _register_verify(commands)
    _register_produce(commands)


def _add_path(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path", metavar="PATH", type=Path, help="partition directory or one .log segment file"
    )


def _add_decompressed_limit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-decompressed-bytes",
        metavar="N",
        type=positive_int,
        default=None,
        help="refuse to decompress a batch's records beyond N bytes (default: the engine's "
        "limit, 64 MiB)",
    )


def _register_dump(commands: Subparsers) -> None:
    parser = commands.add_parser(
        "dump",
        help="print every batch (and optionally record) of a log",
        description=(
            "Print one line per batch. Keys, values and header values are shown as text "
            "when printable UTF-8, else as hex. Exit 1 if a segment has a torn or garbage "
            "tail, a CRC fails or records do not decode."
        ),
    )
    _add_path(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object per batch line")
    parser.add_argument("--records", action="store_true", help="also print each record")
    _add_decompressed_limit(parser)
    set_handler(parser, _run_dump)


def _register_verify(commands: Subparsers) -> None:
    parser = commands.add_parser(
        "verify",
        help="check every batch and index entry of a log",
        description=(
            "Check framing, magic, CRC and offsets of every batch and the entries of every "
            "offset and time index. Exit 0 with a summary line, or 1 with the first problem."
        ),
    )
    _add_path(parser)
    parser.add_argument(
        "--records", action="store_true", help="also decompress and decode every batch"
    )
    _add_decompressed_limit(parser)
    set_handler(parser, _run_verify)


def _register_produce(commands: Subparsers) -> None:
    parser = commands.add_parser(
        "produce",
        help="append lines from stdin as records, through the storage engine",
        description=(
            "Append each line of stdin as one record (no key; value: the line without its "
            "terminator), in batches, then close the log cleanly."
        ),
    )
    parser.add_argument("path", metavar="PATH", type=Path, help="partition directory")
    parser.add_argument("--codec", choices=CODEC_NAMES, default="none")
    parser.add_argument(
        "--batch-records",
        metavar="N",
        type=positive_int,
        default=DEFAULT_BATCH_RECORDS,
        help="records per batch (default: %(default)s)",
    )
    parser.add_argument(
        "--leader-epoch",
        metavar="E",
        type=non_negative_int,
        default=None,
        help="epoch to stamp (default: the log's latest, 0 for a new log)",
    )
    parser.add_argument(
        "--segment-bytes",
        metavar="B",
        type=positive_int,
        default=None,
        help="roll to a new segment beyond B bytes (default: the engine's, 1 GiB)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the summary line")
    set_handler(parser, _run_produce)


# -- handlers ----------------------------------------------------------------------------


def _segments_at(path: Path) -> list[SegmentFile]:
    from runnel.segment_reader import find_segments, segment_file

    if not path.exists():
        raise UsageError(f"no such file or directory: {path}")
    if path.is_dir():
        segments = find_segments(path)
        if not segments:
            raise UsageError(f"{path}: no segment files (<20 digits>.log) in this directory")
        return segments
    if not path.is_file():
        raise UsageError(f"{path}: not a regular file or a directory")
    return [segment_file(path)]


def _run_dump(args: argparse.Namespace) -> int:
    from runnel.log_dump import DumpOptions, dump_log

    options = DumpOptions(
        json=args.json, records=args.records, max_decompressed_bytes=args.max_decompressed_bytes
    )
    try:
        segments = _segments_at(args.path)
        _tolerate_unencodable_output()
        sound = dump_log(segments, options, sys.stdout)
    except BrokenPipeError:
        raise
    except OSError as e:
        raise CommandError(f"cannot read {args.path}: {e}") from e
    return EXIT_OK if sound else EXIT_PROBLEM


def _run_verify(args: argparse.Namespace) -> int:
    from runnel.log_verify import LogProblem, VerifyOptions, verify_log

    options = VerifyOptions(
        decode_records=args.records, max_decompressed_bytes=args.max_decompressed_bytes
    )
    try:
        summary = verify_log(_segments_at(args.path), options)
    except LogProblem as problem:
        print(problem)
        return EXIT_PROBLEM
    except OSError as e:
        raise CommandError(f"cannot read {args.path}: {e}") from e
    print(summary.describe())
    return EXIT_OK


def _run_produce(args: argparse.Namespace) -> int:
    from runnel import log_produce
    from storage.errors import StorageError

    options = log_produce.ProduceOptions(
        directory=args.path,
        codec_name=args.codec,
        batch_records=args.batch_records,
        leader_epoch=args.leader_epoch,
        segment_bytes=args.segment_bytes,
    )
    if options.directory.exists() and not options.directory.is_dir():
        raise UsageError(f"{options.directory}: not a directory")
    try:
        log_produce.log_config(options)
    except ValueError as e:
        raise UsageError(str(e)) from None
    report = None if args.quiet else print
    lock = _data_dir_lock(options.directory)
    try:
        result = log_produce.produce(sys.stdin.buffer, options, report=report)
    except log_produce.EpochWentBack as e:
        raise UsageError(str(e)) from None
    except (StorageError, OSError) as e:
        raise CommandError(f"{options.directory}: {e}") from e
    finally:
        if lock is not None:
            lock.release()
    print(result.describe(options.directory))
    return EXIT_OK


def _data_dir_lock(partition_dir: Path) -> DirLock | None:
    """The lock of the node data directory ``partition_dir`` is in (one with a lock file),
    held while the tool writes: a running node appends to the same files, and the two would
    corrupt the log. None for a directory of no node's."""
    from storage.dir_lock import LOCK_FILE, DataDirInUseError, DirLock

    data_dir = partition_dir.resolve().parent
    if not (data_dir / LOCK_FILE).exists():
        return None
    lock = DirLock(data_dir)
    try:
        lock.acquire()
    except DataDirInUseError as e:
        raise CommandError(f"{partition_dir}: not written: {e}") from None
    except OSError as e:
        raise CommandError(f"{partition_dir}: cannot lock its data directory: {e}") from e
    return lock


def _tolerate_unencodable_output() -> None:
    """Printable non-ASCII text must not crash a dump on a terminal that cannot show it."""
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="backslashreplace")
