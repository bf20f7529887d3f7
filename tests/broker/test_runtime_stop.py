"""The broker's data plane stopping (broker/runtime.py) while the metadata log goes on: the
Raft node closes after the broker, so images keep arriving during ``stop``; none may create
a log or start a fetcher once the broker is stopping. In process, with real logs, a real
listener on a free port, and a stand-in for the metadata state machine that hands images to
its subscribers."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from broker.context import BrokerSettings
from broker.runtime import KafkaBroker
from broker.server import ServerConfig
from controller import records as rec
from controller.client import ControllerClient
from controller.image import MetadataDelta, MetadataImage
from controller.state_machine import MetadataStateMachine
from raft.testing.processes import free_ports
from storage.config import LogConfig
from storage.log_manager import LogManager

ME, OTHER = 1, 2


class Publisher:
    """What KafkaBroker uses of MetadataStateMachine: subscribers to published images."""

    def __init__(self) -> None:
        self.subscribers: list[Callable[[MetadataImage], None]] = []

    def on_publish(self, callback: Callable[[MetadataImage], None]) -> None:
        self.subscribers.append(callback)

    def publish(self, image: MetadataImage) -> None:
        for callback in self.subscribers:
            callback(image)


def image_with(base: MetadataImage, *records: Any) -> MetadataImage:
    delta = MetadataDelta(base)
    for offset, record in enumerate(records, base.offset + 1):
        delta.replay(record, offset)
    return delta.apply()


def broker_on(port: int, logs: LogManager, publisher: Publisher) -> KafkaBroker:
    return KafkaBroker(
        BrokerSettings(ME, "cluster", "CLIENT"),
        ServerConfig(),
        "127.0.0.1",
        port,
        logs,
        cast(MetadataStateMachine, publisher),
        cast(ControllerClient, None),  # nothing here is forwarded or proposed
        lambda: 0,
        fetch_max_waiting=10,
    )


def test_images_published_while_the_broker_stops_change_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        (port,) = free_ports(1)
        listeners = {b: [("CLIENT", "127.0.0.1", port + b)] for b in (ME, OTHER)}
        first = image_with(
            MetadataImage.EMPTY,
            *[
                rec.register_broker(b, 0, bytes([b]) * 16, listeners[b], fenced=False)
                for b in listeners
            ],
            rec.topic("before", b"b" * 16),
            rec.partition(b"b" * 16, 0, [ME], [ME], leader=ME),
        )
        logs = LogManager([tmp_path / "data"], LogConfig())
        publisher = Publisher()
        broker = broker_on(port, logs, publisher)
        await broker.start(first)
        stopping = asyncio.create_task(broker.stop())
        await asyncio.sleep(0)  # stop() has begun: the listener is closing
        later = image_with(
            first,
            rec.topic("led", b"l" * 16),
            rec.partition(b"l" * 16, 0, [ME], [ME], leader=ME),
            rec.topic("followed", b"f" * 16),
            rec.partition(b"f" * 16, 0, [OTHER, ME], [OTHER, ME], leader=OTHER),
        )
        publisher.publish(later)
        await asyncio.wait_for(stopping, 30)
        made = sorted(p.name for p in (tmp_path / "data").iterdir() if p.is_dir())
        assert made == ["before-0"], made
        assert not broker.fetchers.fetchers, "a fetcher was started after the broker stopped"

    asyncio.run(main())


def test_an_image_published_while_the_logs_load_is_applied(tmp_path: Path) -> None:
    """The node hands ``start`` the image of the moment it was unfenced; loading the logs
    (recovery after a crash) may take long enough for the controller to publish more, such as
    a leadership given to this broker at once. That image must be applied when the logs are
    loaded, not wait for the next metadata change (a nemesis run saw a restarted broker keep
    following at an old epoch for 36 s, its followers refused as fenced)."""

    async def main() -> None:
        (port,) = free_ports(1)
        listener = [("CLIENT", "127.0.0.1", port)]
        first = image_with(
            MetadataImage.EMPTY, rec.register_broker(ME, 0, b"m" * 16, listener, fenced=False)
        )
        logs = LogManager([tmp_path / "data"], LogConfig())
        loading, release = threading.Event(), threading.Event()
        startup = logs.startup

        def slow_startup() -> None:
            loading.set()
            assert release.wait(30), "never released"
            startup()

        logs.startup = slow_startup  # type: ignore[method-assign]
        publisher = Publisher()
        broker = broker_on(port, logs, publisher)
        starting = asyncio.create_task(broker.start(first))
        assert await asyncio.to_thread(loading.wait, 30)
        publisher.publish(
            image_with(
                first,
                rec.topic("led", b"l" * 16),
                rec.partition(b"l" * 16, 0, [ME], [ME], leader=ME),
            )
        )
        release.set()
        try:
            await asyncio.wait_for(starting, 30)
            led = broker.replicas.get("led", 0)
            assert led is not None, "the image published during the start was not applied"
            assert led.is_leader
        finally:
            await broker.stop()

    asyncio.run(main())


def test_the_follower_fetchers_say_this_broker_s_epoch(tmp_path: Path) -> None:
    """KIP-903: the fetchers' requests carry the epoch the broker registered with (the
    lifecycle's, read when each request is built), so the leaders can tell incarnations
    apart."""
    epoch = [5]
    broker = KafkaBroker(
        BrokerSettings(ME, "cluster", "CLIENT"),
        ServerConfig(),
        "127.0.0.1",
        0,
        LogManager([tmp_path / "data"], LogConfig()),
        cast(MetadataStateMachine, Publisher()),
        cast(ControllerClient, None),
        lambda: epoch[0],
        fetch_max_waiting=10,
    )
    assert broker.fetchers.broker_epoch() == 5
    epoch[0] = 6
    assert broker.fetchers.broker_epoch() == 6
