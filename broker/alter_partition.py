"""ISR changes a leader proposes, sent to the active controller as AlterPartition.

How this works. A leader ``Partition`` asks ``propose(partition, isr)`` when a follower has
caught up (expand) or fallen behind (shrink). The proposal names the partition's leader and
partition epochs and each member's broker epoch from this broker's metadata image; the
request names the leader's broker epoch. The controller refuses the request if that epoch
is stale, and a change if another epoch is stale or any member of the proposed ISR is fenced
or shutting down; it commits the rest before answering.

Proposals are batched as Kafka's AlterPartitionManager does: one request in flight at a
time carries every proposal that is due (at most ``MAX_CHANGES_PER_REQUEST``), and those
made meanwhile go in the next one. When a broker comes back after an outage its leaders
propose it back into the ISR of every partition they share at once, so this is one
request and one metadata commit per batch rather than per partition.

While a proposal is pending the leader's high watermark counts both the old and the new
ISR, so what happens to an answer matters for safety (Kafka's rules):

* committed: the answer's partition state is given to the partition at once
  (``isr_change_committed``), before the metadata image brings the same record;
* refused for good (INELIGIBLE_REPLICA, INVALID_REQUEST: checked at the epochs the leader
  holds, nothing written): the proposal ends (``isr_change_failed``) and the partition may
  propose again after ``retry_backoff_ms``;
* no answer, REQUEST_TIMED_OUT, or a refusal that says this broker's view is behind
  (INVALID_UPDATE_VERSION, FENCED_LEADER_EPOCH, STALE_BROKER_EPOCH, ...): the change may
  have been committed, or the image has not caught up. The proposal stays pending and is
  sent again after ``retry_backoff_ms`` (with this broker's current broker epoch) until an
  answer or the image ends it: an image with a newer partition epoch (or another leader)
  ends every pending proposal. Ending it on a lost answer instead would let the HW stop
  counting a replica the controller had put into the ISR, which could then be elected
  leader without the records the HW had committed (the replication simulation found it).

A proposal is not sent (``propose`` returns False) when a member is unknown to the image, a
joining member is fenced or in controlled shutdown (the controller would refuse it) or its
latest fetch said another broker epoch than the image's (KIP-903: a fetch of a previous
incarnation, which may have had records the restarted broker lost; a fetch that says
none, below v15, is taken as before), the
partition is resting after a refusal, or ``max_pending`` proposals are outstanding.

Concurrency: asyncio, the broker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from controller.client import ControllerClient, ControllerUnavailable
from controller.image import MetadataImage
from proto import controller_pb2 as cpb
from proto import metadata_pb2 as mpb
from replication.partition import Partition, PartitionKey

__all__ = ["AlterPartitionSender", "CommittedPartition"]

_log = logging.getLogger(__name__)

DEFAULT_MAX_PENDING = 100_000  # proposals waiting for an answer (one per partition at most)
MAX_CHANGES_PER_REQUEST = 1000  # about 50 bytes each: a request stays far below gRPC's 4 MiB
# Refusals checked at the epochs the leader holds, with nothing written.
_REFUSED_FOR_GOOD = frozenset({cpb.INELIGIBLE_REPLICA, cpb.INVALID_REQUEST})
DEFAULT_RETRY_BACKOFF_MS = 1000


class CommittedPartition(NamedTuple):
    """The partition state in an AlterPartition answer (a ``PartitionStateView``)."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int


@dataclass(slots=True)
class _Proposal:
    partition: Partition
    isr: tuple[int, ...]
    change: cpb.IsrChange

    @property
    def pending(self) -> bool:
        return self.partition.proposal_pending(self.isr, self.change.partition_epoch)


