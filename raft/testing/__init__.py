"""Testing tools for the Raft core: a deterministic cluster simulation (``sim``) and its
command line (``python -m raft.testing.simulate``).

The simulation drives real ``RaftCore`` instances through a seeded, virtual-time network and
storage that fail the way real ones do, and checks Raft's safety properties after every event.
"""

from raft.testing.sim import SimConfig, SimResult, Simulation, SimulationFailure, run_seed

__all__ = ["SimConfig", "SimResult", "Simulation", "SimulationFailure", "run_seed"]
