"""The table and the JSON of bench.produce_consume's replication runs.

The headline figures: acks=all records/s and its ratio to replication factor 1 are medians
over the rounds (the ratio taken per round first); the failover figure is the longest of the
kills; the catch-up is one measurement. Every run is in the JSON.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from bench.common import ratio_text, verdict
from bench.produce_consume_replication_figures import (
    TARGET_CATCH_UP_MB_PER_S,
    TARGET_RF3_ACKS_ALL_RECORDS_PER_S,
    TARGET_RF3_RATIO_TO_RF1,
    CatchUp,
    Failover,
    ReplicatedRun,
    Replication,
    ReplicationRound,
)

__all__ = ["headline_json", "print_replication", "replication_json"]

LABEL_WIDTH = 40


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _cpu(r: ReplicatedRun) -> str:
    seconds = r.run.seconds
    leader = r.broker_cpu_s.get(r.leader, 0.0) / seconds
    followers = sorted(
        (cpu / seconds for b, cpu in r.broker_cpu_s.items() if b != r.leader), reverse=True
    )
    return f"{leader:.2f} / {' '.join(f'{f:.2f}' for f in followers)}"


def _run_row(r: ReplicatedRun) -> str:
    run = r.run
    return (
        f"{run.label:<{LABEL_WIDTH}} {r.leader:>6} {_num(run.records_per_s):>11}"
        f" {_num(run.payload_mb_per_s, 1):>7} {run.client_cores:>5.2f}  {_cpu(r):<16}"
        f" {_num(run.other_cores, 2):>6}"
    )


def _catch_up_lines(c: CatchUp) -> list[str]:
    seconds = c.transfer_s
    return [
        f"follower {c.follower} started again: first append after {c.restart_to_first_byte_s:.2f}"
        f" s; {c.bytes:,} log bytes in {seconds:.2f} s = {c.mb_per_s:,.1f} MB/s (leader "
        f"{c.leader} {c.leader_cpu_s / seconds:.2f} cores, follower "
        f"{c.follower_cpu_s / seconds:.2f}, others {c.other_cores:.2f}); back in the ISR "
        f"{c.restart_to_isr_s:.2f} s after its start",
        f"raw: the same bytes, sendfile over a socket into a file: {c.raw.mb_per_s:,.1f} MB/s "
        f"({c.raw.seconds:.2f} s); the catch-up is {c.ratio_to_raw:.2f} x raw",
    ]


def _failover_line(k: int, f: Failover) -> str:
    errors = ", ".join(f"{what} x{n}" for what, n in sorted(f.errors.items())) or "none"
    increase = "yes" if f.offsets_increase else "NO (acknowledged writes lost?)"
    fenced = "-" if f.fenced_after_s is None else f"{f.fenced_after_s:.2f} s"
    return (
        f"kill {k}: leader {f.killed} -> {f.new_leader}: unavailable {f.unavailable_s:.2f} s "
        f"(fenced by the controller after {fenced}, Metadata named the new leader after "
        f"{f.new_leader_named_s:.2f} s; "
        f"last ack {f.last_ack_before_kill_s * 1000:.0f} ms before the kill; meanwhile "
        f"{errors}); offsets after > before: {increase}; {f.killed} back in the ISR "
        f"{f.restart_to_isr_s:.1f} s after its restart"
    )


def print_replication(rep: Replication) -> None:
    p = rep.params
    print()
    print(
        f"Replication: 1 controller + 3 brokers, rounds' topics of {p.partitions} partition(s), "
        f"100-byte records, {p.batch_bytes:,} B batches, {p.in_flight} in flight per leader "
        f"connection, raw-protocol generator to the leaders, nothing pinned"
    )
    print(
        f"{'run':<{LABEL_WIDTH}} {'leader':>6} {'records/s':>11} {'MB/s':>7} {'gen':>5}  "
        f"{'leader / followers':<16} {'others':>6}"
    )
    for i, r in enumerate(rep.rounds):
        print(f"-- round {i + 1} of {len(rep.rounds)}, {p.max_s:g} s each")
        for run in (r.rf1, r.rf3_acks1, r.rf3_acks_all):
            print(_run_row(run))
        print(_brokers_cpu_line(r))
    c = rep.catch_up
    print(f"-- follower catch-up after a restart ({p.catch_up_bytes / 1e6:,.0f} MB produced)")
    print(_run_row(c.produce))
    for line in _catch_up_lines(c):
        print(line)
    print(
        f"-- failover: kill -9 of the leader under a paced acks=all probe (one write per "
        f"{p.probe_interval_ms:g} ms, retry after {p.probe_backoff_ms:g} ms), "
        f"min.insync.replicas {p.min_insync_replicas}, broker_session_timeout_ms "
        f"{rep.session_timeout_ms:,}"
    )
    for k, f in enumerate(rep.failovers, 1):
        print(_failover_line(k, f))
    print(
        "CPU: gen = cores of the load process; leader / followers = cores of each broker; "
        "others = the rest of the machine (the controller, other tenants)."
    )
    _print_targets(rep)


def _print_targets(rep: Replication) -> None:
    met = rep.met
    failover = f"<= {rep.failover_target_s:g} s"
    rows = [
        (
            f"RF 3 acks=all records/s (median of {len(rep.rounds)})",
            f">= {TARGET_RF3_ACKS_ALL_RECORDS_PER_S:,}",
            f"{rep.rf3_acks_all:,.0f}",
            "rf3_acks_all_records_per_s",
        ),
        (
            "RF 3 acks=all / RF 1, same round",
            f">= {TARGET_RF3_RATIO_TO_RF1}",
            ratio_text(rep.ratio),
            "rf3_ratio_to_rf1",
        ),
        (
            f"failover unavailability (worst of {len(rep.failovers)})",
            failover,
            f"{rep.failover_s:.2f} s",
            "failover_unavailable_s",
        ),
        (
            "follower catch-up MB/s",
            f">= {TARGET_CATCH_UP_MB_PER_S:g}",
            f"{rep.catch_up.mb_per_s:,.1f}",
            "catch_up_mb_per_s",
        ),
    ]
    print()
    print(f"{'replication figure':<44} {'target':>14} {'runnel':>12}")
    for name, target, value, key in rows:
        print(f"{name:<44} {target:>14} {value:>12}  {verdict(met[key])}")
    print(
        f"(RF 1 {rep.rf1:,.0f} records/s, RF 3 acks=1 {rep.rf3_acks1:,.0f} = "
        f"{rep.acks1_ratio:.2f} x RF 1; medians)"
    )


def _brokers_cpu_line(r: ReplicationRound) -> str:
    """All brokers' CPU per 16 KiB produced in each of the round's runs."""
    figures = []
    for name, run in (("RF 1", r.rf1), ("RF 3 acks=1", r.rf3_acks1), ("acks=all", r.rf3_acks_all)):
        split = run.run.server_us_per_16k()
        figures.append(f"{name} {'-' if split is None else f'{split[0]:.0f} + {split[1]:.0f}'}")
    return "   all brokers' CPU per 16 KiB produced, user + kernel us: " + ", ".join(figures)


def _replicated_json(r: ReplicatedRun) -> dict[str, Any]:
    out = asdict(r)
    run = r.run
    out["records_per_s"] = run.records_per_s
    out["payload_mb_per_s"] = run.payload_mb_per_s
    out["wire_mb_per_s"] = run.wire_mb_per_s
    out["records_per_broker_cpu_s"] = run.records_per_server_cpu_s  # all brokers' CPU
    out["brokers_user_kernel_us_per_16k"] = run.server_us_per_16k()  # all brokers' CPU
    return out


HEADLINE_KEYS = (
    "rf3_acks_all_records_per_s",
    "rf3_ratio_to_rf1",
    "failover_unavailable_s",
    "catch_up_mb_per_s",
    "rf1_records_per_s",
    "rf3_acks1_records_per_s",
    "catch_up_raw_mb_per_s",
    "catch_up_ratio_to_raw",
)


def headline_json(rep: Replication | None) -> dict[str, float | None]:
    """The four figures the issue names, then their baselines (None: the replication runs
    were left out)."""
    if rep is None:
        return dict.fromkeys(HEADLINE_KEYS)
    c = rep.catch_up
    values = (rep.rf3_acks_all, rep.ratio, rep.failover_s, c.mb_per_s, rep.rf1, rep.rf3_acks1)
    return dict(zip(HEADLINE_KEYS, (*values, c.raw.mb_per_s, c.ratio_to_raw), strict=True))


def replication_json(rep: Replication) -> dict[str, Any]:
    c = rep.catch_up
    catch_up = asdict(c)
    catch_up["produce"] = _replicated_json(c.produce)
    catch_up.update(mb_per_s=c.mb_per_s, raw_mb_per_s=c.raw.mb_per_s, ratio_to_raw=c.ratio_to_raw)
    return {
        **headline_json(rep),
        "rf3_acks1_ratio_to_rf1": rep.acks1_ratio,
        "broker_session_timeout_ms": rep.session_timeout_ms,
        "failover_target_s": rep.failover_target_s,
        "targets": {
            "rf3_acks_all_records_per_s": TARGET_RF3_ACKS_ALL_RECORDS_PER_S,
            "rf3_ratio_to_rf1": TARGET_RF3_RATIO_TO_RF1,
            "failover_unavailable_s": rep.failover_target_s,
            "catch_up_mb_per_s": TARGET_CATCH_UP_MB_PER_S,
        },
        "met": rep.met,
        "rounds": [
            {
                "rf1": _replicated_json(r.rf1),
                "rf3_acks1": _replicated_json(r.rf3_acks1),
                "rf3_acks_all": _replicated_json(r.rf3_acks_all),
                "rf3_ratio_to_rf1": r.acks_all_ratio,
            }
            for r in rep.rounds
        ],
        "catch_up": catch_up,
        "failovers": [asdict(f) for f in rep.failovers],
        "params": asdict(rep.params),
    }
