"""What a follower's idle partitions cost the leader's session cache per fetch:
``python -m bench.fetch_session_walk``.

In-process, no network: ``broker.fetch_session.FetchSessionCache`` alone, driven as the fetch
handler drives it for a follower's incremental fetch (``begin``, ``skip_quiet``, ``finish``).
A session of ``--partitions`` partitions whose every partition but one is quiet (so its
session watches them), fetched ``--fetches`` times, 1 ms of virtual time apart (so the
once-a-second recheck of every partition, ``QUIET_RECHECK_MS``, is in the figure, amortised).
The baseline, in the same run: the same fetches of a session of that one busy partition
alone. Reported: µs per fetch on each side, their ratio, and the extra µs per idle partition.
Rounds alternate the two sides; the medians are reported. The last line printed is one
JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from typing import Any

from bench.common import git_state
from broker.fetch_session import (
    INITIAL_EPOCH,
    NO_SESSION,
    FetchPosition,
    FetchSessionCache,
    IncrementalFetch,
    News,
    SessionKey,
    SessionLimits,
    SessionRequest,
    next_epoch,
)

REPLICA_ID = 2
BUSY: SessionKey = ("t", 0)
POSITION = FetchPosition(10, 0, 0, 0, 1 << 20)
NEWS = News(0, 10, 10, 0)


def _quiet(key: SessionKey, heard: Any, watch: Any) -> bool:
    return key != BUSY


def fetch_us(partitions: int, fetches: int) -> float:
    """µs per incremental fetch of a session of ``partitions`` (all but BUSY quiet)."""
    ids = itertools.count(1)
    cache = FetchSessionCache(SessionLimits(max_partitions=partitions + 1), lambda: next(ids))
    keys = [("t", i) for i in range(partitions)]
    request = SessionRequest(NO_SESSION, INITIAL_EPOCH, REPLICA_ID, dict.fromkeys(keys, POSITION))
    session_id = cache.begin(request, 0).finish([NEWS] * partitions, 0).session_id
    epoch = next_epoch(INITIAL_EPOCH)
    start = time.perf_counter()
    for now_ms in range(1, fetches + 1):
        context = cache.begin(SessionRequest(session_id, epoch, REPLICA_ID, {}), now_ms)
        if not isinstance(context, IncrementalFetch):
            raise RuntimeError(f"fetch {now_ms} was not incremental: {context!r}")
        context.skip_quiet(_quiet)
        context.finish([NEWS] * len(context.partitions), now_ms)
        epoch = next_epoch(epoch)
    return 1e6 * (time.perf_counter() - start) / fetches


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fetch_session_walk", description=__doc__)
    parser.add_argument("--partitions", type=int, nargs="+", default=[1_000, 20_000])
    parser.add_argument("--fetches", type=int, default=3_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if min(args.partitions) < 2 or args.fetches < 1 or args.rounds < 1:
        parser.error("--partitions must be at least 2, --fetches and --rounds at least 1")
    results = []
    print(f"{'partitions':>10} {'us/fetch':>9} {'baseline':>9} {'ratio':>6} {'us/idle':>8}")
    for partitions in args.partitions:
        ours: list[float] = []
        base: list[float] = []
        for i in range(args.rounds):  # alternate which side goes first
            sides = [(ours, partitions), (base, 1)]
            for samples, size in sides if i % 2 == 0 else reversed(sides):
                samples.append(fetch_us(size, args.fetches))
        us, floor = statistics.median(ours), statistics.median(base)
        per_idle = (us - floor) / (partitions - 1)
        print(f"{partitions:>10} {us:>9.1f} {floor:>9.1f} {us / floor:>6.2f} {per_idle:>8.4f}")
        results.append(
            {
                "partitions": partitions,
                "us_per_fetch": us,
                "baseline_us_per_fetch": floor,
                "ratio_to_baseline": us / floor,
                "us_per_idle_partition": per_idle,
                "samples_us": ours,
                "baseline_samples_us": base,
            }
        )
    commit, dirty = git_state()
    print(json.dumps({"results": results, "fetches": args.fetches, "rounds": args.rounds,
                      "commit": commit, "dirty": dirty}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
