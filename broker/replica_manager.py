"""The broker's partition replicas, kept in step with the metadata image.

How this works. ``apply(image)`` is called with every metadata image the broker has caught
up to (never a stale one; the first once the broker has caught up and the ``LogManager``
has loaded the logs). Images share every unchanged ``TopicImage`` object, so the diff against
the previous image is one identity check per topic, and only changed topics are walked (with
one identity check per partition, since unchanged ``PartitionState`` objects are shared too):

* a partition with this broker among its replicas gets its log (created with the topic's
  log config if missing), a ``partition.metadata`` file naming its topic id, and then
  ``make_leader`` or ``make_follower`` with its new state;
* a partition no longer assigned here, or whose topic was deleted, stops serving and its
  log is deleted;
* a log directory that holds another topic id than the image's (the topic was deleted and
  created again under the same name while this broker was away) is deleted and started
  afresh;
* on the first apply only (of an image built from records, not the empty one), every
  loaded log the image does not assign here (its topic is gone, its partition moved away,
  or its topic id is another's) is a stray: deleted, and each logged;
* a topic config change (or a dynamic broker default: ``log.retention.ms`` ...) updates the
  partitions' log configs and ``min.insync.replicas``.

A partition assigned here whose log cannot be had (file descriptors ran short, see
``storage.descriptors``, or its data directory failed) is not served, and is remembered as
unserved: ``retry_unserved``, which the broker calls every ``UNSERVED_RETRY_INTERVAL_MS``,
tries those again with their state in the current image, so they are served once
descriptors are free again (a topic deleted, the limit raised) without waiting for their
topic to change. A pass stops at the first refusal for descriptors (the rest would be
refused too, and each try costs a log lookup) and after ``max_new_logs_per_apply`` new logs.

Whenever a partition's leader or leader epoch changes, or it goes away, long-polling fetches
parked on it in the purgatory are woken, so they answer with the new state at once. When
this broker becomes a partition's leader, or its replicas change while it leads, the other
replicas are awaited (``broker.awaited_followers``: their parked fetches are woken, and
their long polls kept short until they fetch the partition).

Topic configs. A partition's log config is the node's ``[log]`` defaults, overlaid with the
dynamic cluster-wide and then this broker's broker configs (Kafka's broker names,
``controller.configs.BROKER_CONFIGS``), then the topic's own configs, read with the
controller's own parser (``controller.configs.topic_log_config``) so that both sides read the
committed text the same way. Kafka names that storage has no setting for (for example
``compression.type``: batches are stored as produced) and unknown names are ignored.

``partition.metadata`` is Kafka's file (text, two lines)::

    version: 0
    topic_id: <the topic id in URL-safe base64 without padding, 22 characters>

It is written atomically and fsynced before the partition serves, so data is never appended
to a log whose topic id could be lost in a crash.

Cost. Applying an image that changes nothing here costs microseconds (one identity check per
topic); a one-partition change about 0.1 ms. Creating a log is file work on the event loop:
a directory, segment files, an fdatasync of the new segment and two fsyncs for
``partition.metadata``, plus ``LogManager``'s choice of data directory, which counts every
log it has (O(logs) per creation, so O(n^2) for n new logs). Measured on one ext4 disk: 1,000
new partitions in one apply take about 3.5 s, 10,000 about 46 s (more than half of it that
directory choice). The broker answers nothing meanwhile, heartbeats included, so creating
thousands of partitions at once can get the broker fenced; the cure (per-directory counts in
``LogManager``, log creation in a worker thread) belongs to a later change. Deleting a log
removes its files at once (``LogManager.delete_log``).

Concurrency: not thread-safe; the broker's event loop calls everything.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from broker.awaited_followers import AwaitedFollowers
from broker.purgatory import FetchPurgatory
from controller.configs import TOPIC_CONFIGS, broker_entries_as_topic, topic_log_config
from controller.image import MetadataImage, PartitionState, TopicImage
from controller.outcome import DecisionError
from controller.records import ConfigResourceType
from replication.partition import (
    DEFAULT_REPLICA_LAG_TIME_MAX_MS,
    IsrProposer,
    Partition,
    Role,
)
from storage.checkpoint import write_file_atomic
from storage.config import LogConfig
from storage.errors import OutOfFileDescriptorsError, StorageError
from storage.log import Log
from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition

__all__ = [
    "PARTITION_METADATA_FILE",
    "ReplicaManager",
    "TopicSettings",
    "read_partition_metadata",
    "topic_id_text",
    "topic_settings",
    "write_partition_metadata",
]

_log = logging.getLogger(__name__)

PARTITION_METADATA_FILE = "partition.metadata"
PARTITION_METADATA_VERSION = 0
TOPIC_ID_BYTES = 16
DEFAULT_MIN_INSYNC_REPLICAS = 1  # Kafka's
_MIN_ISR = "min.insync.replicas"
_TOPIC = int(ConfigResourceType.TOPIC)
_BROKER = int(ConfigResourceType.BROKER)
_CLUSTER_DEFAULT = ""  # the resource name of the cluster-wide broker configs
# New logs one ``apply`` creates (a few ms each, with fsyncs): more wait for the next call,
# so an image with thousands of new partitions here cannot stall the event loop for seconds.
MAX_NEW_LOGS_PER_APPLY = 200
REFUSED_SUMMARY_INTERVAL_MS = 10_000  # logs refused for descriptors: one line at most this often
UNSERVED_RETRY_INTERVAL_MS = 5_000  # how often the broker calls ``retry_unserved``


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


# -- partition.metadata ----------------------------------------------------------------------


def topic_id_text(topic_id: bytes) -> str:
    """Kafka's ``Uuid.toString``: URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(topic_id).rstrip(b"=").decode("ascii")


