"""``free_port`` (mqd/testing/cluster.py), which every test cluster takes its nodes' ports from.

Proves that one process is never handed the same port twice (the kernel offers a closed probe's port
again: two nodes of one cluster were given one port and the master exited "address already in use"),
and that a preferred port is still given when it can be bound, whoever had it before.
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
