"""How concurrent test processes share ``SUBNETS`` (``netns_cluster.Network``): a network
takes its /24 under the subnet lock, and takes another if the one it chose at construction
was taken meanwhile (by another test process, here played by a bridge holding an
address in it). Real namespaces, veth pairs and bridges: needs root; skipped, saying so,
elsewhere.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator

import netns_cluster as nc
import pytest

WAIT_S = 10.0
BLOCKED_S = 1.0  # how long a network waiting for the lock is watched not to go on


@pytest.fixture(autouse=True)
def _namespaces() -> None:
    why = nc.available()
    if why is not None:
        pytest.skip(why)


@pytest.fixture
def network() -> Iterator[nc.Network]:
    net = nc.Network((1, 2))
    try:
        yield net
    finally:
        net.close()


def bridge_networks(net: nc.Network) -> list[str]:
    return [
        line.split()[3]
        for line in nc.ip("-4", "-o", "addr", "show", "dev", net.bridge).splitlines()
    ]


def test_a_network_takes_another_subnet_if_its_first_choice_was_taken(
    network: nc.Network,
) -> None:
    chosen = network.subnet
    other = f"rnd{os.getpid()}"
    nc.ip("link", "add", other, "type", "bridge")
    try:
        nc.ip("addr", "add", f"{chosen[1]}/{chosen.prefixlen}", "dev", other)
        network.up()
        assert network.subnet != chosen
        assert not network.subnet.overlaps(chosen)
        assert bridge_networks(network) == [f"{network.subnet[1]}/{network.subnet.prefixlen}"]
    finally:
        nc.ip("link", "delete", other)


def test_a_network_takes_its_subnet_only_under_the_lock(network: nc.Network) -> None:
    failed: list[BaseException] = []

    def up() -> None:
        try:
            network.up()
        except BaseException as e:
            failed.append(e)

    with open(nc.SUBNET_LOCK, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        worker = threading.Thread(target=up, daemon=True)
        worker.start()
        worker.join(BLOCKED_S)
        assert worker.is_alive(), f"up() finished while another held the lock: {failed}"
        assert not bridge_networks(network), "the bridge got an address under another's lock"
    worker.join(WAIT_S)
    assert not worker.is_alive(), "up() still waits once the lock is free"
    assert not failed, failed
    assert bridge_networks(network) == [f"{network.subnet[1]}/{network.subnet.prefixlen}"]