def _parse_topic_id(text: str) -> bytes:
    try:
        topic_id = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"topic id {text!r} is not base64: {e}") from None
    if len(topic_id) != TOPIC_ID_BYTES or topic_id_text(topic_id) != text:
        raise ValueError(f"topic id {text!r} is not 16 bytes in Kafka's encoding")
    return topic_id


def write_partition_metadata(log_dir: Path, topic_id: bytes) -> None:
    text = f"version: {PARTITION_METADATA_VERSION}\ntopic_id: {topic_id_text(topic_id)}\n"
    write_file_atomic(log_dir / PARTITION_METADATA_FILE, text.encode("ascii"), fsync=True)


def read_partition_metadata(log_dir: Path) -> bytes | None:
    """The topic id in ``log_dir``'s ``partition.metadata``; None without the file. Raises
    ValueError for a file that is not Kafka's format."""
    try:
        text = (log_dir / PARTITION_METADATA_FILE).read_text("ascii")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as e:
        raise ValueError(f"{log_dir / PARTITION_METADATA_FILE}: not text: {e}") from None
    lines = text.splitlines()
    if len(lines) != 2 or lines[0] != f"version: {PARTITION_METADATA_VERSION}":
        raise ValueError(f"{log_dir / PARTITION_METADATA_FILE}: not version 0: {text!r}")
    key, sep, value = lines[1].partition(": ")
    if key != "topic_id" or not sep:
        raise ValueError(f"{log_dir / PARTITION_METADATA_FILE}: no topic_id line: {text!r}")
    return _parse_topic_id(value)


def _topic_id_on_disk(log: Log) -> bytes | None:
    try:
        return read_partition_metadata(log.dir)
    except (OSError, ValueError) as e:
        _log.warning("%s: unreadable, written again: %s", PARTITION_METADATA_FILE, e)
        return None


# -- topic configs ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """What a topic's configs mean for its replicas here."""

    log_config: LogConfig
    min_insync_replicas: int