class AlterPartitionSender:
    def __init__(
        self,
        broker_id: int,
        controller: ControllerClient,
        broker_epoch: Callable[[], int],
        image: Callable[[], MetadataImage],
        clock_ms: Callable[[], int],
        *,
        max_pending: int = DEFAULT_MAX_PENDING,
        retry_backoff_ms: int = DEFAULT_RETRY_BACKOFF_MS,
    ) -> None:
        self.broker_id = broker_id
        self.controller = controller
        self.broker_epoch = broker_epoch
        self.image = image
        self.clock_ms = clock_ms
        self.max_pending = max_pending
        self.retry_backoff_ms = retry_backoff_ms
        self.sent = 0  # proposals
        self.requests = 0
        self.refused = 0  # answers that did not commit a change (each change counted)
        self._pending: dict[PartitionKey, _Proposal] = {}  # the latest per partition
        # Where each pending proposal waits: to be sent, or until its backoff ends (a heap
        # by time). A proposal superseded or ended meanwhile is dropped when it comes up,
        # so a request costs its own proposals, not a walk over every pending one.
        self._ready: deque[_Proposal] = deque()
        self._backing_off: list[tuple[float, int, _Proposal]] = []
        self._order = itertools.count()
        self._resting: dict[PartitionKey, int] = {}  # until when (ms), after a failure
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def propose(self, partition: Partition, isr: tuple[int, ...]) -> bool:
        key = partition.key
        if len(self._pending) >= self.max_pending or self._resting.get(key, 0) > self.clock_ms():
            return False
        members = self._members(partition, isr)
        if members is None:
            return False
        change = cpb.IsrChange(
            topic_id=partition.topic_id,
            partition_id=partition.partition_id,
            leader_epoch=partition.leader_epoch,
            partition_epoch=partition.partition_epoch,
            new_isr=members,
        )
        proposal = self._pending[key] = _Proposal(partition, isr, change)  # replaces an ended one
        self._ready.append(proposal)
        self.sent += 1
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="alter-partition")
        self._wake.set()
        return True

    def _members(self, partition: Partition, isr: tuple[int, ...]) -> list[cpb.IsrMember] | None:
        brokers = self.image().brokers
        members = []
        for broker_id in isr:
            reg = brokers.get(broker_id)
            if reg is None:
                return None
            joining = broker_id not in partition.isr
            if joining and (reg.fenced or reg.in_controlled_shutdown):
                return None
            fetched = partition.follower_broker_epoch(broker_id) if joining else -1
            if fetched >= 0 and fetched != reg.broker_epoch:
                return None  # KIP-903: its fetches came from another incarnation
            members.append(cpb.IsrMember(broker_id=broker_id, broker_epoch=reg.broker_epoch))
        return members

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now_s = loop.time()
            while self._backing_off and self._backing_off[0][0] <= now_s:
                self._ready.append(heapq.heappop(self._backing_off)[2])
            due: list[_Proposal] = []
            while self._ready and len(due) < MAX_CHANGES_PER_REQUEST:
                proposal = self._ready.popleft()
                key = proposal.partition.key
                if self._pending.get(key) is not proposal:
                    continue  # answered, or superseded by a newer proposal
                if not proposal.pending:
                    del self._pending[key]  # ended by the image (or a newer answer)
                    continue
                due.append(proposal)
            if due:
                try:
                    await self._send(due)
                except Exception as e:  # a bug: logged, and the proposals asked again
                    _log.exception("AlterPartition failed")
                    self._again(due, repr(e))
                continue
            self._wake.clear()
            timeout_s = None
            if self._backing_off:
                timeout_s = max(0.0, self._backing_off[0][0] - now_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout_s)

    async def _send(self, due: list[_Proposal]) -> None:
        request = cpb.AlterPartitionRequest(
            broker_id=self.broker_id,
            broker_epoch=self.broker_epoch(),
            changes=[proposal.change for proposal in due],
        )
        self.requests += 1
        try:
            response = await self.controller.call("AlterPartition", request)
        except (ControllerUnavailable, OSError) as e:
            self._again(due, f"no answer: {e}")
            return
        error = response.header.error
        if error != cpb.NONE:  # the request as a whole: this broker's view may be behind
            self.refused += len(due)
            self._again(due, f"{cpb.ErrorCode.Name(error)}: {response.header.message}")
            return
        if len(response.results) != len(due):
            _log.error(
                "AlterPartition: %d results for %d changes; asking again",
                len(response.results),
                len(due),
            )
            self._again(due, "a malformed answer")
            return
        for proposal, result in zip(due, response.results, strict=True):
            self._answered(proposal, result)

    def _answered(self, proposal: _Proposal, result: cpb.IsrChangeResult) -> None:
        partition, isr = proposal.partition, proposal.isr
        if result.error == cpb.NONE:
            self._done(proposal)
            self._committed(partition, result.partition, isr)
            return
        self.refused += 1
        why = f"{cpb.ErrorCode.Name(result.error)}: {result.message}"
        if result.error in _REFUSED_FOR_GOOD:
            self._done(proposal)
            self._failed(partition, why, isr, proposal.change.partition_epoch)
        else:
            self._again([proposal], why)

    def _done(self, proposal: _Proposal) -> None:
        key = proposal.partition.key
        if self._pending.get(key) is proposal:  # not a newer proposal made meanwhile
            del self._pending[key]

    def _again(self, proposals: list[_Proposal], why: str) -> None:
        """Still pending (the change may have been committed): asked again after the
        backoff, while the partition still waits for it."""
        not_before_s = asyncio.get_running_loop().time() + self.retry_backoff_ms / 1000
        for proposal in proposals:
            heapq.heappush(self._backing_off, (not_before_s, next(self._order), proposal))
        first = proposals[0]
        _log.info(
            "%r%s: ISR change to %s pending (%s); asking again",
            first.partition,
            f" and {len(proposals) - 1} more" if len(proposals) > 1 else "",
            first.isr,
            why,
        )

    def _committed(
        self, partition: Partition, p: mpb.PartitionRecord, isr: tuple[int, ...]
    ) -> None:
        committed = CommittedPartition(
            tuple(p.replicas), tuple(p.isr), p.leader, p.leader_epoch, p.partition_epoch
        )
        _log.info("%r: ISR %s -> %s committed", partition, partition.isr, committed.isr)
        self._resting.pop(partition.key, None)
        partition.isr_change_committed(committed, self.clock_ms(), isr)

    def _failed(
        self, partition: Partition, why: str, isr: tuple[int, ...], partition_epoch: int
    ) -> None:
        _log.info("%r: ISR change to %s refused: %s", partition, isr, why)
        self._resting[partition.key] = self.clock_ms() + self.retry_backoff_ms
        partition.isr_change_failed(isr, partition_epoch)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
