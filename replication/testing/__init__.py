"""Testing tools for replication: a deterministic simulation of partition replication
(``simulation``) that drives real ``Partition`` objects on real logs through a seeded,
virtual-time network, a model controller and faults, and checks replication's safety
properties after every event.
"""

from replication.testing.simulation import (
    ModelController,
    PState,
    SimConfig,
    SimResult,
    Simulation,
    SimulationFailure,
    run_seed,
)

__all__ = [
    "ModelController",
    "PState",
    "SimConfig",
    "SimResult",
    "Simulation",
    "SimulationFailure",
    "run_seed",
]
