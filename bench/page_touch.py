"""What writing into the page cache costs on this machine, by how recently the memory was
freed: ``python -m bench.page_touch``.

Why. On this VM the CPU cost of a buffered file write depends on the memory the kernel hands
the page cache: memory freed a moment ago is cheap to fill, other memory often costs about ten
times as much (all of it in the kernel's copy into the new pages), how much of it varies over
time. Every produce run writes new log bytes, and the raw baseline of
``bench.produce_consume`` writes a new file, so this cost sits inside both sides of its
ratio (docs/performance.md, "Page-cache memory").

How this works. In this process, pinned to nothing: write ``--mb`` MiB in 1 MiB ``os.write``
calls to a new file under ``--dir`` (no fsync), delete it, wait ``gap`` seconds, write the same
amount again into a new file, delete it; for each gap in ``--gaps`` (``--rounds`` times, gaps
in turn, with ``--rest-s`` between pairs so no first write starts on memory just freed).
Reported: the CPU (user + system) of each write, in µs per 16 KiB written, the medians per gap
of the first write (the baseline) and of the second, and their ratio; and, where the kernel
has free page reporting (``REPORTED_KIB``: a guest handing freed memory back to its host), how
many MiB it reported during each gap (null elsewhere). Then one file grown to
``--grow-mb`` MiB in 16 KiB ``pwrite``s, as a partition's segment grows: the CPU per 16 KiB of
each ``GROW_STEP_MB`` MiB in turn (0: left out). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.common import git_state, work_dir

WRITE_BYTES = 1 << 20
UNIT_BYTES = 16 << 10  # one produce request's batch in bench.produce_consume
GROW_STEP_MB = 256
REPORTED_KIB = Path("/sys/module/page_reporting/parameters/reported_kib")


def _reported_kib() -> int | None:
    """KiB of free memory the kernel has reported to its hypervisor since boot, if it does."""
    try:
        return int(REPORTED_KIB.read_text())
    except (OSError, ValueError):
        return None


def _write_cpu_us_per_unit(directory: Path, mb: int) -> float:
    """CPU µs per 16 KiB of writing ``mb`` MiB to a new file, which is then deleted."""
    buffer = memoryview(os.urandom(WRITE_BYTES))
    path = directory / "page-touch.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        start = time.process_time()
        for _ in range(mb):
            if os.write(fd, buffer) != WRITE_BYTES:
                raise OSError("short write")
        spent = time.process_time() - start
    finally:
        os.close(fd)
        path.unlink()
    return spent * 1e6 / (mb * WRITE_BYTES / UNIT_BYTES)


def _grow_cpu_us_per_unit(directory: Path, mb: int) -> list[float]:
    """CPU µs per 16 KiB ``pwrite`` of each ``GROW_STEP_MB`` MiB of one file grown to
    ``mb`` MiB, which is then deleted."""
    unit = os.urandom(UNIT_BYTES)
    path = directory / "page-touch-grow.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    steps, per_step, position = [], (GROW_STEP_MB << 20) // UNIT_BYTES, 0
    try:
        for _ in range(mb // GROW_STEP_MB):
            start = time.process_time()
            for _ in range(per_step):
                if os.pwrite(fd, unit, position) != UNIT_BYTES:
                    raise OSError("short write")
                position += UNIT_BYTES
            steps.append((time.process_time() - start) * 1e6 / per_step)
    finally:
        os.close(fd)
        path.unlink()
    return steps


def run(args: argparse.Namespace) -> dict[str, Any]:
    firsts: dict[float, list[float]] = {gap: [] for gap in args.gaps}
    seconds: dict[float, list[float]] = {gap: [] for gap in args.gaps}
    reported: dict[float, list[float]] = {gap: [] for gap in args.gaps}
    with work_dir(Path(args.dir), "page-touch-") as directory:
        for i in range(args.rounds):
            for gap in args.gaps:
                if i or gap != args.gaps[0]:
                    time.sleep(args.rest_s)
                firsts[gap].append(_write_cpu_us_per_unit(directory, args.mb))
                before = _reported_kib()
                time.sleep(gap)
                after = _reported_kib()
                seconds[gap].append(_write_cpu_us_per_unit(directory, args.mb))
                said = ""
                if before is not None and after is not None:
                    reported[gap].append((after - before) / 1024)
                    said = f"; {reported[gap][-1]:.0f} MiB reported free to the host in the gap"
                print(
                    f"gap {gap:g} s: first write {firsts[gap][-1]:.1f} us per 16 KiB, "
                    f"second {seconds[gap][-1]:.1f}{said}",
                    flush=True,
                )
        grow = []
        if args.grow_mb:
            time.sleep(args.rest_s)
            grow = _grow_cpu_us_per_unit(directory, args.grow_mb)
    per_gap = {}
    for gap in args.gaps:
        first, second = statistics.median(firsts[gap]), statistics.median(seconds[gap])
        per_gap[f"{gap:g}"] = {
            "first_us_per_16k": first,
            "second_us_per_16k": second,
            "second_to_first": second / first,
            "first_runs": firsts[gap],
            "second_runs": seconds[gap],
            "reported_mib_in_gap": reported[gap] or None,
        }
    commit, dirty = git_state()
    return {
        "benchmark": "page_touch",
        "mb_per_write": args.mb,
        "gaps": per_gap,
        "grow_step_mb": GROW_STEP_MB,
        "grow_us_per_16k": grow,
        "rounds": args.rounds,
        "commit": commit,
        "dirty": dirty,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.page_touch", description=__doc__)
    parser.add_argument("--dir", default="data", help="where the files go (created if absent)")
    parser.add_argument("--mb", type=int, default=256, help="MiB per write (default 256)")
    parser.add_argument(
        "--gaps", type=float, nargs="+", default=[0.0, 1.0, 4.0], help="seconds between writes"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rest-s", type=float, default=4.0, help="pause before each pair")
    parser.add_argument(
        "--grow-mb", type=int, default=1536, help=f"the growing file, a multiple of {GROW_STEP_MB}"
    )
    args = parser.parse_args(argv)
    if args.mb < 1 or args.rounds < 1 or min(args.gaps) < 0 or args.rest_s < 0:
        parser.error("--mb and --rounds must be positive, --gaps and --rest-s not negative")
    if len(set(args.gaps)) != len(args.gaps):
        parser.error("--gaps must not repeat a gap")
    if args.grow_mb < 0 or args.grow_mb % GROW_STEP_MB:
        parser.error(f"--grow-mb must be 0 or a positive multiple of {GROW_STEP_MB}")
    result = run(args)
    print()
    print(f"{'gap s':>6} {'first write':>12} {'second':>8} {'ratio':>6}   (CPU us per 16 KiB)")
    for gap, figures in result["gaps"].items():
        print(
            f"{gap:>6} {figures['first_us_per_16k']:>12.1f} {figures['second_us_per_16k']:>8.1f}"
            f" {figures['second_to_first']:>6.2f}"
        )
    for i, cost in enumerate(result["grow_us_per_16k"]):
        mb = f"{i * GROW_STEP_MB}-{(i + 1) * GROW_STEP_MB}"
        print(f"growing file, MiB {mb}: {cost:.1f} us per 16 KiB pwrite")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
