"""The simulated network and the events the simulation schedules.

How this works. ``Network.delays`` decides, with the simulation's one RNG, what happens to one
message: blocked by a partition, dropped, delivered once after a random delay (a few are very
slow, which reorders them), or duplicated. Healing stops drops, duplicates and slow messages.
Every event is a small frozen dataclass; the simulation keeps them in one heap ordered by
``(time, seq)`` and dispatches on their type.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raft.messages import Envelope

if TYPE_CHECKING:
    from raft.testing.sim_state import SimConfig

__all__ = [
    "Deliver",
    "Event",
    "Fault",
    "Heal",
    "LivenessClient",
    "Network",
    "Propose",
    "Restart",
    "SnapshotRequest",
    "StartLiveness",
    "Tick",
    "Unreachable",
    "WrongReport",
]


class Network:
    """Delays, drops, duplicates and partitions; reordering comes from the random delays."""

    def __init__(self, rng: random.Random, config: SimConfig) -> None:
        self.rng = rng
        self.config = config
        self.blocked: set[tuple[int, int]] = set()
        self.drop_probability = config.drop_probability
        self.duplicate_probability = config.duplicate_probability
        self.slow_probability = config.slow_probability

    def delays(self, source: int, destination: int) -> list[int]:
        if (source, destination) in self.blocked:
            return []
        rng = self.rng
        if rng.random() < self.drop_probability:
            return []
        first = self._delay()
        if rng.random() < self.duplicate_probability:
            return [first, self._delay()]
        return [first]

    def _delay(self) -> int:
        config, rng = self.config, self.rng
        if rng.random() < self.slow_probability:
            return rng.randint(config.delay_max_ms, config.slow_max_ms)
        return rng.randint(config.delay_min_ms, config.delay_max_ms)

    def heal(self) -> None:
        self.blocked.clear()
        self.drop_probability = 0.0
        self.duplicate_probability = 0.0
        self.slow_probability = 0.0


# -- events ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Deliver:
    envelope: Envelope


@dataclass(frozen=True, slots=True)
class Tick:
    node_id: int
    gen: int


@dataclass(frozen=True, slots=True)
class Propose:
    pass


@dataclass(frozen=True, slots=True)
class Fault:
    pass


@dataclass(frozen=True, slots=True)
class Unreachable:
    node_id: int  # told by its transport
    peer: int  # that this node is down


@dataclass(frozen=True, slots=True)
class WrongReport:
    pass


@dataclass(frozen=True, slots=True)
class Restart:
    node_id: int


@dataclass(frozen=True, slots=True)
class Heal:
    gen: int


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    pass


@dataclass(frozen=True, slots=True)
class StartLiveness:
    pass


@dataclass(frozen=True, slots=True)
class LivenessClient:
    pass


Event = (
    Deliver
    | Tick
    | Propose
    | Fault
    | Unreachable
    | WrongReport
    | Restart
    | Heal
    | SnapshotRequest
    | StartLiveness
    | LivenessClient
)
