"""Partition replicas on a broker: the leader's and follower's rules over a storage log.

This issue serves each partition from its leader alone (``partition.py``: the high watermark
follows the leader's log end); follower fetching, the ISR and HW = min LEO of the ISR come
with the next. Imports ``storage`` only (DESIGN.md); the broker drives it.
"""

from replication.errors import ReplicationError, from_storage_error
from replication.partition import (
    OffsetAndTimestamp,
    Partition,
    PartitionKey,
    PartitionStateView,
    ReplicaState,
    Role,
)

__all__ = [
    "OffsetAndTimestamp",
    "Partition",
    "PartitionKey",
    "PartitionStateView",
    "ReplicaState",
    "ReplicationError",
    "Role",
    "from_storage_error",
]
