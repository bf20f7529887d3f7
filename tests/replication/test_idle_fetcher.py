"""A follower that no longer follows anything from a leader lets its connection to that
leader go (as Kafka shuts idle fetcher threads down), and opens one again when it follows
a partition there anew: three real brokers, connections read from /proc."""

from __future__ import annotations

import os
from pathlib import Path

import fault_cluster as rc
import pytest

from runnel.local_cluster import Port

Cluster = rc.Cluster
replication_cluster = rc.replication_cluster
WAIT_S = 20.0
_ESTABLISHED = "01"


def connections_to(pid: int, port: int) -> int:
    """How many established TCP connections process ``pid`` has to ``port`` (IPv4 or IPv6)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[3] == _ESTABLISHED and fields[9] in inodes:
                count += 1
    return count


@pytest.mark.slow
def test_a_fetcher_following_nothing_lets_its_connection_go(replication_cluster: Cluster) -> None:
    c = replication_cluster
    [view] = c.create_topic("idle-a", 1)
    leader, followers = view.leader, [b for b in rc.BROKERS if b != view.leader]
    port = c.spec.node(leader).ports[Port.CLIENT]

    def each_follower(count: int) -> bool | None:
        found = {f: connections_to(c.pid(f) or 0, port) for f in followers}
        c.note(f"connections to {leader}'s listener: {found}")
        return all(n == count for n in found.values()) or None

    rc.wait_for(f"each follower connected to leader {leader}", lambda: each_follower(1), WAIT_S)
    admin = c.admin()  # it must outlive the future
    admin.delete_topics(["idle-a"])["idle-a"].result(WAIT_S)
    rc.wait_for("the followers to let their connections go", lambda: each_follower(0), WAIT_S)
    again = c.create_topic("idle-b", 3)  # each broker leads one: leader is followed again
    assert leader in {v.leader for v in again}, again
    rc.wait_for("each follower connected again", lambda: each_follower(1), WAIT_S)
