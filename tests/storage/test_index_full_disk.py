"""An index append on a full disk raises OSError (ENOSPC) instead of killing the process
with SIGBUS (a store into a sparse memory-mapped page with no block behind it): the blocks
are reserved with posix_fallocate first (storage/index.py); and resetting an index left
pre-allocated by a crash does not store zeros into its holes. A real full disk: a small tmpfs,
which needs root to mount (the test skips and says so without it). The appends run in a
child process, since the failure this guards against is a signal."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import tmpfs

REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from storage.index import OffsetIndex, TimeIndex

    disk = Path(sys.argv[1])
    offsets = OffsetIndex(disk / "0.index", 0, 10 * 1024 * 1024)  # sparse: fits
    times = TimeIndex(disk / "0.timeindex", 0, 10 * 1024 * 1024)
    offsets.append(0, 0)
    times.maybe_append(1, 0)
    with open(disk / "filler", "wb") as f:  # take every block that is left
        try:
            while True:
                f.write(b"x" * 65536)
                f.flush()
        except OSError:
            pass
    for name, append in (
        ("offset", lambda n: offsets.append(n, n * 4096)),
        ("time", lambda n: times.maybe_append(n + 1, n)),
    ):
        try:
            for n in range(1, 200_000):
                append(n)
        except OSError as e:
            print(name, "ENOSPC" if e.errno == 28 else e, flush=True)
        else:
            print(name, "no error", flush=True)
    # As after a crash: the offset index is still pre-allocated (sparse), so a load sees
    # every slot as an entry, finds it inconsistent and resets it, with the disk full.
    reopened = OffsetIndex(disk / "0.index", 0, 10 * 1024 * 1024)
    assert reopened.entries == 10 * 1024 * 1024 // 8, reopened.entries
    reopened.reset()
    assert reopened.entries == 0 and reopened.entry(0) == (0, 0)
    print("reset", "ok", flush=True)
    """
)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", 1) as disk:
        yield disk


def test_index_appends_on_a_full_disk_raise_instead_of_sigbus(tiny_disk: Path) -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(tiny_disk)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, f"exit {child.returncode}: {child.stdout}{child.stderr}"
    expected = ["offset ENOSPC", "time ENOSPC", "reset ok"]
    assert child.stdout.split("\n")[:3] == expected, child.stdout
