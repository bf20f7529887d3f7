"""ISR changes a leader proposes, sent to the active controller as AlterPartition.

How this works. A leader ``Partition`` asks ``propose(partition, isr)`` when a follower has
caught up (expand) or fallen behind (shrink). The proposal names the leader's broker epoch,
the partition's leader and partition epochs, and each member's broker epoch from this
broker's metadata image; the controller refuses it if any of these is stale or a joining
member is fenced or shutting down, and otherwise commits it before answering.

While the proposal is pending the leader's high watermark counts both the old and the new
ISR, so what happens to an answer matters for safety (Kafka's rules):

* committed: the answer's partition state is given to the partition at once
  (``isr_change_committed``), before the metadata image brings the same record;
* refused for good (INELIGIBLE_REPLICA, INVALID_REQUEST: checked at the epochs the leader
  holds, nothing written): the proposal ends (``isr_change_failed``) and the partition may
  propose again after ``retry_backoff_ms``;
* no answer, REQUEST_TIMED_OUT, or a refusal that says this broker's view is behind
  (INVALID_UPDATE_VERSION, FENCED_LEADER_EPOCH, STALE_BROKER_EPOCH, ...): the change may
  have been committed, or the image has not caught up. The proposal stays pending and is
  sent again every ``retry_backoff_ms`` (with this broker's current broker epoch) until an
  answer or the image ends it: an image with a newer partition epoch (or another leader)
  ends every pending proposal. Ending it on a lost answer instead would let the HW stop
  counting a replica the controller had put into the ISR, which could then be elected
  leader without the records the HW had committed (the replication simulation found it).

A proposal is not sent (``propose`` returns False) when a member is unknown to the image, a
joining member is fenced or in controlled shutdown (the controller would refuse it), the
partition is resting after a refusal, or ``max_in_flight`` proposals are outstanding.

Concurrency: asyncio, the broker's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import NamedTuple

from controller.client import ControllerClient, ControllerUnavailable
from controller.image import MetadataImage
from proto import controller_pb2 as cpb
from proto import metadata_pb2 as mpb
from replication.partition import Partition, PartitionKey

__all__ = ["AlterPartitionSender", "CommittedPartition"]

_log = logging.getLogger(__name__)

DEFAULT_MAX_IN_FLIGHT = 1000
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


class AlterPartitionSender:
    def __init__(
        self,
        broker_id: int,
        controller: ControllerClient,
        broker_epoch: Callable[[], int],
        image: Callable[[], MetadataImage],
        clock_ms: Callable[[], int],
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        retry_backoff_ms: int = DEFAULT_RETRY_BACKOFF_MS,
    ) -> None:
        self.broker_id = broker_id
        self.controller = controller
        self.broker_epoch = broker_epoch
        self.image = image
        self.clock_ms = clock_ms
        self.max_in_flight = max_in_flight
        self.retry_backoff_ms = retry_backoff_ms
        self.sent = 0
        self.refused = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._resting: dict[PartitionKey, int] = {}  # until when (ms), after a failure

    def propose(self, partition: Partition, isr: tuple[int, ...]) -> bool:
        now_ms = self.clock_ms()
        if len(self._tasks) >= self.max_in_flight or self._resting.get(partition.key, 0) > now_ms:
            return False
        members = self._members(partition, isr)
        if members is None:
            return False
        request = cpb.AlterPartitionRequest(
            broker_id=self.broker_id,
            broker_epoch=self.broker_epoch(),
            topic_id=partition.topic_id,
            partition_id=partition.partition_id,
            leader_epoch=partition.leader_epoch,
            partition_epoch=partition.partition_epoch,
            new_isr=members,
        )
        task = asyncio.get_running_loop().create_task(self._send(partition, request, isr))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.sent += 1
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
            members.append(cpb.IsrMember(broker_id=broker_id, broker_epoch=reg.broker_epoch))
        return members

    async def _send(
        self, partition: Partition, request: cpb.AlterPartitionRequest, isr: tuple[int, ...]
    ) -> None:
        epoch = request.partition_epoch
        while partition.proposal_pending(isr, epoch):
            try:
                response = await self.controller.call("AlterPartition", request)
            except (ControllerUnavailable, OSError) as e:
                why = f"no answer: {e}"
            else:
                error = response.header.error
                if error == cpb.NONE:
                    self._committed(partition, response.partition, isr)
                    return
                why = f"{cpb.ErrorCode.Name(error)}: {response.header.message}"
                self.refused += 1
                if error in _REFUSED_FOR_GOOD:
                    self._failed(partition, why, isr, epoch)
                    return
            _log.info("%r: ISR change to %s pending (%s); asking again", partition, isr, why)
            await asyncio.sleep(self.retry_backoff_ms / 1000)
            request.broker_epoch = self.broker_epoch()

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
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
