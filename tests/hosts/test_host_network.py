"""The many-hosts rig's network (mqd/testing/hosts_net.py): hosts as network namespaces on one
bridge, and each fault by host doing what it says to real TCP connections and nothing more.

Needs root, nftables and libfaketime (make install puts the last two in place as root); skips
elsewhere, saying what is missing."""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mqd_dev.chaos.proxy import Faults

from mqd.testing.hosts_net import HostNetwork, NetHost, missing_requirements
from mqd.testing.process import ManagedProcess
from mqd.waiting import wait_until_sync

pytestmark = pytest.mark.skipif(
    bool(missing_requirements(clock=True)),
    reason="the many-hosts rig needs " + ", ".join(missing_requirements(clock=True)),
)

PORT = 8000


def connects(src: NetHost, dst: NetHost, timeout: float = 0.5) -> bool:
    """A TCP connection from inside ``src`` to ``dst``'s server opens within ``timeout``."""
    code = f"import socket; socket.create_connection(({dst.address!r}, {PORT}), timeout={timeout})"
    r = subprocess.run(["ip", "netns", "exec", src.netns, sys.executable, "-c", code], capture_output=True)
    return r.returncode == 0


def fetch_seconds(src: NetHost, dst: NetHost) -> float:
    """Seconds an HTTP GET of ``dst``'s server takes from inside ``src`` (a new connection)."""
    code = f"import urllib.request; urllib.request.urlopen('http://{dst.address}:{PORT}/', timeout=10).read()"
    started = time.monotonic()
    subprocess.run(["ip", "netns", "exec", src.netns, sys.executable, "-c", code], check=True)
    return time.monotonic() - started


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostNetwork]:
    root = tmp_path_factory.mktemp("hostnet")
    with HostNetwork(root) as network:
        for name in ("a", "b", "c"):
            network.add_host(name)
        for h in network.hosts.values():
            server = h.process("http", [sys.executable, "-m", "http.server", str(PORT)], root / f"{name}.log")
            server.start()
            peer = network["c" if h.name != "c" else "a"]
            server.wait_ready(functools.partial(connects, peer, h), 20.0)
        yield network


@pytest.fixture(autouse=True)
def healed(net: HostNetwork) -> Iterator[None]:
    yield
    net.heal()


def test_hosts_reach_each_other_and_the_test_process_reaches_them(net: HostNetwork) -> None:
    """Every host has its own address on the bridge; every pair connects, both ways."""
    a, b, c = net["a"], net["b"], net["c"]
    assert len({a.address, b.address, c.address, net.address}) == 4
    assert all(connects(x, y) for x in (a, b, c) for y in (a, b, c) if x is not y)


def test_a_cut_splits_one_pair_only(net: HostNetwork) -> None:
    """a.cut(b): a and b no longer reach each other, in either direction; c still reaches both and
    both reach c. heal() restores the pair."""
    a, b, c = net["a"], net["b"], net["c"]
    a.cut(b)
    assert not connects(a, b) and not connects(b, a)
    assert connects(c, a) and connects(c, b) and connects(a, c) and connects(b, c)
    net.heal()
    assert connects(a, b) and connects(b, a)


def test_an_isolated_host_reaches_nobody(net: HostNetwork) -> None:
    """isolate(): nobody reaches the host and it reaches nobody; the others still reach each other."""
    a, b, c = net["a"], net["b"], net["c"]
    a.isolate()
    assert not connects(a, b) and not connects(b, a) and not connects(c, a)
    assert connects(b, c) and connects(c, b)


def test_loss_is_one_direction_only(net: HostNetwork) -> None:
    """b.loss(a, 1.0) drops what b sends to a: a's connection to b gets no answer (b's SYN-ACK is
    dropped), while c's to b and b's own sends to c go through; the share is a random draw per
    packet (nftables numgen)."""
    a, b, c = net["a"], net["b"], net["c"]
    b.loss(a, 1.0)
    assert not connects(a, b)
    assert connects(c, b) and connects(b, c)
    b.loss(a, 0.3)
    assert "numgen random mod 10000 < 3000 drop" in b.ruleset()
    b.loss(a, 0.0)
    assert connects(a, b)


def test_a_proxy_on_a_link_delays_that_link_only(net: HostNetwork) -> None:
    """mqd's fault proxy in front of c's server, for connections from a only: with 0.4 s delays
    (jitter 0.2-0.6 s per answer chunk) a's GET is that much slower; b's goes direct."""
    a, b, c = net["a"], net["b"], net["c"]
    proxy = net.proxy(c, PORT, source=a)
    proxy.faults = Faults(delay=1.0, delay_s=0.4)
    assert fetch_seconds(a, c) >= 0.2
    assert proxy.stats.injected.get("delay", 0) >= 1
    before = proxy.stats.connections
    fetch_seconds(b, c)
    assert proxy.stats.connections == before


def test_freeze_kill_and_restart_a_hosts_processes(net: HostNetwork) -> None:
    """freeze(): the host's server accepts (the kernel does) but never answers; thaw() lets it
    answer again; kill() SIGKILLs it, and starting the same process brings it back."""
    a, b = net["a"], net["b"]
    b.freeze()
    assert all(p.frozen for p in b.processes)
    b.thaw()
    fetch_seconds(a, b)
    (server,) = b.kill()
    assert not connects(a, b)
    server.start()
    wait_until_sync(lambda: connects(a, b), 20.0, "b's server back", interval=0.1)


def test_a_hosts_clock_is_stepped_for_its_processes_only(net: HostNetwork, tmp_path: Path) -> None:
    """step_clock(-600): a clock=True process of that host reads a wall clock 10 minutes behind
    (libfaketime), and its sleeps still sleep; another host's process reads the true time."""
    code = "import time; t = time.time(); time.sleep(0.1); print(t)"

    def wall(h: NetHost, clock: bool) -> float:
        argv = [sys.executable, "-c", code]
        p: ManagedProcess = h.process(f"clock-{clock}", argv, tmp_path / "c.log", clock=clock)
        p.log_path.unlink(missing_ok=True)
        p.start()
        assert p.wait(20.0) == 0, p.tail()
        return float(p.tail(1))

    net["c"].step_clock(-600)
    try:
        assert -610 < wall(net["c"], True) - time.time() < -590
        assert abs(wall(net["a"], True) - time.time()) < 10
        assert abs(wall(net["c"], False) - time.time()) < 10
    finally:
        net["c"].step_clock(0)


def test_close_leaves_no_namespace_bridge_or_process(tmp_path: Path) -> None:
    """After close() (even with a process still running and faults in place) the namespaces, the
    veths, the bridge and the processes are gone."""
    net = HostNetwork(tmp_path).start()
    h = net.add_host("x")
    p = h.process("sleep", ["sleep", "600"], tmp_path / "sleep.log")
    p.start()
    h.isolate()
    net.close()
    assert not p.running
    assert h.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert net.bridge not in links and h.veth not in links
