"""The benchmarks' shared report helpers."""

from __future__ import annotations

from bench.common import ratio_text, verdict


def test_a_ratio_just_below_its_target_does_not_print_as_the_target() -> None:
    # bench.produce_consume once printed a produce/raw ratio of 0.4966 as "0.50 MISSED"
    assert ratio_text(0.4966) == "0.497"
    assert (ratio_text(0.5), verdict(0.5 >= 0.5)) == ("0.500", "met")
    assert ratio_text(0.2469742369267688) == "0.247"