def topic_settings(
    image: MetadataImage, topic: str, broker_id: int, log_defaults: LogConfig
) -> TopicSettings:
    """The settings of ``topic``'s partitions on ``broker_id`` (module doc: the layers).
    Entries that do not parse (a newer controller's, or no longer valid over these
    defaults) are logged and the defaults used instead."""
    entries = broker_entries_as_topic(image, _CLUSTER_DEFAULT)
    entries.update(broker_entries_as_topic(image, str(broker_id)))
    entries.update(image.configs.get((_TOPIC, topic), {}))
    known = {k: v for k, v in entries.items() if k in TOPIC_CONFIGS}
    try:
        log_config = topic_log_config(known, log_defaults)
        min_isr = DEFAULT_MIN_INSYNC_REPLICAS
        if _MIN_ISR in known:
            min_isr = TOPIC_CONFIGS[_MIN_ISR].parse(known[_MIN_ISR])
    except (DecisionError, ValueError) as e:
        _log.error("topic %s: configs %s do not apply (%s): using the defaults", topic, known, e)
        return TopicSettings(log_defaults, DEFAULT_MIN_INSYNC_REPLICAS)
    return TopicSettings(log_config, min_isr)


@dataclass(frozen=True, slots=True)
class _ConfigChanges:
    every_topic: bool  # a broker-level default changed
    topics: frozenset[str]


def _config_changes(before: MetadataImage, after: MetadataImage, broker_id: int) -> _ConfigChanges:
    """Which topics' settings may differ: one identity check per config resource, as the
    image shares unchanged config mappings."""
    if after.configs is before.configs:
        return _ConfigChanges(False, frozenset())
    changed = {k for k, v in after.configs.items() if before.configs.get(k) is not v}
    changed.update(k for k in before.configs if k not in after.configs)
    every = any(k[0] == _BROKER and k[1] in (_CLUSTER_DEFAULT, str(broker_id)) for k in changed)
    return _ConfigChanges(every, frozenset(name for kind, name in changed if kind == _TOPIC))


# -- the manager -----------------------------------------------------------------------------


