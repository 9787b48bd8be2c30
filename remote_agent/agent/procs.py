"""Linux process facts from /proc: identity (pid + start time) and job-tree signalling.

A pid alone is not an identity (pids are reused); pid + start time (clock ticks since boot,
field 22 of /proc/<pid>/stat) is, within one boot, and the boot id covers reboots.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
    try:
        with open(_BOOT_ID_PATH) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    pgrp: int
    session: int
    start: int  # clock ticks after boot

    @property
    def dead(self) -> bool:
        return self.state in ("Z", "X", "x")


def proc_stat(pid: int) -> ProcStat | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    rest = raw[raw.rfind(b")") + 2 :].split()
    try:
        return ProcStat(
            pid, rest[0].decode(), int(rest[1]), int(rest[2]), int(rest[3]), int(rest[19])
        )
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    st = proc_stat(pid)
    return st.start if st else None


def is_alive(pid: int, start: int | None) -> bool:
    """True if the process `pid` started at `start` still runs (a zombie counts as gone)."""
    st = proc_stat(pid)
    return st is not None and not st.dead and (start is None or st.start == start)


def all_procs() -> list[ProcStat]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None:
                out.append(st)
    return out


@dataclass(frozen=True)
class JobTree:
    """The processes of one job: its process group, plus the rest of the jobwrap's session.

    The job leads its own group (pgid = its pid); the jobwrap leads the session, so children
    that moved to another group with setpgid are still found by session. An id counts as ours
    only while it cannot have been reused: its leader is gone (the kernel does not reuse a pid
    still used as a pgid/sid) or is still the very process we started (same start time).
    """

    pgid: int | None
    pgid_start: int | None
    sid: int | None
    sid_start: int | None

    def _ours(self, pid: int | None, start: int | None) -> bool:
        if pid is None or pid <= 1:
            return False
        st = proc_stat(pid)
        return st is None or start is None or st.start == start

    def member_stats(self) -> list[ProcStat]:
        group = self.pgid if self._ours(self.pgid, self.pgid_start) else None
        session = self.sid if self._ours(self.sid, self.sid_start) else None
        if group is None and session is None:
            return []
        return [
            p
            for p in all_procs()
            if not p.dead
            and p.pid != session  # the jobwrap itself: it records the exit, never killed here
            and (p.pgrp == group or p.session == session)
        ]

    def members(self) -> list[int]:
        return [p.pid for p in self.member_stats()]

    def signal(self, sig: int) -> int:
        """Send `sig` to every member; returns how many were signalled."""
        procs = self.member_stats()
        if self.pgid is not None and any(p.pgrp == self.pgid for p in procs):
            # killpg is atomic against a fork racing with our scan inside the group.
            try:
                os.killpg(self.pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for p in procs:
            try:
                os.kill(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        return len(procs)

    def wait_gone(self, timeout: float, poll: float = 0.05) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if not self.members():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)

    def terminate(self, grace_s: float) -> bool:
        """TERM the tree, wait up to grace_s, then KILL until nothing is left (bounded)."""
        if self.signal(signal.SIGTERM) and self.wait_gone(grace_s):
            return True
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            if not self.signal(signal.SIGKILL):
                return True
            self.wait_gone(0.5)
        return not self.members()
