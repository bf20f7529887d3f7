"""The deterministic cluster simulation (raft/testing/sim.py) over many seeds.

500 fixed seeds (300 with three voters and an observer, 200 with five voters and two
observers), in chunks so that pytest-xdist spreads them, plus Hypothesis drawing seeds and
cluster sizes. Every failure names its seed and the command that replays it.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


def test_the_command_line_prints_a_replay_line_per_failure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["--seeds", "3", "--first-seed", "0", "--voters", "3", "--observers", "1"])
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if line.startswith("FAIL seed")]
    replays = [
        line for line in out.splitlines() if "replay: python -m raft.testing.simulate" in line
    ]
    assert code == (1 if failed else 0)
    assert len(replays) == len(failed)
    assert out.splitlines()[-1].startswith(f"3 seeds, {len(failed)} failed")
