"""``controller_quorum_voters``: the static voter set, ``"1@host:port,2@host:port,..."``."""

from __future__ import annotations

import re

_ENTRY = re.compile(r"^(\d+)@(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$")


def parse_quorum_voters(text: str) -> dict[int, str]:
    """Map node id -> ``host:port``; raises ValueError naming the bad entry."""
    voters: dict[int, str] = {}
    for raw in text.split(","):
        entry = raw.strip()
        match = _ENTRY.match(entry)
        if match is None:
            raise ValueError(
                f"controller_quorum_voters entry {entry!r} is not <node id>@<host>:<port>"
            )
        node_id, host, port = int(match[1]), match[2], int(match[3])
        if not 0 < port < 65536:
            raise ValueError(f"controller_quorum_voters entry {entry!r}: port out of range")
        if node_id in voters:
            raise ValueError(f"controller_quorum_voters names node {node_id} twice")
        voters[node_id] = f"{host}:{port}"
    return voters
