"""The metadata state machine: records become the image; the published image (what other
threads such as the metrics endpoint read) follows without anyone asking for it."""

from __future__ import annotations

import asyncio

from controller import records as rec
from controller.records import encode
from controller.state_machine import MetadataStateMachine


def test_the_published_image_follows_applied_records_on_the_next_loop_turn() -> None:
    async def main() -> None:
        machine = MetadataStateMachine()
        machine.apply(0, encode(rec.topic("orders", b"o" * 16)))
        machine.apply(1, encode(rec.topic("events", b"e" * 16)))
        assert machine.published.offset == -1  # built only once the burst is over
        await asyncio.sleep(0)
        assert machine.published.offset == 1
        assert sorted(machine.published.topic_ids) == ["events", "orders"]

    asyncio.run(main())


def test_without_an_event_loop_the_image_is_built_on_demand() -> None:
    machine = MetadataStateMachine()
    machine.apply(0, encode(rec.topic("orders", b"o" * 16)))
    assert machine.image.topic_by_name("orders") is not None
    assert machine.published is machine.image


def test_a_snapshot_restores_an_equal_image() -> None:
    machine = MetadataStateMachine()
    machine.apply(0, encode(rec.topic("orders", b"o" * 16)))
    other = MetadataStateMachine()
    other.restore(machine.snapshot())
    assert other.image == machine.image and other.image.digest() == machine.image.digest()