class ReplicaManager:
    """This broker's partitions, from the metadata image. See the module docstring."""

    def __init__(
        self,
        broker_id: int,
        log_manager: LogManager,
        *,
        purgatory: FetchPurgatory | None = None,
        replica_purgatory: FetchPurgatory | None = None,
        log_defaults: LogConfig | None = None,
        replica_lag_time_max_ms: int = DEFAULT_REPLICA_LAG_TIME_MAX_MS,
        clock_ms: Callable[[], int] = monotonic_ms,
    ) -> None:
        self.broker_id = broker_id
        self.log_manager = log_manager
        self.purgatory = purgatory  # may be set after construction; woken and notified
        self.replica_purgatory = replica_purgatory  # follower fetches: woken on appends
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.clock_ms = clock_ms
        self.awaited = AwaitedFollowers(clock_ms)  # followers of partitions newly led here
        # Set by the broker: ISR proposals (AlterPartition), and the follower fetchers
        # told of each partition that starts or stops following a leader.
        self.propose_isr: IsrProposer | None = None
        self.on_follow: Callable[[Partition], None] | None = None
        self.on_unfollow: Callable[[Partition], None] | None = None
        self.log_defaults = log_defaults or log_manager.default_config
        self.strays_deleted = 0
        self._strays_pending = True
        self.max_new_logs_per_apply = MAX_NEW_LOGS_PER_APPLY
        # Assigned here, log not had: tried again by ``retry_unserved``. The value: whether
        # an error line was written for it (said once per partition).
        self._unserved: dict[TopicPartition, bool] = {}
        self._apply_unfinished = False
        self._refused = 0  # logs refused for descriptors since the last summary
        self._refused_why = ""
        self._refused_said_ms = -REFUSED_SUMMARY_INTERVAL_MS
        self._new_logs_left = 0
        self._image: MetadataImage | None = None
        self._topics: dict[str, dict[int, Partition]] = {}  # by topic name, partition id
        self._names: dict[bytes, str] = {}  # topic id -> name, for topics held here
        self._settings: dict[str, TopicSettings] = {}  # by topic name, cleared on changes

    @property
    def image(self) -> MetadataImage | None:
        """The image last applied."""
        return self._image

    def get(self, topic: str, partition: int) -> Partition | None:
        held = self._topics.get(topic)
        return None if held is None else held.get(partition)

    def get_by_id(self, topic_id: bytes, partition: int) -> Partition | None:
        name = self._names.get(topic_id)
        return None if name is None else self.get(name, partition)

    def partitions(self) -> list[Partition]:
        return [p for held in self._topics.values() for p in held.values()]

    # -- applying an image ---------------------------------------------------------------------
    def apply(self, image: MetadataImage) -> bool:
        """Make this broker's partitions what ``image`` says (module doc). False when it
        stopped after ``max_new_logs_per_apply`` new logs: call again (with this image or a
        newer one) to go on; everything done so far is kept and not done twice."""
        previous = self._image
        if image is previous:
            return True
        before = MetadataImage.EMPTY if previous is None else previous
        self._image = image
        self._new_logs_left = self.max_new_logs_per_apply
        configs = _config_changes(before, image, self.broker_id)
        if configs.every_topic:
            self._settings.clear()
        for name in configs.topics:
            self._settings.pop(name, None)
        if self._strays_pending and image.offset >= 0:
            # Not on an image of nothing (offset -1): that is no proof the logs are strays.
            self._strays_pending = False
            self._delete_strays(image)
        if image.topics is not before.topics:
            for topic_id, old in before.topics.items():
                if topic_id not in image.topics:
                    self._remove_topic(old, "topic deleted")
            for topic_id, topic in image.topics.items():
                old_topic = before.topics.get(topic_id)
                if old_topic is not topic:
                    self._apply_topic(topic, old_topic)
        if previous is not None:  # (the first apply created every partition with them)
            names = self._topics.keys() if configs.every_topic else configs.topics
            for name in list(names):
                self._update_settings(name)
        self._summarise_refusals()
        self._apply_unfinished = self._new_logs_left < 0
        if self._apply_unfinished:  # stopped early: the next call diffs from ``previous``
            self._image = previous
            return False
        return True

    @property
    def unserved(self) -> frozenset[TopicPartition]:
        """Partitions assigned here whose logs could not be had (not served)."""
        return frozenset(self._unserved)

    def retry_unserved(self) -> bool:
        """Try again to serve the unserved partitions (module doc) that the applied image
        still assigns here. False when it stopped after ``max_new_logs_per_apply`` new logs
        (call again soon); nothing while an apply is unfinished (it handles them)."""
        image = self._image
        if image is None or not self._unserved or self._apply_unfinished:
            return True
        self._new_logs_left = self.max_new_logs_per_apply
        for tp in list(self._unserved):
            topic = image.topic_by_name(tp.topic)
            state = None if topic is None else topic.partitions.get(tp.partition)
            if topic is None or state is None or self.broker_id not in state.replicas:
                del self._unserved[tp]  # deleted or moved away meanwhile
                continue
            refused = self._refused
            self._apply_partition(topic, state)
            if self._refused != refused:
                break  # out of descriptors: the rest would be refused too
            if self._new_logs_left < 0:
                return False
        self._summarise_refusals()
        return True

    def _summarise_refusals(self) -> None:
        now_ms = self.clock_ms()
        if self._refused and now_ms - self._refused_said_ms >= REFUSED_SUMMARY_INTERVAL_MS:
            _log.error(
                "%d logs of partitions assigned here refused since the last summary; they "
                "are not served here (tried again every %d s). The last: %s",
                self._refused,
                UNSERVED_RETRY_INTERVAL_MS // 1000,
                self._refused_why,
            )
            self._refused, self._refused_said_ms = 0, now_ms

    def _apply_topic(self, topic: TopicImage, old: TopicImage | None) -> None:
        for partition_id, state in topic.partitions.items():
            if old is not None and old.partitions.get(partition_id) is state:
                continue
            if self.broker_id in state.replicas:
                self._apply_partition(topic, state)
            else:
                self._remove(topic.name, partition_id, f"moved to brokers {state.replicas}")
        if old is not None:
            for partition_id in old.partitions.keys() - topic.partitions.keys():
                self._remove(topic.name, partition_id, "partition removed")

    def _apply_partition(self, topic: TopicImage, state: PartitionState) -> None:
        partition = self.get(topic.name, state.partition_id)
        if partition is not None and partition.topic_id != topic.topic_id:
            self._remove(topic.name, state.partition_id, "topic created again")
            partition = None
        if partition is None:
            if self._new_logs_left <= 0:
                self._new_logs_left = -1
                return  # over this call's budget (apply returns False)
            partition = self._create(topic, state.partition_id)
            if partition is None:
                return  # refused (logged): not counted, or refusals could fill every call
            self._new_logs_left -= 1
        before = (partition.role, partition.leader_id, partition.leader_epoch)
        replicas_before = partition.replicas if partition.role is Role.LEADER else ()
        if state.leader == self.broker_id:
            partition.make_leader(state, now_ms=self.clock_ms())
        else:
            partition.make_follower(state)
        if before != (partition.role, partition.leader_id, partition.leader_epoch):
            self._wake(partition.key)
            self._roles_changed(partition)
        if partition.role is Role.LEADER:
            if partition.replicas != replicas_before:
                self._await_followers(partition)
        elif before[0] is Role.LEADER:
            self.awaited.forget(partition.key)

    def _await_followers(self, partition: Partition) -> None:
        """Newly led here (or with new replicas): wake the followers' parked fetches and
        keep their polls short until they fetch it (``broker.awaited_followers``)."""
        followers = [r for r in partition.replicas if r != self.broker_id]
        self.awaited.expect(partition.key, followers)
        self.wake_followers(partition)

    def wake_followers(self, partition: Partition) -> None:
        """Answer the parked fetches of ``partition``'s followers now: they must hear of a
        change that appended nothing (a new leader, a new log start offset)."""
        if self.replica_purgatory is not None:
            for follower in partition.replicas:
                if follower != self.broker_id:
                    self.replica_purgatory.wake_owner(follower)

    def _roles_changed(self, partition: Partition) -> None:
        """Tell the fetchers: a follower (again, or of a new leader or epoch) fetches from
        its leader; a leader or a stopped replica fetches from nobody."""
        if partition.role is Role.FOLLOWER and partition.leader_id >= 0:
            if self.on_follow is not None:
                self.on_follow(partition)
        elif self.on_unfollow is not None:
            self.on_unfollow(partition)

    def _create(self, topic: TopicImage, partition_id: int) -> Partition | None:
        """The replica of a partition newly assigned here, on its log (found or created);
        None (logged) if the log cannot be had: its data directory is offline."""
        tp = TopicPartition(topic.name, partition_id)
        settings = self._topic_settings(topic.name)
        log = self.log_manager.get_log(tp)
        on_disk = None if log is None else _topic_id_on_disk(log)
        if log is not None and on_disk is not None and on_disk != topic.topic_id:
            _log.warning(
                "%s holds topic id %s, not %s (the topic was deleted and created again): "
                "deleting the old log",
                tp,
                topic_id_text(on_disk),
                topic_id_text(topic.topic_id),
            )
            self.log_manager.delete_log(tp)
            log, on_disk = None, None
        try:
            if log is None:
                log = self.log_manager.get_or_create_log(tp, settings.log_config)
            else:
                log.config = settings.log_config
            if on_disk is None:
                write_partition_metadata(log.dir, topic.topic_id)
        except OutOfFileDescriptorsError as e:  # many at once: a summary now and then
            self._refused += 1
            self._refused_why = str(e)
            self._unserved.setdefault(tp, False)
            return None
        except (StorageError, OSError) as e:
            # Tried again by each call of a long apply and by ``retry_unserved``: said once
            # per partition.
            if not self._unserved.get(tp):
                _log.error(
                    "cannot serve %s: %s (tried again every %d s)",
                    tp,
                    e,
                    UNSERVED_RETRY_INTERVAL_MS // 1000,
                )
            self._unserved[tp] = True
            return None
        self._unserved.pop(tp, None)
        partition = Partition(
            topic.name,
            topic.topic_id,
            partition_id,
            log,
            local_broker_id=self.broker_id,
            min_insync_replicas=settings.min_insync_replicas,
            replica_lag_time_max_ms=self.replica_lag_time_max_ms,
        )
        partition.on_append.append(self._notify)
        partition.on_log_append.append(self._notify_replicas)
        partition.propose_isr = self._propose_isr
        self._topics.setdefault(topic.name, {})[partition_id] = partition
        self._names[topic.topic_id] = topic.name
        return partition

    def _remove_topic(self, topic: TopicImage, reason: str) -> None:
        held = self._topics.get(topic.name)
        if held is None:
            return
        for partition_id, partition in list(held.items()):
            if partition.topic_id == topic.topic_id:
                self._remove(topic.name, partition_id, reason)

    def _remove(self, topic: str, partition_id: int, reason: str) -> None:
        """Stop serving a partition held here and delete its log (no-op if not held)."""
        self._unserved.pop(TopicPartition(topic, partition_id), None)
        held = self._topics.get(topic)
        partition = None if held is None else held.pop(partition_id, None)
        if partition is None or held is None:
            return
        if not held:
            del self._topics[topic]
            self._names.pop(partition.topic_id, None)
            self._settings.pop(topic, None)
        partition.stop()
        self._wake(partition.key)
        self.awaited.forget(partition.key)
        self._roles_changed(partition)
        self.log_manager.delete_log(TopicPartition(topic, partition_id))
        _log.info("deleted %s-%d (%s)", topic, partition_id, reason)

    def _delete_strays(self, image: MetadataImage) -> None:
        for tp, log in self.log_manager.logs().items():
            reason = self._stray_reason(image, tp, log)
            if reason is not None:
                _log.warning("deleting stray log %s: %s", tp, reason)
                self.log_manager.delete_log(tp)
                self.strays_deleted += 1

    def _stray_reason(self, image: MetadataImage, tp: TopicPartition, log: Log) -> str | None:
        topic = image.topic_by_name(tp.topic)
        if topic is None:
            return "its topic is not in the metadata"
        state = topic.partitions.get(tp.partition)
        if state is None:
            return f"topic {tp.topic} has no partition {tp.partition}"
        if self.broker_id not in state.replicas:
            return f"assigned to brokers {state.replicas}, not {self.broker_id}"
        on_disk = _topic_id_on_disk(log)
        if on_disk is not None and on_disk != topic.topic_id:
            return f"topic id {topic_id_text(on_disk)} is a deleted topic's"
        return None

    # -- configs ---------------------------------------------------------------------------------
    def _topic_settings(self, topic: str) -> TopicSettings:
        settings = self._settings.get(topic)
        if settings is None:
            image = MetadataImage.EMPTY if self._image is None else self._image
            settings = topic_settings(image, topic, self.broker_id, self.log_defaults)
            self._settings[topic] = settings
        return settings

    def _update_settings(self, topic: str) -> None:
        held = self._topics.get(topic)
        if not held:
            return
        settings = self._topic_settings(topic)
        for partition in held.values():
            if partition.role is not Role.STOPPED:
                partition.update_config(settings.log_config, settings.min_insync_replicas)

    # -- the purgatory ---------------------------------------------------------------------------
    def _notify(self, key: tuple[str, int], bytes_appended: int) -> None:
        if self.purgatory is not None:
            self.purgatory.notify(key, bytes_appended)

    def _notify_replicas(self, key: tuple[str, int], bytes_appended: int) -> None:
        if self.replica_purgatory is not None:
            self.replica_purgatory.notify(key, bytes_appended)

    def _wake(self, key: tuple[str, int]) -> None:
        for purgatory in (self.purgatory, self.replica_purgatory):
            if purgatory is not None:
                purgatory.wake(key)

    def _propose_isr(self, partition: Partition, isr: tuple[int, ...]) -> bool:
        return self.propose_isr is not None and self.propose_isr(partition, isr)

    # -- the leader's periodic duty --------------------------------------------------------------
    def shrink_isrs(self) -> int:
        """Propose smaller ISRs where followers lag (Kafka runs this every half
        ``replica_lag_time_max_ms``); returns how many partitions proposed one."""
        now_ms, proposed = self.clock_ms(), 0
        for partition in self.partitions():
            if partition.is_leader and partition.maybe_shrink_isr(now_ms):
                proposed += 1
        return proposed
