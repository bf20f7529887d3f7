"""A follower's side of replication: what it does with each fetch answer from its leader.

``apply_fetch_answer`` is the whole of it, synchronous and with no I/O of its own beyond the
partition's log, so the broker's fetcher (``broker/replica_fetcher.py``, which owns the
connection) and the deterministic simulation drive the same code. An answer is records
(appended verbatim with the leader's HW and log start), a diverging epoch (truncate), an
out-of-range error (restart or truncate), or another error (the partition rests).

Truncation decisions (KIP-101, KIP-279, KIP-320) are pure functions.

How this works. A follower never truncates to its high watermark (a stale HW after a
restart loses committed records: KIP-101). It fetches with the epoch of its last batch
(``last_fetched_epoch``); the leader checks that its own log has that epoch ending at or
after the fetch offset, and otherwise answers a *diverging epoch*: the largest epoch it
has at or below the one asked about, and where that epoch ends in its log. The follower
then decides where its log stops agreeing (``truncation_offset``):

* the leader knows no such epoch (epoch -1): the follower's log has nothing in common with
  the leader's above the leader's log start, so it truncates to that;
* the follower has the leader's epoch too: both logs agree up to the smaller of the two
  ends of that epoch;
* the follower has a smaller epoch but not the leader's (fast back-to-back elections,
  KIP-279): it truncates to the end of its own largest epoch below, and fetches again,
  so the leader compares one epoch further back;
* the follower knows no epoch at or below it (an empty epoch cache): the leader's end of
  that epoch.

Never above the follower's own log end. The next fetch carries the new last epoch, so the
exchange repeats until the leader answers with records: each round moves at least one epoch
back, so it ends.

``out_of_range_action`` handles OFFSET_OUT_OF_RANGE: a fetch below the leader's log start
(the leader deleted what the follower still needs) restarts the follower's log at the
leader's log start; one above the leader's log end (an unclean election chose a shorter
log) truncates to the leader's high watermark, which the error answer carries: below the
leader's log end, so the follower loses nothing it cannot fetch again.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import NamedTuple

from replication.errors import OffsetOutOfRange
from replication.partition import Partition
from storage.batch import LOG_OVERHEAD

__all__ = [
    "NO_EPOCH",
    "AnswerOutcome",
    "FetchAnswer",
    "OutOfRangeAction",
    "Outcome",
    "apply_fetch_answer",
    "out_of_range_action",
    "truncation_offset",
    "whole_batches",
]

NO_EPOCH = -1
NO_ERROR = 0
_BATCH_LENGTH = struct.Struct(">q i")  # base offset, batch length


class FetchAnswer(NamedTuple):
    """One partition's part of a leader's fetch response."""

    error_code: int
    high_watermark: int
    log_start_offset: int
    records: memoryview
    diverging: tuple[int, int] | None = None  # (epoch, end offset) when the logs diverge


class Outcome(enum.Enum):
    APPENDED = "appended"  # records (maybe none) appended, HW and log start taken
    TRUNCATED = "truncated"  # a diverging epoch, or above the leader's log end
    RESTARTED = "restarted"  # below the leader's log start: the log starts again empty
    REST = "rest"  # an error: the partition rests before it is fetched again


class AnswerOutcome(NamedTuple):
    outcome: Outcome
    log_end_before: int
    log_end_after: int
    bytes_appended: int = 0


def apply_fetch_answer(partition: Partition, answer: FetchAnswer) -> AnswerOutcome:
    """Apply a leader's answer to a follower ``partition`` (module doc). Raises the
    partition's ReplicationError when the log refuses the leader's batches."""
    log = partition.log
    before = log.log_end_offset
    if answer.error_code == NO_ERROR and answer.diverging is not None:
        epoch, end_offset = answer.diverging
        target = truncation_offset(
            epoch, end_offset, log.end_offset_for_epoch, before, answer.log_start_offset
        )
        if target < log.log_start_offset:
            partition.restart_at(max(answer.log_start_offset, 0))
            return AnswerOutcome(Outcome.RESTARTED, before, log.log_end_offset)
        partition.truncate_to(target)
        return AnswerOutcome(Outcome.TRUNCATED, before, log.log_end_offset)
    if answer.error_code == NO_ERROR:
        data = whole_batches(answer.records)
        partition.append_as_follower(data, answer.high_watermark, answer.log_start_offset)
        return AnswerOutcome(Outcome.APPENDED, before, log.log_end_offset, len(data))
    if answer.error_code == OffsetOutOfRange.code:
        action = out_of_range_action(before, answer.log_start_offset, answer.high_watermark)
        if action.restart:
            partition.restart_at(action.offset)
            return AnswerOutcome(Outcome.RESTARTED, before, log.log_end_offset)
        partition.truncate_to(action.offset)
        return AnswerOutcome(Outcome.TRUNCATED, before, log.log_end_offset)
    return AnswerOutcome(Outcome.REST, before, before)


def whole_batches(records: memoryview) -> memoryview:
    """``records`` without a trailing partial batch (a leader may cut one at its limit)."""
    position, size = 0, len(records)
    while position + LOG_OVERHEAD <= size:
        _, length = _BATCH_LENGTH.unpack_from(records, position)
        end = position + LOG_OVERHEAD + length
        if length < 0 or end > size:
            break
        position = end
    return records[:position]


def truncation_offset(
    leader_epoch: int,
    leader_end_offset: int,
    local_end_for_epoch: Callable[[int], tuple[int, int]],
    log_end_offset: int,
    leader_log_start_offset: int,
) -> int:
    """Where to truncate after a diverging-epoch answer ``(leader_epoch, leader_end_offset)``.
    ``local_end_for_epoch(e)`` is the follower's own answer for epoch ``e``: (its largest
    epoch <= e, where that ends), or (-1, -1)."""
    if leader_epoch == NO_EPOCH or leader_end_offset < 0:
        target = max(leader_log_start_offset, 0)
    else:
        local_epoch, local_end = local_end_for_epoch(leader_epoch)
        if local_epoch == NO_EPOCH or local_end < 0:
            target = leader_end_offset
        elif local_epoch == leader_epoch:
            target = min(leader_end_offset, local_end)
        else:
            target = local_end
    return min(target, log_end_offset)


class OutOfRangeAction(NamedTuple):
    restart: bool  # True: drop the whole log and start empty at ``offset``
    offset: int


def out_of_range_action(
    fetch_offset: int, leader_log_start_offset: int, leader_high_watermark: int
) -> OutOfRangeAction:
    """What a follower does when the leader answers OFFSET_OUT_OF_RANGE (module doc)."""
    if fetch_offset < leader_log_start_offset or leader_high_watermark < leader_log_start_offset:
        return OutOfRangeAction(True, max(leader_log_start_offset, 0))
    return OutOfRangeAction(False, min(fetch_offset, leader_high_watermark))
