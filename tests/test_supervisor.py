"""The supervisor's restarts (runnel/supervisor.py) when a node cannot even be started again:
its log file cannot be opened here (on a real machine: a full disk, no descriptors left).
That must count as one more failed start, retried after a backoff; it used to raise out of
``poll`` and end ``cluster up``, which then stopped every other node. No process is started:
the spawn fails before it."""

from __future__ import annotations

from pathlib import Path

from runnel.local_cluster import ClusterSpec
from runnel.supervisor import FIRST_BACKOFF_S, MAX_BACKOFF_S, NodeState, Supervisor


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_node_that_cannot_be_started_again_is_retried_later_not_fatal(tmp_path: Path) -> None:
    cluster = ClusterSpec(1, 1, tmp_path / "cluster")
    clock = Clock()
    supervisor = Supervisor(cluster, clock=clock)
    node_id = 1
    cluster.log_path(node_id).mkdir(parents=True)  # the log "file" is a directory: OSError
    managed = supervisor.managed[node_id]
    managed.state, managed.restart_at = NodeState.BACKOFF, clock.now  # due now
    events = supervisor.poll()
    assert len(events) == 1 and "could not be started" in events[0][1], events
    assert managed.state is NodeState.BACKOFF and managed.pid is None
    assert managed.restart_at > clock.now and managed.backoff_s is not None
    first = managed.backoff_s
    clock.now = managed.restart_at
    supervisor.poll()  # fails again: the wait grows
    assert managed.backoff_s == min(2 * first, MAX_BACKOFF_S) and first >= FIRST_BACKOFF_S
    assert managed.restarts == 2
