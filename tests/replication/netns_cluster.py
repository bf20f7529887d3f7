"""A cluster whose nodes are separate hosts: each node runs in a network namespace of its
own, joined to the others and to the test process by a bridge, so that a test can cut the
network between two nodes while both keep running and the test's clients reach both.

How this works. ``Network`` makes, for nodes ``n0 .. nk``: a bridge ``rnb<tag>`` in the test
process's namespace holding the subnet's first address (the clients' side); per node a
namespace ``runnel-<tag>-<node>`` with one end of a veth pair (``rnv<tag><i>`` on the
bridge) holding the node's address. The tag is ``<pid>x<n>``, n counting the networks this
process made: the kernel may still be tearing down a network the last test deleted.
``cut(a, b)`` adds a blackhole route to each in the other's namespace: nothing passes between
the two (a connection attempt fails at once, a connection open before sees its packets
vanish), while both still reach everyone else and the test process. ``heal`` removes the
routes. Concurrent test processes each take a /24 of ``SUBNETS`` that no address of this
namespace overlaps; ``up`` chooses it (again, if another took the one chosen at
construction) and gives the bridge its address under an exclusive lock on ``SUBNET_LOCK``,
so two cannot take the same one between looking and taking. ``close`` deletes the veth
pairs, the namespaces and the bridge; ``remove_stale`` deletes what a test process that died
left (its pid is in the names).

``start_netns_cluster`` is ``fault_cluster.start_cluster`` on such a network: the same
``ClusterSpec`` files with each node's addresses moved to its namespace's, each node started
under ``ip netns exec`` (which execs it: its pid is the node's), and the same ``Cluster``
helpers, which reach nodes at ``host(node)``.

Needs root (or CAP_NET_ADMIN) and iproute2; ``available`` says whether this machine has
them, and why not.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import itertools
import os
import re
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import fault_cluster as rc
from test_local_cluster import free_base_port

from runnel.local_cluster import ClusterSpec, process_alive

IP_TIMEOUT_S = 10.0
SUBNETS = ipaddress.ip_network("10.231.0.0/16")  # one /24 of it per network
SUBNET_LOCK = Path("/tmp/runnel-netns-subnets.lock")  # held while a network takes its /24


def ip(*args: str, namespace: str | None = None) -> str:
    """Run ``ip ARGS`` (inside ``namespace`` if given); raises with its stderr on failure."""
    command = ["ip", *args] if namespace is None else ["ip", "-n", namespace, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
    return done.stdout


def available() -> str | None:
    """None if network namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"runnel-probe-{os.getpid()}"
    try:
        ip("netns", "add", probe)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        return f"cannot make a network namespace: {e}"
    try:
        ip("link", "add", f"rnp{os.getpid()}", "type", "veth", "peer", "name", "eth0",
           "netns", probe)  # fmt: skip
        ip("route", "add", "blackhole", "192.0.2.1/32", namespace=probe)
        ip("link", "add", "br0", "type", "bridge", namespace=probe)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return f"cannot make a veth pair, a bridge or a blackhole route: {e}"
    finally:
        ip("netns", "delete", probe)  # takes the veth pair and the bridge with it
    return None


def remove_stale() -> None:
    """Delete the namespaces, veth pairs and bridges of test processes that are gone."""
    for name in ip("netns", "list").split():
        found = re.fullmatch(r"runnel-(\d+)x\d+-\d+", name)
        if found and not process_alive(int(found.group(1))):
            ip("netns", "delete", name)
    links = ip("-o", "link", "show")
    for found in re.finditer(r"^\d+: (rn[vb](\d+)x\d+)[:@]", links, re.MULTILINE):
        if not process_alive(int(found.group(2))):
            with contextlib.suppress(RuntimeError):  # a veth pair may go with its namespace
                ip("link", "delete", found.group(1))


def _taken() -> set[ipaddress.IPv4Network]:
    """The networks of this namespace's IPv4 addresses."""
    return {
        ipaddress.IPv4Interface(m.group(1)).network
        for m in re.finditer(r"inet (\S+)", ip("-4", "-o", "addr", "show"))
    }


