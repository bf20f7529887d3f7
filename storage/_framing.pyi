from collections.abc import Callable

from typing_extensions import Buffer

def record_count(section: Buffer, /) -> int: ...
def checked_header(
    buf: Buffer, pos: int, crc32c: Callable[[Buffer], int], walk_max: int, /
) -> tuple[int, int, int, int, int, int, int, int, int, int, int, int, int] | None: ...
