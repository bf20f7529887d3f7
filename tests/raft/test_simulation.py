"""The deterministic cluster simulation (raft/testing/sim.py) over many seeds.

500 fixed seeds (300 with three voters and an observer, 200 with five voters and two
observers), in chunks so that pytest-xdist spreads them, plus Hypothesis drawing seeds and
cluster sizes. Every failure names its seed and the command that replays it.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raft._leader import _LeaderMixin
from raft.testing.sim import SimConfig, Simulation, SimulationFailure, run_seed
from raft.testing.simulate import main

CHUNK = 25
THREE_VOTERS = SimConfig(voters=3, observers=1)
FIVE_VOTERS = SimConfig(voters=5, observers=2)


def _run_chunk(config: SimConfig, first_seed: int) -> None:
    failures = []
    for seed in range(first_seed, first_seed + CHUNK):
        try:
            run_seed(seed, config)
        except SimulationFailure as failure:
            failures.append(f"seed {seed}: {failure.problem}\n    replay: {failure.replay}")
    assert not failures, f"{len(failures)} of {CHUNK} seeds failed:\n" + "\n".join(failures)


@pytest.mark.parametrize("first_seed", range(0, 300, CHUNK))
def test_three_voters_and_an_observer_stay_safe_and_live(first_seed: int) -> None:
    _run_chunk(THREE_VOTERS, first_seed)


@pytest.mark.parametrize("first_seed", range(0, 200, CHUNK))
def test_five_voters_and_two_observers_stay_safe_and_live(first_seed: int) -> None:
    _run_chunk(FIVE_VOTERS, first_seed)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    voters=st.sampled_from([3, 5]),
    observers=st.integers(min_value=0, max_value=2),
)
def test_any_seed_and_cluster_size_stays_safe_and_live(
    seed: int, voters: int, observers: int
) -> None:
    run_seed(seed, SimConfig(voters=voters, observers=observers))  # the failure names the replay


def test_a_seed_replays_exactly() -> None:
    def outcome(seed: int) -> object:
        simulation = Simulation(seed, THREE_VOTERS)
        simulation.full_trace = []
        try:
            result: object = simulation.run()
        except SimulationFailure as failure:
            result = (failure.problem, failure.time_ms)
        return result, simulation.full_trace

    assert outcome(7) == outcome(7)
    assert outcome(7) != outcome(8)


def _commits_on_its_own_log(self: Any, role: Any) -> None:
    """A mutant of ``_LeaderMixin._maybe_advance_hw``: the leader's own durable log end is
    the high watermark, as if it alone were a majority."""
    durable_end = self._end - sum(
        b.next_offset - b.base_offset for b in self._out.log_write.batches
    )
    role.replicas[self.node_id].fetch_offset = durable_end
    if durable_end > self._hw and durable_end > role.epoch_start_offset:
        self._hw = durable_end
        self._out.commit_offset = durable_end
        if role.pending:
            self._flush_pending(role)
        self._complete_parked(role)


def test_the_invariants_catch_a_leader_that_commits_without_a_majority(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checker must be able to fail, and the command line then prints each failing seed
    with the line that replays it and exits 1."""
    monkeypatch.setattr(_LeaderMixin, "_maybe_advance_hw", _commits_on_its_own_log)
    code = main(["--seeds", "20", "--first-seed", "0", "--voters", "3", "--observers", "1"])
    lines = capsys.readouterr().out.splitlines()
    failed = [line for line in lines if line.startswith("FAIL seed")]
    replays = [line for line in lines if "replay: python -m raft.testing.simulate" in line]
    assert code == 1 and failed, "no seed caught the mutant"
    assert len(replays) == len(failed)
    assert lines[-1].startswith(f"20 seeds, {len(failed)} failed")
