"""What a power loss does to a partition's log files: the page cache is gone, so every byte
and every file name the engine did not make durable may be lost.

The model, for a log whose recovery point was ``recovery_point`` when the machine died
(everything below it fsynced, and with it the names of the segment files that existed at
that flush, see ``Log._sync``):

- a segment that ends at or below the recovery point is kept whole;
- the segment holding the recovery point keeps at least the bytes below it;
- the newest segment's file may be gone altogether when it was created after the last
  directory fsync (above the recovery point, or in a log never flushed: recovery point 0).
  An older one's name is durable: the log syncs its directory before a roll creates a
  newer file (``Log._roll``), so whatever order the file system commits directory changes
  in, a file never survives without the files created before it;
- every kept segment is cut at a random byte at or above its durable part, and the cut may
  be followed by zeros up to the old size (the file's size reached the disk, its data did
  not): torn batches, garbage tails and whole lost batches.

Index files are left as they were (recovery rebuilds those of every segment it replays);
those of a vanished segment go with it. Checkpoint files are written with fsync and stay.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

from storage.segment import LOG_SUFFIX

_BATCH_PREFIX = struct.Struct(">qi")  # base offset, batch length (the bytes after it)
VANISH_PROBABILITY = 0.25
ZEROS_PROBABILITY = 0.5


def lose_page_cache(directory: Path, recovery_point: int, rng: random.Random) -> list[str]:
    """Apply a power loss to the log in ``directory`` (closed, not flushed); returns what
    happened to each segment file that changed, for the trace."""
    paths = sorted(directory.glob(f"*{LOG_SUFFIX}"))
    bases = [int(p.name[: -len(LOG_SUFFIX)]) for p in paths]
    changes = []
    for i, (path, base) in enumerate(zip(paths, bases, strict=True)):
        following = bases[i + 1] if i + 1 < len(bases) else None
        if following is not None and following <= recovery_point:
            continue  # wholly below the recovery point: fsynced
        # A flush covering it synced its name (0: never flushed); so did the roll that
        # created a later segment.
        named = (base <= recovery_point and recovery_point > 0) or following is not None
        if not named and rng.random() < VANISH_PROBABILITY:
            for sibling in directory.glob(f"{path.name[: -len(LOG_SUFFIX)]}.*"):
                sibling.unlink()
            changes.append(f"{base}: gone")
            continue
        durable = _position_of(path, recovery_point) if base <= recovery_point else 0
        size = path.stat().st_size
        cut = rng.randint(durable, size)
        end = cut
        if cut < size and rng.random() < ZEROS_PROBABILITY:
            end = min(size, cut + rng.randint(1, 2_048))
        if end == size and cut == size:
            continue
        with path.open("r+b") as f:
            f.truncate(cut)
            f.truncate(end)  # extends with zeros
        zeros = f" + {end - cut} zeros" if end > cut else ""
        changes.append(f"{base}: {size} -> {cut} bytes{zeros}")
    return changes


def _position_of(path: Path, offset: int) -> int:
    """The file position of the first batch at or above ``offset`` (the file's size if none):
    the bytes before it hold only offsets below ``offset``."""
    with path.open("rb") as f:
        data = f.read()
    position = 0
    while position + _BATCH_PREFIX.size <= len(data):
        base, length = _BATCH_PREFIX.unpack_from(data, position)
        if base >= offset or length <= 0:
            break
        position += _BATCH_PREFIX.size + length
    return min(position, len(data))
