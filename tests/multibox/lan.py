"""A small LAN of network namespaces: the client's namespace and N boxes', each box joined to
the client's by a veth pair, so boxes reach each other (torchrun's c10d rendezvous, gloo) and
the client reaches every box (ssh). Addresses from 198.18.0.0/15
(RFC 2544 benchmarking space), a /24 per test process. `cut(i)` takes box i's end of its link
down: its packets vanish silently, as on a dead uplink. Everything is removed on `close()`.
"""

from __future__ import annotations

import os
import subprocess

from tests.ssh.netns import _ip, delete_namespaces


class Lan:
    """A star: the client's namespace is the hub (it forwards), each box on its own /30 link
    to it, so boxes reach each other through the hub and a cut link isolates one box."""

    def __init__(self, tag: str, boxes: int) -> None:
        n = os.getpid() % 250 + 1
        self.client_ns = f"eagle-lc-{tag}"
        self.box_ns = [f"eagle-lb{i}-{tag}" for i in range(boxes)]
        base = [4 * i for i in range(boxes)]
        self.box_addr = [f"198.19.{n}.{b + 1}" for b in base]
        self.hub_addr = [f"198.19.{n}.{b + 2}" for b in base]  # the client's end of link i
        self.box_if = [f"lb{i}{tag}"[:15] for i in range(boxes)]  # the box's end (inside it)
        self.hub_if = [f"lh{i}{tag}"[:15] for i in range(boxes)]
        self.net = f"198.19.{n}.0/24"
        self.created: list[str] = []

    def create(self) -> Lan:
        for ns in (self.client_ns, *self.box_ns):
            _ip("netns", "del", ns, check=False)  # a leftover of a killed run
            _ip("netns", "add", ns)
            self.created.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        subprocess.run(
            ["ip", "netns", "exec", self.client_ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
            check=True,
        )
        for i, ns in enumerate(self.box_ns):
            _ip("link", "add", self.box_if[i], "type", "veth", "peer", "name", self.hub_if[i])
            _ip("link", "set", self.box_if[i], "netns", ns)
            _ip("link", "set", self.hub_if[i], "netns", self.client_ns)
            _ip("-n", ns, "addr", "add", f"{self.box_addr[i]}/30", "dev", self.box_if[i])
            _ip(
                "-n", self.client_ns, "addr", "add", f"{self.hub_addr[i]}/30", "dev", self.hub_if[i]
            )
            _ip("-n", self.client_ns, "link", "set", self.hub_if[i], "up")
            self.restore(i)
        return self

    @property
    def client_addr(self) -> str:
        return self.hub_addr[0]

    def cut(self, i: int) -> None:
        _ip("-n", self.box_ns[i], "link", "set", self.box_if[i], "down")

    def restore(self, i: int) -> None:
        _ip("-n", self.box_ns[i], "link", "set", self.box_if[i], "up")
        # the route to the other boxes goes with the link: put it back each time
        _ip("-n", self.box_ns[i], "route", "replace", self.net, "via", self.hub_addr[i])

    def client_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.client_ns]

    def close(self) -> None:
        self.created.reverse()  # boxes before the hub they hang off
        delete_namespaces(self.created)
