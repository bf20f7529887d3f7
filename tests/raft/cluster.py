"""A tiny synchronous harness for core unit tests: perfect network unless told otherwise,
virtual time, in-memory logs. (The full fault-injecting simulation lives in raft/testing.)"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from raft.core import LogMeta, RaftConfig, RaftCore, decode_records
from raft.messages import (
    Batch,
    Envelope,
    FetchResponse,
    FetchSnapshotResponse,
    QuorumState,
    Ready,
)


@dataclass
class Node:
    core: RaftCore
    log: list[Batch] = field(default_factory=list)
    state: QuorumState = field(default_factory=QuorumState)
    applied: list[bytes] = field(default_factory=list)
    commit: int = 0

    def end_offset(self) -> int:
        return self.log[-1].next_offset if self.log else 0


class Cluster:
    """Voters 1..n (+ observers); ``run`` delivers messages and fires deadlines in order.
    ``sent`` keeps every message sent (filled), for tests that look at what travelled;
    ``log_max_batch_bytes`` is the largest batch each node's log stores (LogMeta)."""

    def __init__(
        self,
        voters: int = 3,
        observers: int = 0,
        config: RaftConfig | None = None,
        seed: int = 1,
        log_max_batch_bytes: int = LogMeta().max_batch_bytes,
    ) -> None:
        self.config = config or RaftConfig()
        self.now = 0
        self.voter_ids = frozenset(range(1, voters + 1))
        self.nodes: dict[int, Node] = {}
        self.queue: list[Envelope] = []
        self.sent: list[Envelope] = []
        self.cut: set[tuple[int, int]] = set()  # (source, destination) links that drop
        for node_id in range(1, voters + observers + 1):
            core = RaftCore(
                self.config,
                node_id,
                self.voter_ids,
                state=QuorumState(),
                log=LogMeta(max_batch_bytes=log_max_batch_bytes),
                seed=seed,
                now_ms=0,
            )
            self.nodes[node_id] = Node(core)

    def apply(self, node_id: int, ready: Ready) -> None:
        node = self.nodes[node_id]
        if ready.quorum_state is not None:
            node.state = ready.quorum_state
        if ready.log_write is not None:
            write = ready.log_write
            if write.truncate_to is not None:
                node.log = [b for b in node.log if b.next_offset <= write.truncate_to]
            node.log.extend(write.batches)
        for envelope in ready.messages:
            filled = self._fill(node, envelope)
            self.queue.append(filled)
            self.sent.append(filled)
        if ready.commit_offset is not None:
            for batch in node.log:
                if node.commit <= batch.base_offset < ready.commit_offset and not batch.is_control:
                    node.applied.extend(decode_records(batch.data))
            node.commit = ready.commit_offset

    def _fill(self, node: Node, envelope: Envelope) -> Envelope:
        payload = envelope.payload
        if isinstance(payload, FetchResponse) and payload.read_from is not None:
            batches = tuple(b for b in node.log if b.base_offset >= payload.read_from)
            payload = replace(payload, batches=batches, read_from=None, read_max_bytes=0)
        assert not isinstance(payload, FetchSnapshotResponse) or payload.read_position is None
        return Envelope(envelope.source, envelope.destination, payload)

    def run(self, until_ms: int) -> None:
        while True:
            while self.queue:
                envelope = self.queue.pop(0)
                if (envelope.source, envelope.destination) in self.cut:
                    continue
                target = self.nodes[envelope.destination]
                self.apply(envelope.destination, target.core.step(envelope, self.now))
            due = min(n.core.next_deadline_ms for n in self.nodes.values())
            if due > until_ms:
                self.now = until_ms
                return
            self.now = max(self.now, due)
            for node_id, node in self.nodes.items():
                if node.core.next_deadline_ms <= self.now:
                    self.apply(node_id, node.core.tick(self.now))

    def leaders(self) -> list[int]:
        return [i for i, n in self.nodes.items() if n.core.role == "leader"]

    def propose(self, leader: int, records: list[bytes]) -> int:
        last, ready = self.nodes[leader].core.propose(records, self.now)
        self.apply(leader, ready)
        return last
