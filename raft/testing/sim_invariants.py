"""The safety invariants, checked after every event and at the end of a run.

How this works. The first node to report an offset below its high watermark defines the
committed log (offset -> (epoch, control, data)); every later report, every applied record and
every durable log must agree with it, and each committed offset must stay on a majority of the
voters' durable logs or snapshots (rechecked whenever a voter's log shrinks). Leaders and
followed leaders are recorded per epoch, so two in one epoch are caught. Any violation goes to
``_fail``.
"""

from __future__ import annotations

from raft.messages import NO_LEADER
from raft.testing.sim_state import SimState
from raft.testing.sim_storage import Entry, SimNode

__all__ = ["Invariants"]


class Invariants(SimState):
    """Checks Raft's safety properties against the committed log the run has learnt."""

    def _check_node(self, node: SimNode) -> None:
        core = node.core
        assert core is not None
        nid, epoch, role = node.node_id, core.epoch, core.role
        if epoch < node.epoch_seen or epoch < node.quorum.epoch:
            before = max(node.epoch_seen, node.quorum.epoch)
            self._fail(f"node {nid} went back to epoch {epoch} from {before}")
        node.epoch_seen = epoch
        if role == "leader":
            first = self.leaders.setdefault(epoch, nid)
            if first != nid:
                self._fail(f"two leaders in epoch {epoch}: {first} and {nid}")
            if len(self.leaders) > self.result.elections:
                self.result.elections = len(self.leaders)
        if not node.is_voter and role in ("leader", "candidate", "prospective", "follower"):
            self._fail(f"observer {nid} became {role}")
        if role in ("leader", "follower", "observer") and core.leader_id != NO_LEADER:
            believed = self.believed.setdefault(epoch, core.leader_id)
            if believed != core.leader_id:
                self._fail(
                    f"node {nid} follows {core.leader_id} in epoch {epoch}, another followed "
                    f"{believed}"
                )
        self._observe(node)

    def _observe(self, node: SimNode) -> None:
        """Learn committed entries below the node's HW and check its log agrees."""
        core = node.core
        assert core is not None
        hw = core.high_watermark
        if hw < node.hw_seen:
            self._fail(f"node {node.node_id}: HW went back from {node.hw_seen} to {hw}")
        node.hw_seen = hw
        log = node.log
        if hw > log.end_offset:
            self._fail(f"node {node.node_id}: HW {hw} beyond its durable log end {log.end_offset}")
        if hw <= node.verified_upto:
            return
        for offset, entry in log.entries(node.verified_upto, hw):
            self._commit(offset, entry, node)
        node.verified_upto = hw

    def _commit(self, offset: int, entry: Entry, node: SimNode) -> None:
        known = self.committed.get(offset)
        if known is None:
            if entry[2] in self.refused:
                self._fail(f"offset {offset} commits a record of a refused proposal: {entry}")
            self.committed[offset] = entry
            if not entry[1]:
                self.committed_data[entry[2]] = offset
            self.commit_end = max(self.commit_end, offset + 1)
            self._check_majority(offset, entry)
        elif known != entry:
            self._fail(
                f"node {node.node_id} has {entry} at committed offset {offset}; committed: {known}"
            )

    def _holds(self, node: SimNode, offset: int, entry: Entry) -> bool:
        return node.snapshot_end() > offset or node.log.entry(offset) == entry

    def _check_majority(self, offset: int, entry: Entry) -> None:
        holders = [v for v in sorted(self.voters) if self._holds(self.nodes[v], offset, entry)]
        if len(holders) < self.majority:
            self._fail(
                f"committed offset {offset} {entry} is durable only on voters {holders}, "
                f"not a majority"
            )

    def _recheck(self, node: SimNode, lo: int, hi: int) -> None:
        """A node's durable log lost [lo, hi): committed offsets there need a majority still."""
        if not node.is_voter:
            return
        for offset in range(max(lo, 0), min(hi, self.commit_end)):
            entry = self.committed.get(offset)
            if entry is not None:
                self._check_majority(offset, entry)

    def _check_applied(self, node: SimNode, offset: int, data: bytes) -> None:
        entry = self.committed.get(offset)
        if entry is None or entry[1] or entry[2] != data:
            self._fail(
                f"node {node.node_id} applied {data!r} at {offset}; the committed log has {entry}"
            )

    def _final_checks(self) -> None:
        for offset in sorted(self.committed):
            self._check_majority(offset, self.committed[offset])
        for node in self.nodes.values():
            for offset, data in node.sm.records:
                self._check_applied(node, offset, data)
