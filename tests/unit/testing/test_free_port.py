"""``free_port`` (mqd/testing/cluster.py), which every test cluster takes its nodes' ports from.

Proves that one process is never handed the same port twice (the kernel offers a closed probe's port
again: two nodes of one cluster were given one port and the master exited "address already in use"),
that a preferred port is still given when it can be bound, whoever had it before, and that ports
come from below the range the kernel takes outgoing connections' source ports from.
"""

from __future__ import annotations

import socket

from mqd.testing.cluster import free_port


def test_never_the_same_port_twice() -> None:
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)


def test_a_preferred_port_is_given_when_it_can_be_bound() -> None:
    port = free_port()
    assert free_port(port) == port  # a restarted node keeps its port
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        other = free_port(port)
    assert other != port


def test_ports_come_from_below_the_ephemeral_range() -> None:
    """No outgoing connection can take a handed-out port as its source port before the server binds
    it: the kernel picks source ports from ip_local_port_range, and free_port stays below it (a CI
    run's broker exited "address already in use" on a port bind(0) had offered)."""
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    assert all(1024 <= free_port() < low for _ in range(500))
