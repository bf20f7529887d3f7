"""The lock that makes a data directory one process's: ``<data dir>/.lock`` (Kafka's name).

How this works. The owner of a data directory (a node's ``LogManager``, or ``runnel log
produce`` writing into a partition of one) opens ``.lock`` and takes an exclusive
``flock`` on it without waiting; if another open file holds it, ``DataDirInUseError`` says
so at once (a second node on the same directory, or the log tool on a running node's
partition, would each append where the other appends and corrupt the log). The lock is the
open file's: it goes with ``release`` or with the process, however it ends (a crash or
SIGKILL frees it, so no stale lock is ever left to clean up). The file also holds the pid of
the last owner, for the error message only; it is never trusted as the lock itself.

Not thread-safe: one owner takes and releases a lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

from storage.errors import StorageError

__all__ = ["LOCK_FILE", "DataDirInUseError", "DirLock", "make_data_dir"]

LOCK_FILE = ".lock"


class DataDirInUseError(StorageError):
    """Another process (or another owner in this one) holds the data directory's lock."""


def make_data_dir(path: Path) -> None:
    """Create ``path`` (and its parents) if missing; a file there is "not a directory", not
    mkdir's "File exists"."""
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
    path.mkdir(parents=True, exist_ok=True)


class DirLock:
    """An exclusive lock on one data directory, held from ``acquire`` until ``release``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock now (creating the file), or raise DataDirInUseError."""
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            owner = _read_owner(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise DataDirInUseError(
                f"{self.data_dir} is in use by another process{owner}: its {LOCK_FILE} is "
                "locked (a node or a log tool works in it; stop that first)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Let go of the lock (the file stays: it is not the lock, its flock is)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _read_owner(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        pid = int(os.pread(fd, 32, 0).decode().strip())
        return f" (pid {pid})"
    return ""
