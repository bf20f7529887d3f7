"""The logs of one node across its data directories, with the per-directory checkpoints.

Each data directory holds partition directories (``<topic>-<partition>``) and these files:

    recovery-point-offset-checkpoint  per partition: first offset not known to be fsynced
    replication-offset-checkpoint     per partition: the high watermark
    log-start-offset-checkpoint       per partition: the log start offset
    cleaner-offset-checkpoint         per partition compaction touched: ``Log.compacted_below``
    .kafka_cleanshutdown              present only between a clean shutdown and the next start
    .lock                             flock-ed while a manager owns the directory (dir_lock)

At start-up the marker is read and removed (so a crash from then on is detected), and every
partition is loaded, recovering it unless the shutdown was clean. The checkpoints are
written by ``run_maintenance``, whenever a log is created or deleted, before compaction
swaps a rewritten segment in (``Log.on_compacted``), and when a
truncation moves a log's recovery point or high watermark down (``Log.on_offsets_lowered``), its
directory's are written before the log can take another append: at once when no event loop
runs in this thread, else by a callback at the loop's next turn, one for all the
truncations of a turn (a follower's truncations come from a fetch answer, and its next
appends only from a later answer, which that callback precedes). An I/O error in a directory
takes that whole directory offline: its logs stop accepting work and the error is reported,
while other directories keep running.

Every data directory is locked (``storage.dir_lock``) before any is loaded and until
``shutdown``: a directory another process holds fails the start with DataDirInUseError, as
Kafka refuses a log directory whose ``.lock`` another instance holds.

Not thread-safe: one owner (the node) calls these methods; each Log has its own lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from storage.checkpoint import OffsetCheckpointFile, fsync_path
from storage.cleaner import compact
from storage.config import LogConfig
from storage.descriptors import DescriptorBudget
from storage.dir_lock import DataDirInUseError, DirLock, make_data_dir
from storage.errors import (
    LogDirOfflineError,
    OutOfFileDescriptorsError,
    StorageError,
    out_of_descriptors,
)
from storage.loader import load_log
from storage.log import Log, wall_clock_ms
from storage.topic_partition import TopicPartition, parse_dir_name

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
REPLICATION_CHECKPOINT = "replication-offset-checkpoint"
LOG_START_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
# How often maintenance forgets expired producer ids (Kafka's default for
# producer.id.expiration.check.interval.ms).
PRODUCER_EXPIRATION_CHECK_INTERVAL_MS = 10 * 60 * 1000

_log = logging.getLogger(__name__)


class LogManager:
    """Owns every partition log on a node. See the module docstring."""

    def __init__(
        self,
        data_dirs: Sequence[Path],
        default_config: LogConfig,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        config_for: Callable[[TopicPartition], LogConfig] | None = None,
        foreign_dirs: frozenset[str] = frozenset(),
        descriptors: DescriptorBudget | None = None,
        locked: frozenset[Path] = frozenset(),
    ) -> None:
        """``foreign_dirs``: names of directories in a data dir that are not this manager's
        partition logs although they look like one (the metadata log's). ``locked``: data
        directories the owner has locked already (a node locks the metadata log's before
        opening that log); the manager locks the others."""
        if not data_dirs:
            raise ValueError("at least one data directory is required")
        self.data_dirs = [Path(d) for d in data_dirs]
        self.default_config = default_config
        # Settable until ``startup``: the broker sets it once it knows each topic's configs.
        self.config_for = config_for
        self._foreign_dirs = foreign_dirs
        self._clock = clock
        self.descriptors = descriptors or DescriptorBudget()
        self._logs: dict[TopicPartition, Log] = {}
        self._log_dir: dict[TopicPartition, Path] = {}
        self.offline_dirs: dict[Path, str] = {}
        # Told (from whichever thread found it) when a directory goes offline; the broker
        # stops on it (see broker/runtime.py).
        self.on_dir_offline: Callable[[Path, str], None] | None = None
        self.had_clean_shutdown: dict[Path, bool] = {}
        # Checkpoints are written from the maintenance thread and the broker's event loop
        # (high watermarks every few seconds); each file goes through one temp name.
        self._checkpoint_lock = threading.Lock()
        self._checkpoints_due: set[Path] = set()  # after truncations, at the loop's next turn
        # When maintenance last expired producer ids (None before its first pass: loading a
        # log drops the expired ones, so the first check is an interval after that pass).
        self._producers_expired_ms: int | None = None
        self._locks: list[DirLock] = []
        self._locked_by_owner = locked

    # -- lifecycle -------------------------------------------------------------------------
    def startup(self) -> None:
        """Load every log. A directory that fails to load is offline; running out of file
        descriptors is not a failed disk: OutOfFileDescriptorsError, naming the limit. A
        directory another process holds raises DataDirInUseError before anything is loaded."""
        self._lock_dirs()
        for data_dir in self.data_dirs:
            if data_dir in self.offline_dirs:
                continue
            try:
                self._load_dir(data_dir)
            except (OSError, StorageError) as e:
                if out_of_descriptors(e):
                    self.release_locks()  # a failed start owns nothing
                    raise OutOfFileDescriptorsError(
                        f"{data_dir}: ran out of file descriptors loading its logs "
                        f"({len(self._logs)} logs loaded, limit {self.descriptors.limit}): {e}. "
                        "Every segment keeps its file open; raise the open file limit "
                        "(ulimit -n, LimitNOFILE= for systemd) and start again"
                    ) from e
                self._mark_offline(data_dir, e)

    def _lock_dirs(self) -> None:
        """Lock every data directory (creating it); one that cannot be made or locked for an
        I/O error is offline; one in use elsewhere fails the start, with none kept locked."""
        for data_dir in self.data_dirs:
            if data_dir in self._locked_by_owner:
                continue
            lock = DirLock(data_dir)
            try:
                make_data_dir(data_dir)
                lock.acquire()
            except DataDirInUseError:
                self.release_locks()
                raise
            except OSError as e:
                self._mark_offline(data_dir, e)
                continue
            self._locks.append(lock)

    def release_locks(self) -> None:
        """Let go of the data directories (``shutdown`` does; a crashed process's go with
        it, which a test that abandons a manager imitates with this)."""
        locks, self._locks = self._locks, []
        for lock in locks:
            lock.release()

    def _load_dir(self, data_dir: Path) -> None:
        marker = data_dir / CLEAN_SHUTDOWN_FILE
        clean = marker.exists()
        self.had_clean_shutdown[data_dir] = clean
        recovery = OffsetCheckpointFile(data_dir / RECOVERY_POINT_CHECKPOINT).read()
        hws = OffsetCheckpointFile(data_dir / REPLICATION_CHECKPOINT).read()
        starts = OffsetCheckpointFile(data_dir / LOG_START_CHECKPOINT).read()
        compacted = OffsetCheckpointFile(data_dir / CLEANER_CHECKPOINT).read()
        for child in sorted(data_dir.iterdir()):
            if not child.is_dir() or child.name in self._foreign_dirs:
                continue
            try:
                tp = parse_dir_name(child.name)
            except ValueError:
                continue
            log = load_log(
                child,
                self._config(tp),
                recovery_point=recovery.get(tp, 0),
                log_start_offset=starts.get(tp),
                high_watermark=hws.get(tp),
                compacted_below=compacted.get(tp, 0),
                had_clean_shutdown=clean,
                clock=self._clock,
                on_offline=self._on_log_offline,
            )
            self._watch(log)
            self._logs[tp], self._log_dir[tp] = log, data_dir
        if clean:
            marker.unlink()
            fsync_path(data_dir)
        self.checkpoint(data_dir)

    def shutdown(self) -> None:
        """Close every log cleanly, write the checkpoints and the clean-shutdown markers."""
        for tp, log in list(self._logs.items()):
            if log.offline:
                continue
            try:
                log.close()
            except StorageError as e:
                _log.error("closing %s failed: %s", tp, e)
        for data_dir in self.data_dirs:
            if data_dir in self.offline_dirs:
                continue
            self.checkpoint(data_dir, include_closed=True)
            (data_dir / CLEAN_SHUTDOWN_FILE).touch()
            fsync_path(data_dir)
        self._logs.clear()
        self.release_locks()

    # -- logs ------------------------------------------------------------------------------
    def get_log(self, tp: TopicPartition) -> Log | None:
        return self._logs.get(tp)

    def logs(self) -> dict[TopicPartition, Log]:
        return dict(self._logs)

    def get_or_create_log(self, tp: TopicPartition, config: LogConfig | None = None) -> Log:
        existing = self._logs.get(tp)
        if existing is not None:
            return existing
        data_dir = self._least_loaded_dir()
        self.descriptors.take(str(tp))
        log = load_log(
            data_dir / tp.dir_name(),
            config or self._config(tp),
            clock=self._clock,
            on_offline=self._on_log_offline,
        )
        self._watch(log)
        self._logs[tp], self._log_dir[tp] = log, data_dir
        return log

    def _watch(self, log: Log) -> None:
        log.on_offsets_lowered = self._offsets_lowered
        log.on_compacted = self._compacted

    def delete_log(self, tp: TopicPartition) -> None:
        log = self._logs.pop(tp, None)
        data_dir = self._log_dir.pop(tp, None)
        if log is None or data_dir is None:
            return
        log.abandon()
        shutil.rmtree(log.dir, ignore_errors=True)
        self.checkpoint(data_dir)

    def _least_loaded_dir(self) -> Path:
        online = [d for d in self.data_dirs if d not in self.offline_dirs]
        if not online:
            raise LogDirOfflineError("every data directory is offline")
        if len(online) == 1:
            return online[0]  # the common case: no counting (creating n logs stays O(n))
        counts = {d: 0 for d in online}
        for d in self._log_dir.values():
            if d in counts:
                counts[d] += 1
        return min(online, key=lambda d: (counts[d], str(d)))

    def _config(self, tp: TopicPartition) -> LogConfig:
        return self.config_for(tp) if self.config_for is not None else self.default_config

    # -- periodic work ---------------------------------------------------------------------
    def run_maintenance(
        self, now_ms: int | None = None, stopping: Callable[[], bool] = lambda: False
    ) -> None:
        """One pass of the background duties: time-based flush, retention, compaction,
        checkpoints, and every ``PRODUCER_EXPIRATION_CHECK_INTERVAL_MS`` the expiry of
        producer ids silent for ``producer_id_expiration_ms``. Once ``stopping()`` is true
        the pass ends before its next log (a broker stopping must not wait for a whole pass
        of compaction: its shutdown flushes and checkpoints every log anyway)."""
        now = self._clock() if now_ms is None else now_ms
        expire_producers = self._producer_expiration_due(now)
        for tp, log in list(self._logs.items()):
            if stopping():
                return
            if log.offline:
                continue
            try:
                log.maybe_flush(now)
                # Rolled segments are fsynced here, off the append path (Kafka flushes them
                # on its scheduler too), so a machine crash can only lose the active one.
                log.flush(log.active_segment.base_offset)
                log.delete_old_segments(now)
                if expire_producers:
                    log.expire_producers(now)
                if log.config.compact:
                    self._compact(tp, log, now)
            except LogDirOfflineError as e:
                if not log.closed:  # else: deleted meanwhile (the event loop deletes logs)
                    _log.error("maintenance of %s failed: %s", tp, e)
            except OutOfFileDescriptorsError as e:  # tried again next pass
                _log.error("maintenance of %s failed: %s", tp, e)
        for data_dir in self.data_dirs:
            if data_dir not in self.offline_dirs:
                self.checkpoint(data_dir)

    def _producer_expiration_due(self, now_ms: int) -> bool:
        """Whether this pass expires producer ids: once per check interval, as Kafka's
        scheduler does, since it walks every producer of every log."""
        if self._producers_expired_ms is None:
            self._producers_expired_ms = now_ms
            return False
        if now_ms - self._producers_expired_ms < PRODUCER_EXPIRATION_CHECK_INTERVAL_MS:
            return False
        self._producers_expired_ms = now_ms
        return True

    async def run_periodically(self, interval_ms: int, stop: asyncio.Event) -> None:
        """Run :meth:`run_maintenance` every ``interval_ms`` in a worker thread (its fsyncs
        and compaction block) until ``stop`` is set. The node owns this task."""
        if interval_ms < 1:
            raise ValueError(f"maintenance interval must be at least 1 ms, got {interval_ms}")
        while not stop.is_set():
            await asyncio.to_thread(self.run_maintenance, None, stop.is_set)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_ms / 1000)

    def _compact(self, tp: TopicPartition, log: Log, now_ms: int) -> None:
        """One compaction pass; an I/O error takes the directory offline, any other storage
        error (a corrupt batch, a too-small offset map) is reported and retried next time."""
        try:
            compact(log, now_ms, first_dirty_offset=log.compacted_below)
        except OSError as e:
            if out_of_descriptors(e):
                _log.error("compaction of %s failed: %s (ulimit -n)", tp, e)
                return
            self._mark_offline(self._log_dir[tp], e)
            return
        except LogDirOfflineError:
            raise
        except StorageError as e:
            _log.error("compaction of %s failed: %s", tp, e)
            return

    def _compacted(self, log: Log) -> None:
        """Compaction is about to swap a rewritten segment into ``log`` (the maintenance
        thread): its directory's checkpoints, ``compacted_below`` with them, first. A
        failed write takes the directory offline, and the log refuses the swap."""
        self.checkpoint(log.dir.parent)

    def _offsets_lowered(self, log: Log) -> None:
        """A truncation moved ``log``'s recovery point or high watermark down: write its
        directory's checkpoints before the log takes another append (module doc)."""
        data_dir = log.dir.parent
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.checkpoint(data_dir)
            return
        if data_dir not in self._checkpoints_due:
            self._checkpoints_due.add(data_dir)
            loop.call_soon(self._write_due_checkpoints)

    def _write_due_checkpoints(self) -> None:
        due, self._checkpoints_due = self._checkpoints_due, set()
        self._checkpoint_online(due)

    def checkpoint_dirs_of(self, logs: Iterable[Log]) -> None:
        """Write the checkpoints of every online data directory holding one of ``logs``
        (DeleteRecords before its answer, a follower whose log start its leader moved before
        it says so; blocking: callers on the event loop run it in a worker thread)."""
        self._checkpoint_online({log.dir.parent for log in logs})

    def _checkpoint_online(self, data_dirs: Iterable[Path]) -> None:
        for data_dir in data_dirs:
            if data_dir not in self.offline_dirs:
                self.checkpoint(data_dir)

    def checkpoint(self, data_dir: Path, *, include_closed: bool = False) -> None:
        """Write the four offset checkpoints of ``data_dir``. Thread-safe: one writer at a
        time (each file is written to the same temp name, then renamed)."""
        with self._checkpoint_lock:
            self._checkpoint(data_dir, include_closed)

    def _checkpoint(self, data_dir: Path, include_closed: bool) -> None:
        held = list(self._logs.items())  # one C-level copy: the event loop may add logs
        logs = {tp: log for tp, log in held if self._log_dir.get(tp) == data_dir}
        if not include_closed:
            logs = {tp: log for tp, log in logs.items() if not log.offline}
        try:
            OffsetCheckpointFile(data_dir / RECOVERY_POINT_CHECKPOINT).write(
                {tp: log.recovery_point for tp, log in logs.items()}
            )
            OffsetCheckpointFile(data_dir / REPLICATION_CHECKPOINT).write(
                {tp: log.high_watermark for tp, log in logs.items()}
            )
            OffsetCheckpointFile(data_dir / LOG_START_CHECKPOINT).write(
                {tp: log.log_start_offset for tp, log in logs.items()}
            )
            OffsetCheckpointFile(data_dir / CLEANER_CHECKPOINT).write(
                {tp: log.compacted_below for tp, log in logs.items() if log.compacted_below}
            )
        except OSError as e:
            if out_of_descriptors(e):  # a limit, not a failed disk: written again next time
                _log.error("checkpoints of %s not written: %s (ulimit -n)", data_dir, e)
                return
            self._mark_offline(data_dir, e)

    # -- failures --------------------------------------------------------------------------
    def _on_log_offline(self, log_dir: Path, error: BaseException) -> None:
        self._mark_offline(log_dir.parent, error)

    def _mark_offline(self, data_dir: Path, error: BaseException) -> None:
        if data_dir in self.offline_dirs:
            return
        self.offline_dirs[data_dir] = str(error)
        _log.error("data directory %s is offline: %s", data_dir, error)
        for tp, d in self._log_dir.items():
            if d == data_dir:
                log = self._logs.get(tp)
                if log is not None and not log.offline:
                    log.abandon()
        if self.on_dir_offline is not None:
            self.on_dir_offline(data_dir, str(error))
