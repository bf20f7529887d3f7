"""The fault tests' judge of a final log (``fault_cluster.check_log``), as pure logic: which
copies of a record a producer without idempotence may legitimately have caused, and which
are a broken promise. It must not pass what a broker got wrong."""

from __future__ import annotations

import re
from pathlib import Path

import fault_cluster as rc

DESTROYED = (
    "12:00:00 MSGSET [rdkafka#producer-1] [thrd:10.0.0.5:9092/103]: 10.0.0.5:9092/103: "
    "t [0]: MessageSet with {n} message(s) (MsgId 0, BaseSeq -1) encountered error: "
    "Local: Broker handle destroyed without termination (actions Refresh,MsgNotPersisted)"
)
NOT_LEADER = (
    "12:00:00 MSGSET [rdkafka#producer-1] [thrd:10.0.0.5:9092/103]: 10.0.0.5:9092/103: "
    "t [0]: MessageSet with 2 message(s) (MsgId 0, BaseSeq -1) encountered error: "
    "Broker: Not leader for partition (actions Refresh,MsgNotPersisted)"
)


def batch(base: int, last: int, epoch: int) -> rc.StoredBatch:
    return rc.StoredBatch(base, last, epoch, 0, True)


def judge(
    values: list[str], epochs: list[tuple[int, int, int]], report: rc.LoadReport
) -> rc.LogCheck:
    """``values`` at offsets 0.. of partition 0, stored in batches (base, last, epoch)."""
    final = {0: list(enumerate(values))}
    return rc.check_log(final, [report], {0: [batch(*e) for e in epochs]})


def sent(*values: str, idempotent: bool = False, errors: list[str] | None = None) -> rc.LoadReport:
    report = rc.LoadReport(sent=list(values), idempotent=idempotent)
    report.client_errors.extend(errors or [])
    return report


def test_copies_in_later_epochs_are_resends_across_a_leader_change() -> None:
    check = judge(["a", "b", "a"], [(0, 1, 0), (2, 2, 1)], sent("a", "b"))
    assert check.problems == []
    assert check.retried == {"a": [(0, 0, 0), (0, 2, 1)]}


def test_copies_in_one_epoch_are_a_problem_unless_the_client_dropped_a_broker_handle() -> None:
    layout = [(0, 1, 0), (2, 3, 0)]
    alone = judge(["a", "b", "a", "b"], layout, sent("a", "b", errors=[NOT_LEADER]))
    assert len(alone.problems) == 1 and "more than once" in alone.problems[0]

    dropped = sent("a", "b", errors=[DESTROYED.format(n=2)])
    check = judge(["a", "b", "a", "b"], layout, dropped)
    assert check.problems == []
    assert set(check.retried) == {"a", "b"}


def test_more_copies_in_one_epoch_than_the_client_resent_are_a_problem() -> None:
    layout = [(0, 1, 0), (2, 3, 0)]
    check = judge(["a", "b", "a", "b"], layout, sent("a", "b", errors=[DESTROYED.format(n=1)]))
    assert len(check.problems) == 1 and "'b'" in check.problems[0], check.problems
    assert set(check.retried) == {"a"}


def test_resends_on_another_partition_do_not_excuse_this_one() -> None:
    other = DESTROYED.format(n=5).replace("t [0]", "t [1]")
    check = judge(["a", "a"], [(0, 0, 0), (1, 1, 0)], sent("a", errors=[other]))
    assert len(check.problems) == 1


def test_an_idempotent_producers_copies_are_always_a_problem() -> None:
    errors = [DESTROYED.format(n=5)]
    check = judge(["a", "a"], [(0, 0, 0), (1, 1, 1)], sent("a", idempotent=True, errors=errors))
    assert len(check.problems) == 1


def test_copies_out_of_epoch_order_are_a_problem() -> None:
    errors = [DESTROYED.format(n=5)]
    check = judge(["a", "b", "a"], [(0, 0, 1), (1, 1, 1), (2, 2, 0)], sent("a", "b", errors=errors))
    assert len(check.problems) >= 1


def test_the_producers_log_is_read_for_handle_drops_only() -> None:
    lines = [DESTROYED.format(n=3), NOT_LEADER, DESTROYED.format(n=2).replace("t [0]", "t [4]")]
    assert rc.handle_destroyed_resends(lines) == {0: 3, 4: 2}


def test_the_producer_keeps_failed_message_sets_and_metadata_listing_no_broker() -> None:
    """What a failing fault test writes beside the cluster: the lines ``check_log`` reads,
    and those that would show librdkafka's stall after a Metadata answer with no broker."""
    kept: list[str] = []
    lines = rc.ClientLines(kept)
    none = "METADATA [rdkafka#producer-1] [thrd:main]: 10.0.0.5:9092/103: 0 brokers, 1 topics"
    some = "METADATA [rdkafka#producer-1] [thrd:main]: 10.0.0.5:9092/103: 3 brokers, 1 topics"
    for line in (DESTROYED.format(n=2)[9:], none, some, "BROKER [rdkafka#producer-1] up"):
        lines.log(7, "%s", line)
    assert [k[9:] for k in kept] == [DESTROYED.format(n=2)[9:], none]


def test_a_consumer_keeps_its_latest_lines_and_writes_them_out(tmp_path: Path) -> None:
    """What a fault test writes beside the cluster when a consumer read nothing (or too
    little): its last ``MAX`` librdkafka lines, oldest first, each stamped."""
    recent = rc.RecentLines()
    for i in range(rc.RecentLines.MAX + 5):
        recent.log(7, "FETCH [rdkafka#consumer-1] fetch %d", i)
    said = recent.write(tmp_path / "lines.log")
    written = (tmp_path / "lines.log").read_text().splitlines()
    assert len(written) == rc.RecentLines.MAX and str(tmp_path / "lines.log") in said
    last = rc.RecentLines.MAX + 4
    assert written[0].endswith("fetch 5") and written[-1].endswith(f"fetch {last}")
    assert re.fullmatch(r"\d\d:\d\d:\d\d FETCH .*", written[0])
