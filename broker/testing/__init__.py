"""Testing tools that drive the broker's own logic: the replication simulation with follower
fetch sessions (``session_simulation``), a layer above ``replication.testing``.
"""

from broker.testing.session_simulation import SessionSimulation, run_seed
from replication.testing.simulation import SimConfig

__all__ = ["SessionSimulation", "SimConfig", "run_seed"]