@contextlib.contextmanager
def _subnet_lock() -> Iterator[None]:
    with open(SUBNET_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
        yield


def _free_subnet() -> ipaddress.IPv4Network:
    taken = _taken()
    subnets = list(SUBNETS.subnets(new_prefix=24))
    start = os.getpid() % len(subnets)  # concurrent test processes start apart
    for subnet in subnets[start:] + subnets[:start]:
        if not any(subnet.overlaps(t) for t in taken):
            return subnet
    raise RuntimeError(f"no free /24 in {SUBNETS}")


_networks = itertools.count()


def _new_tag() -> str:
    return f"{os.getpid()}x{next(_networks) % 1000}"  # at most 11 characters


@dataclass
class Network:
    nodes: Sequence[int]
    tag: str = field(default_factory=_new_tag)
    subnet: ipaddress.IPv4Network = field(default_factory=_free_subnet)
    cuts: set[tuple[int, int]] = field(default_factory=set)
    _made: list[str] = field(default_factory=list)  # namespaces made so far
    _veths: list[str] = field(default_factory=list)  # their pairs' outer ends

    @property
    def bridge(self) -> str:
        return f"rnb{self.tag}"

    def namespace(self, node: int) -> str:
        return f"runnel-{self.tag}-{node}"

    def address(self, node: int) -> str:
        return str(self.subnet[2 + list(self.nodes).index(node)])

    def up(self) -> None:
        ip("link", "add", self.bridge, "type", "bridge")
        with _subnet_lock():
            if any(self.subnet.overlaps(t) for t in _taken()):
                self.subnet = _free_subnet()
            ip("addr", "add", f"{self.subnet[1]}/{self.subnet.prefixlen}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for i, node in enumerate(self.nodes):
            ns, outside = self.namespace(node), f"rnv{self.tag}{i}"
            ip("netns", "add", ns)
            self._made.append(ns)
            ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._veths.append(outside)
            ip("link", "set", outside, "master", self.bridge)
            ip("link", "set", outside, "up")
            ip("addr", "add", f"{self.address(node)}/{self.subnet.prefixlen}", "dev", "eth0",
               namespace=ns)  # fmt: skip
            ip("link", "set", "eth0", "up", namespace=ns)
            ip("link", "set", "lo", "up", namespace=ns)

    def cut(self, a: int, b: int) -> None:
        """Nothing passes between ``a`` and ``b`` from now on (already cut: nothing to do)."""
        pair = (min(a, b), max(a, b))
        if pair in self.cuts:
            return
        for here, there in ((a, b), (b, a)):
            ip("route", "add", "blackhole", f"{self.address(there)}/32",
               namespace=self.namespace(here))  # fmt: skip
        self.cuts.add(pair)

    def heal(self, a: int, b: int) -> None:
        """``a`` and ``b`` reach each other again (not cut: nothing to do)."""
        pair = (min(a, b), max(a, b))
        if pair not in self.cuts:
            return
        for here, there in ((a, b), (b, a)):
            ip("route", "delete", "blackhole", f"{self.address(there)}/32",
               namespace=self.namespace(here))  # fmt: skip
        self.cuts.discard(pair)

    def isolate(self, node: int, others: Iterable[int]) -> list[tuple[int, int]]:
        """Cut ``node`` from each of ``others``; returns the pairs cut."""
        pairs = [(node, other) for other in others]
        for a, b in pairs:
            self.cut(a, b)
        return pairs

    def heal_all(self) -> None:
        for a, b in sorted(self.cuts):
            self.heal(a, b)

    def close(self) -> None:
        """Delete everything made (what fails to go is said, not raised: the next
        ``remove_stale`` tries again)."""
        problems = []
        for veth in self._veths:  # at once: a namespace's own teardown may lag
            try:
                ip("link", "delete", veth)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                problems.append(str(e))
        for ns in self._made:
            try:
                ip("netns", "delete", ns)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                problems.append(str(e))
        try:
            ip("link", "delete", self.bridge)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            problems.append(str(e))
        if problems:
            print("network cleanup:", "; ".join(problems))


@dataclass
class NetnsCluster(rc.Cluster):
    network: Network | None = None

    def _network(self) -> Network:
        assert self.network is not None
        return self.network

    def host(self, node: int) -> str:
        return self._network().address(node)

    def command_prefix(self, node: int) -> list[str]:
        return ["ip", "netns", "exec", self._network().namespace(node)]


def start_netns_cluster(
    data_dir: Path,
    network: Network,
    overrides: dict[str, dict[str, int]] | None = None,
    controllers: int = 1,
) -> NetnsCluster:
    """``controllers`` controllers (ids 1..) and 3 brokers (``fault_cluster``'s ids and
    settings), each in its own namespace of ``network``, healthy."""
    nodes = controllers + len(rc.BROKERS)
    spec = ClusterSpec(controllers, len(rc.BROKERS), data_dir.absolute(), free_base_port(nodes))
    spec.save()
    spec.write_node_configs()
    chosen = rc.settings(overrides or {})
    for node in spec.nodes():
        path = spec.config_path(node.node_id)
        lines = []
        for line in path.read_text().splitlines():
            if line.startswith("listeners = "):
                line = line.replace("127.0.0.1", network.address(node.node_id))
            elif line.startswith("controller_quorum_voters = "):
                line = re.sub(
                    r"(\d+)@127\.0\.0\.1:",
                    lambda m: f"{m.group(1)}@{network.address(int(m.group(1)))}:",
                    line,
                )
            lines.append(line)
        path.write_text("\n".join(lines) + "\n" + rc._settings_toml(chosen))
    cluster = NetnsCluster(spec, chosen, network=network)
    try:
        for node in spec.nodes():
            cluster.start(node.node_id)
        rc.wait_for(
            "every broker to list all three unfenced",
            lambda: True if all(cluster._lists_all(b) for b in rc.BROKERS) else None,
            rc.UP_TIMEOUT_S,
            0.25,
        )
    except BaseException:
        rc.stop_cluster(cluster)
        raise
    cluster.started = time.monotonic()
    cluster.note(f"cluster up in {spec.data_dir}, bootstrap {cluster.bootstrap}")
    return cluster


@contextlib.contextmanager
def running(
    data_dir: Path, overrides: dict[str, dict[str, int]] | None = None, controllers: int = 1
) -> Iterator[NetnsCluster]:
    """A healthy cluster on a network of its own (``start_netns_cluster``); on the way out
    the processes are killed (``fault_cluster.finish``, which prints what a failure needs)
    and the network deleted. The caller checks ``available`` first."""
    remove_stale()
    network = Network((*range(1, controllers + 1), *rc.BROKERS))
    try:
        network.up()
        cluster = start_netns_cluster(data_dir, network, overrides, controllers)
        try:
            yield cluster
        finally:
            rc.finish(cluster)
    finally:
        network.close()
