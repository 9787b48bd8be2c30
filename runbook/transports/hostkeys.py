"""Host-key trust for the SSH transport: strict known_hosts checks with clear refusals.

asyncssh checks the presented key against the trusted keys we give it and, when none matches,
asks `SSHClient.validate_host_public_key`. We answer there: a host with *no* entry is unknown
(accepted only when its fingerprint was passed with `--trust-host`, and then recorded in
known_hosts); a host *with* entries that presented another key has a changed key, which is
always refused. Verification is never turned off (asyncssh's `known_hosts=None`).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Iterable
from pathlib import Path

import asyncssh

from runbook.transports import HostKeyRefusal, TransportError

DEFAULT_PORT = 22


def fingerprint(key: asyncssh.SSHKey) -> str:
    return key.get_fingerprint("sha256")  # "SHA256:<43 chars of base64>", as ssh-keygen -l


def known_hosts_name(host: str, port: int | None) -> str:
    """How OpenSSH writes a host in known_hosts: `host`, or `[host]:port` off port 22."""
    return host if not port or port == DEFAULT_PORT else f"[{host}]:{port}"


class HostKeyUnknown(TransportError):
    """No known_hosts entry for this host: the operator may trust `fingerprint` (a UI asks;
    the CLI says which flag to add). Permanent: retrying cannot change the answer."""

    def __init__(
        self,
        target: str,
        host: str,
        port: int,
        fingerprint: str,
        known_hosts: Path,
        hint: str = "",
        key_type: str = "",
    ) -> None:
        self.target, self.host, self.port = target, host, port
        self.fingerprint, self.known_hosts = fingerprint, known_hosts
        self.host_key = HostKeyRefusal(
            "unknown", known_hosts_name(host, port), fingerprint, key_type
        )
        super().__init__(
            f"{target}: unknown host key for {known_hosts_name(host, port)} (not in "
            f"{known_hosts}); the server presented {fingerprint}.{hint} If that is the box's key "
            f"(check with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on the box), run "
            f"again with --trust-host {fingerprint} to record it in known_hosts.",
            permanent=True,
        )


class HostKeyChanged(TransportError):
    """known_hosts has other keys for this host: always refused, with both fingerprints."""

    def __init__(
        self,
        target: str,
        host: str,
        port: int,
        known: list[str],
        presented: str,
        known_hosts: Path,
        key_type: str = "",
    ) -> None:
        self.target, self.host, self.port = target, host, port
        self.known, self.presented, self.known_hosts = known, presented, known_hosts
        name = known_hosts_name(host, port)
        self.host_key = HostKeyRefusal("changed", name, presented, key_type, tuple(known))
        super().__init__(
            f"{target}: HOST KEY CHANGED for {name}: known_hosts ({known_hosts}) has "
            f"{', '.join(known)}, the server presented {presented}. Someone may be intercepting "
            f"the connection, or the box was rebuilt. Refusing to connect (--trust-host does not "
            f"override this). If the change is expected, remove the old key with "
            f"`ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(str(known_hosts))}` and connect "
            f"again to trust the new one.",
            permanent=True,
        )


class KnownHosts:
    """One known_hosts file, read on every lookup (a trust recorded meanwhile counts)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _load(self) -> asyncssh.SSHKnownHosts:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            text = ""
        return asyncssh.import_known_hosts(text)

    def match(self, host: str, addr: str, port: int | None) -> tuple:
        """The asyncssh `known_hosts` callable: keys trusted for (host, addr, port)."""
        return self._load().match(host, addr, None if port == DEFAULT_PORT else port)

    def keys_for(self, host: str, addr: str, port: int | None) -> list[asyncssh.SSHKey]:
        host_keys, ca_keys, *_ = self.match(host, addr, port)
        return list(host_keys) + list(ca_keys)

    def add(self, host: str, port: int | None, key: asyncssh.SSHKey) -> None:
        """Append `[host]:port type base64` (the file and its directory are created private)."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        alg, data = key.export_public_key("openssh").decode().split()[:2]
        line = f"{known_hosts_name(host, port)} {alg} {data}\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size:  # make sure we start on a fresh line
                with open(self.path, "rb") as f:
                    f.seek(size - 1)
                    if f.read(1) != b"\n":
                        line = "\n" + line
            os.write(fd, line.encode())
        finally:
            os.close(fd)


class VerifyingClient(asyncssh.SSHClient):
    """Decides on keys known_hosts does not vouch for; keeps the reason for the error message."""

    def __init__(
        self, target: str, known_hosts: KnownHosts, trusted: Callable[[], Iterable[str]]
    ) -> None:
        self.target = target
        self.known_hosts = known_hosts
        self.trusted = trusted
        self.refusal: TransportError | None = None
        self.recorded: str | None = None  # fingerprint added to known_hosts by this connection
        self.lost = False
        self.authenticating = False  # the key exchange is done (a timeout names the phase)

    def begin_auth(self, username: str) -> None:
        self.authenticating = True

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        fp = fingerprint(key)
        port = port or DEFAULT_PORT
        known = [fingerprint(k) for k in self.known_hosts.keys_for(host, addr, port)]
        if known:
            self.refusal = HostKeyChanged(
                self.target, host, port, known, fp, self.known_hosts.path, key.get_algorithm()
            )
            return False
        trusted = set(self.trusted())
        if fp in trusted:
            self.known_hosts.add(host, port, key)
            self.recorded = fp
            return True
        hint = " No --trust-host fingerprint given matches it." if trusted else ""
        self.refusal = HostKeyUnknown(
            self.target, host, port, fp, self.known_hosts.path, hint, key.get_algorithm()
        )
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
