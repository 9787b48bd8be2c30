"""Two network namespaces joined by a veth pair: the box (sshd) on one side, the client on the
other, addresses from 198.18.0.0/15 (RFC 2544 benchmarking space) only. `cut()` takes the
box's end of the link down, so packets vanish silently (no RST, no ICMP): the way a dropped
Wi-Fi or a rented box's flaky uplink looks to TCP. Everything is removed on `close()`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def delete_namespaces(created: list[str]) -> None:
    """Kill what still runs in each namespace, then delete it (it takes its veth pairs along);
    empties `created`."""
    for ns in created:
        pids = _ip("netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        if pids:
            time.sleep(0.2)
        _ip("netns", "del", ns, check=False)
    created.clear()


def have_netns() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = f"eagle-probe-{os.getpid()}"
    ok = _ip("netns", "add", probe, check=False).returncode == 0
    if ok:
        _ip("netns", "del", probe, check=False)
    return ok


class NetnsPair:
    def __init__(self, tag: str) -> None:
        n = os.getpid() % 16000 + 1  # a /30 per test process: 198.18.0.0 - 198.18.249.255
        base = 4 * n
        self.box_ns, self.client_ns = f"eagle-box-{tag}", f"eagle-cli-{tag}"
        self.box_if, self.client_if = f"eb{tag}"[:15], f"ec{tag}"[:15]
        self.box_addr = f"198.18.{base // 256}.{base % 256 + 1}"
        self.client_addr = f"198.18.{base // 256}.{base % 256 + 2}"
        self.created: list[str] = []

    def create(self) -> NetnsPair:
        for ns in (self.box_ns, self.client_ns):
            _ip("netns", "del", ns, check=False)  # a leftover of a killed run
            _ip("netns", "add", ns)
            self.created.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", self.box_if, "type", "veth", "peer", "name", self.client_if)
        _ip("link", "set", self.box_if, "netns", self.box_ns)
        _ip("link", "set", self.client_if, "netns", self.client_ns)
        _ip("-n", self.box_ns, "addr", "add", f"{self.box_addr}/30", "dev", self.box_if)
        _ip("-n", self.client_ns, "addr", "add", f"{self.client_addr}/30", "dev", self.client_if)
        self.restore()
        _ip("-n", self.client_ns, "link", "set", self.client_if, "up")
        return self

    def cut(self) -> None:
        _ip("-n", self.box_ns, "link", "set", self.box_if, "down")

    def restore(self) -> None:
        _ip("-n", self.box_ns, "link", "set", self.box_if, "up")

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.client_ns]

    def close(self) -> None:
        delete_namespaces(self.created)
