"""Run the Raft cluster simulation over a range of seeds.

    python -m raft.testing.simulate --seeds 200 --first-seed 0 --voters 3 --observers 1

Prints one line per failing seed with the command that replays it, then a summary; exits 1 if
any seed broke an invariant. ``--trace`` prints a single seed's whole event trace (to replay a
failure in full detail).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from raft.testing.sim import SimConfig, SimResult, Simulation, SimulationFailure


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m raft.testing.simulate", description=__doc__)
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed")
    parser.add_argument("--voters", type=int, choices=(1, 3, 5, 7), default=3)
    parser.add_argument("--observers", type=int, default=1)
    parser.add_argument("--trace", action="store_true", help="print every seed's full trace")
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per seed")
    return parser


def run_one(seed: int, config: SimConfig, trace: bool) -> SimResult | SimulationFailure:
    simulation = Simulation(seed, config)
    if trace:
        simulation.full_trace = []
    try:
        return simulation.run()
    except SimulationFailure as failure:
        return failure
    finally:
        if simulation.full_trace is not None:
            print("\n".join(simulation.full_trace))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.observers < 0 or args.seeds < 1:
        print("--observers must be >= 0 and --seeds >= 1", file=sys.stderr)
        return 2
    config = SimConfig(voters=args.voters, observers=args.observers)
    started = time.perf_counter()
    results: list[SimResult] = []
    failures: list[SimulationFailure] = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        outcome = run_one(seed, config, args.trace)
        if isinstance(outcome, SimulationFailure):
            failures.append(outcome)
            print(f"FAIL seed {seed}: {outcome.problem}\n  replay: {outcome.replay}", flush=True)
            if args.verbose or args.trace:
                print(outcome)
            continue
        results.append(outcome)
        if args.verbose:
            print(
                f"ok seed {seed}: {outcome.virtual_ms} ms virtual, {outcome.events} events, "
                f"{outcome.records_committed} records committed",
                flush=True,
            )
    elapsed = time.perf_counter() - started
    print(_summary(args.seeds, results, failures, elapsed))
    return 1 if failures else 0


def _summary(
    seeds: int, results: list[SimResult], failures: list[SimulationFailure], elapsed_s: float
) -> str:
    virtual_s = sum(r.virtual_ms for r in results) / 1000
    return (
        f"{seeds} seeds, {len(failures)} failed, {elapsed_s:.1f} s wall, "
        f"{virtual_s:.0f} s virtual, {sum(r.events for r in results)} events, "
        f"{sum(r.messages for r in results)} messages, "
        f"{sum(r.proposals_acked for r in results)} proposals acked, "
        f"{sum(r.proposals_refused for r in results)} refused as too large, "
        f"{sum(r.records_committed for r in results)} records committed, "
        f"{sum(r.crashes for r in results)} crashes, {sum(r.partitions for r in results)} "
        f"partitions, {sum(r.snapshots_loaded for r in results)} snapshots fetched, "
        f"{sum(r.elections for r in results)} leaders elected (passing seeds only)"
    )


if __name__ == "__main__":
    sys.exit(main())
