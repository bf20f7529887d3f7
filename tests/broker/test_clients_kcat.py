"""kcat (librdkafka 2.0.2 in Debian's kcat 1.7.1) against a real local cluster of 1 controller
and 2 brokers: ``-L`` lists the brokers and topics, and lines produced with ``-P`` under each
codec come back from ``-C -e`` exactly, in order per partition. Skipped when kcat is not
installed.

Lines are ``key<TAB>value``; a line without the tab is a record without a key. kcat cannot
set a record's timestamp, so the test checks that each is the time it was produced.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections import Counter
from typing import NamedTuple

import pytest
from kafka_cluster import (
    BROKER_IDS,
    FIND_COORDINATOR,
    PARTITIONS,
    PRODUCE,
    WAIT_S,
    KafkaCluster,
    advertised_versions,
    assert_stored_codecs,
    create_topic,
    kafka,
)

__all__ = ["kafka"]  # the fixture

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("kcat") is None,
        reason="kcat is not installed (README: `sudo apt-get install kcat` on Debian or "
        "Ubuntu; `brew install kcat` on macOS)",
    ),
]
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def kcat(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["kcat", *args], input=stdin, capture_output=True, text=True, timeout=WAIT_S
    )
    assert done.returncode == 0 and "ERROR" not in done.stderr, f"kcat {args}: {done.stderr}"
    return done.stdout


def test_kcat_lists_the_brokers_and_the_topics(kafka: KafkaCluster) -> None:
    create_topic(kafka, "kc-metadata")
    listing = json.loads(kcat("-L", "-J", "-b", kafka.bootstrap))
    addresses = kafka.bootstrap.split(",")
    assert sorted((b["id"], b["name"]) for b in listing["brokers"]) == list(
        zip(BROKER_IDS, addresses, strict=True)
    )
    assert listing["controllerid"] in BROKER_IDS
    (topic,) = [t for t in listing["topics"] if t["topic"] == "kc-metadata"]
    parts = sorted(topic["partitions"], key=lambda p: p["partition"])
    assert [p["partition"] for p in parts] == list(range(PARTITIONS))
    for p in parts:
        assert p["leader"] in BROKER_IDS and "error" not in p
        assert p["replicas"] == [{"id": p["leader"]}] and p["isrs"] == [{"id": p["leader"]}]
    assert {p["leader"] for p in parts} == set(BROKER_IDS)

    text = kcat("-L", "-b", kafka.bootstrap, "-t", "kc-metadata")
    assert " 2 brokers:" in text and 'topic "kc-metadata" with 3 partitions:' in text
    for broker_id, address in zip(BROKER_IDS, addresses, strict=True):
        assert f"broker {broker_id} at {address}" in text


class Line(NamedTuple):
    key: str | None
    value: str
    headers: tuple[str, ...]  # as kcat -J shows them: key, value, key, value, ...


def _lines(codec: str, count: int) -> list[Line]:
    headers = ("label", codec, "accents", "\u00e9\u00e8")
    return [
        Line(f"key-{i % 3}" if i % 2 == 0 else None, f"{codec} line {i:03d}; " * 8, headers)
        for i in range(count)
    ]


def test_kcat_round_trips_lines_under_every_codec(kafka: KafkaCluster) -> None:
    topic = "kc-codecs"
    create_topic(kafka, topic)
    sent: list[Line] = []  # in produce order
    before_ms = int(time.time() * 1000)
    for codec in CODECS:
        lines = _lines(codec, 24)
        stdin = "".join(f"{x.key}\t{x.value}\n" if x.key else f"{x.value}\n" for x in lines)
        h = lines[0].headers
        kcat(
            "-P", "-b", kafka.bootstrap, "-t", topic, "-z", codec, "-K", "\t",
            "-H", f"{h[0]}={h[1]}", "-H", f"{h[2]}={h[3]}", "-X", "linger.ms=20", stdin=stdin,
        )  # fmt: skip
        sent += lines
    after_ms = int(time.time() * 1000)

    out = kcat("-C", "-b", kafka.bootstrap, "-t", topic, "-e", "-o", "beginning", "-J", "-q")
    consumed = [json.loads(line) for line in out.splitlines()]
    got = {(m["partition"], m["offset"]): Line(m["key"], m["payload"], tuple(m["headers"]))
           for m in consumed}  # fmt: skip
    assert len(got) == len(consumed) and Counter(got.values()) == Counter(sent)  # all differ
    for m in consumed:
        assert m["tstype"] == "create" and before_ms <= m["ts"] <= after_ms, m
    place = {line: i for i, line in enumerate(sent)}
    for partition in range(PARTITIONS):
        offsets = sorted(o for p, o in got if p == partition)
        assert offsets == list(range(len(offsets))), partition
        places = [place[got[partition, o]] for o in offsets]
        assert places == sorted(places), f"partition {partition}: not in produce order"

    at = {codec: [(p, o) for (p, o), line in got.items() if line.headers[1] == codec]
          for codec in CODECS}  # fmt: skip
    _assert_compression_is_advertised(kafka)
    assert_stored_codecs(kafka, topic, at, {codec: codec for codec in CODECS})


def _assert_compression_is_advertised(kafka: KafkaCluster) -> None:
    """librdkafka 2.0.2 compresses gzip, snappy and lz4 only if the broker's Produce range
    starts at v0, and lz4 only if it also advertises FindCoordinator; otherwise it silently
    sends those batches uncompressed."""
    versions = advertised_versions(kafka.bootstrap)
    assert versions[PRODUCE][0] == 0 and FIND_COORDINATOR in versions, versions
