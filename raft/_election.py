"""Elections: a pre-vote (no epoch bump) that a voter still hearing from its leader refuses,
then a vote in a new epoch; and the announcements around a term, BeginQuorumEpoch from a new
leader and EndQuorumEpoch from one that resigns (it names the other voters, most caught-up
first, and they campaign in that order, the first at once).
"""

from __future__ import annotations

from raft._base import _CoreBase
from raft._roles import CANDIDATE, PROSPECTIVE, UNATTACHED, _Election, _Follower, _Leader, _Role
from raft.messages import (
    NO_LEADER,
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    QuorumState,
    VoteRequest,
    VoteResponse,
)

SUCCESSOR_STEP_MS = 50  # between the campaigns of successors named by a resigning leader


class _ElectionMixin(_CoreBase):
    """Campaigning, voting and term announcements; mixed into ``RaftCore``."""

    def _become_prospective(self) -> None:
        if not self.is_voter:
            return
        deadline = self._now + self._election_timeout() + self._backoff()
        role = _Election(PROSPECTIVE, deadline, granted={self.node_id})
        self._transition(PROSPECTIVE, role)
        if len(role.granted) >= self._majority():
            self._become_candidate()
            return
        request = VoteRequest(
            self.epoch + 1, self.node_id, self._last_epoch(), self._end, pre_vote=True
        )
        for voter in self.voters - {self.node_id}:
            self._send(voter, request)

    def _become_candidate(self) -> None:
        epoch = self.epoch + 1
        self._persist(QuorumState(epoch, self.node_id, NO_LEADER))
        deadline = self._now + self._election_timeout() + self._backoff()
        role = _Election(CANDIDATE, deadline, granted={self.node_id})
        self._transition(CANDIDATE, role)
        if len(role.granted) >= self._majority():
            self._become_leader()
            return
        request = VoteRequest(epoch, self.node_id, self._last_epoch(), self._end, pre_vote=False)
        for voter in self.voters - {self.node_id}:
            self._send(voter, request)

    def _log_up_to_date(self, last_epoch: int, end_offset: int) -> bool:
        return (last_epoch, end_offset) >= (self._last_epoch(), self._end)

    def _on_vote(self, source: int, request: VoteRequest) -> None:
        if request.pre_vote:
            self._send(
                source,
                VoteResponse(self.epoch, self._grant_pre_vote(request), True, self._known_leader()),
            )
            return
        state, granted = self._quorum, False
        if (
            self.is_voter
            and request.epoch == state.epoch
            and state.leader_id == NO_LEADER
            and state.voted_for in (NO_LEADER, request.candidate_id)
            and self._log_up_to_date(request.last_epoch, request.last_epoch_end_offset)
        ):
            granted = True
            self._persist(QuorumState(state.epoch, request.candidate_id, NO_LEADER))
            if self._role.name == UNATTACHED:
                self._role.deadline_ms = self._now + self._election_timeout()
        self._send(source, VoteResponse(self.epoch, granted, False, self._known_leader()))

    def _grant_pre_vote(self, request: VoteRequest) -> bool:
        role = self._role
        if not self.is_voter or request.epoch <= self.epoch or isinstance(role, _Leader):
            return False
        if (
            isinstance(role, _Follower)
            and self._now - self._leader_heard_ms < self.config.fetch_timeout_ms
            and not role.leader_unreachable
        ):
            # Our leader answered within the fetch timeout: no reason to elect another. What
            # counts is an answer, not our deadline: a voter that went back to following
            # after a failed pre-vote has a fresh deadline but no news of the leader.
            return False
        return self._log_up_to_date(request.last_epoch, request.last_epoch_end_offset)

    def _on_vote_response(self, source: int, response: VoteResponse) -> None:
        role = self._role
        if not isinstance(role, _Election) or source not in self.voters:
            return
        if response.pre_vote != (role.name == PROSPECTIVE):
            return
        if not response.pre_vote and response.epoch != self.epoch:
            return
        (role.granted if response.granted else role.rejected).add(source)
        if len(role.granted) >= self._majority():
            if role.name == PROSPECTIVE:
                self._become_candidate()
            else:
                self._become_leader()
        elif len(role.rejected) >= self._majority():
            self._election_failures += 1
            if response.leader_id not in (NO_LEADER, self.node_id) and response.epoch == self.epoch:
                self._become_follower(self.epoch, response.leader_id)
            else:
                self._transition(
                    UNATTACHED,
                    _Role(UNATTACHED, self._now + self._election_timeout() + self._backoff()),
                )

    # -- quorum epoch announcements --------------------------------------------------------
    def _on_begin_quorum_epoch(self, source: int, request: BeginQuorumEpochRequest) -> None:
        if request.epoch == self.epoch and self._quorum.leader_id == NO_LEADER:
            self._become_follower(request.epoch, request.leader_id)
            if source == request.leader_id:
                self._leader_heard_ms = self._now
        self._send(source, BeginQuorumEpochResponse(self.epoch))

    def _on_begin_quorum_epoch_response(
        self, source: int, response: BeginQuorumEpochResponse
    ) -> None:
        role = self._role
        if isinstance(role, _Leader) and response.epoch == self.epoch:
            role.begin_quorum_due.pop(source, None)

    def _on_end_quorum_epoch(self, source: int, request: EndQuorumEpochRequest) -> None:
        role = self._role
        if (
            request.epoch == self.epoch
            and isinstance(role, _Follower)
            and role.leader_id == request.leader_id
            and self.is_voter
        ):
            # The leader is leaving: news as good as a reset connection, so grant pre-votes
            # now (a voter still counting it as heard would refuse them for a whole fetch
            # timeout, and with five voters no successor could win sooner).
            role.leader_unreachable = True
            role.deadline_ms = min(role.deadline_ms, self._now + self._successor_delay(request))
        self._send(source, EndQuorumEpochResponse(self.epoch))

    def _successor_delay(self, request: EndQuorumEpochRequest) -> int:
        """When to campaign after the leader resigned: the first successor it names (the
        most caught-up voter) at once, as in KRaft, each next one ``SUCCESSOR_STEP_MS`` after
        the one before (the n-th, counting from 1, ``(n - 1) * SUCCESSOR_STEP_MS``; no
        randomness: ranks differ); a voter not named after all of them, with a backoff."""
        successors = request.preferred_successors
        if self.node_id in successors:
            return successors.index(self.node_id) * SUCCESSOR_STEP_MS
        return len(self.voters) * SUCCESSOR_STEP_MS + self._backoff()

    def _on_end_quorum_epoch_response(self, source: int, response: EndQuorumEpochResponse) -> None:
        del source, response  # nothing to do: resignation is best effort
