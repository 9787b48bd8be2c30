"""A real OpenSSH `sshd -D` for tests: generated ed25519 host key, a test authorized_keys, a
free port on loopback (or a fixed address inside a network namespace), a log we can count
connections in. Nothing in the real ~/.ssh is read or written.

The login user is root (the tests run as root, like CI), but the box's $HOME is a test
directory: authorized_keys sets HOME (and a tag every process of the box inherits, so cleanup
finds agents, jobwraps and jobs) through `environment=` with `PermitUserEnvironment`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
TAG_VAR = "EAGLE_SSHD_TAG"


def have_sshd() -> bool:
    return os.path.exists(SSHD) and shutil.which("ssh-keygen") is not None


def keygen(path: Path, comment: str = "eagle-tui-test") -> Path:
    """An ed25519 key pair at path / path.pub."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
    )
    return path


def pubkey_fingerprint(pub: Path) -> str:
    out = subprocess.run(
        ["ssh-keygen", "-lf", str(pub)], check=True, capture_output=True, text=True
    ).stdout
    return out.split()[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ns_prefix(netns: str | None) -> list[str]:
    return ["ip", "netns", "exec", netns] if netns else []


class Sshd:
    def __init__(
        self,
        root: Path,
        user_pubs: list[Path],
        home: Path,
        tag: str,
        *,
        address: str = "127.0.0.1",
        port: int | None = None,
        netns: str | None = None,
        client_netns: str | None = None,
        log_level: str = "VERBOSE",
        extra: str = "",
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.tag = tag
        self.address = address
        self.port = port or free_port()
        self.netns = netns
        self.client_netns = client_netns  # where a client must run to reach us (readiness)
        self.host_key = keygen(self.root / "ssh_host_ed25519_key", "test-host")
        self.log = self.root / "sshd.log"
        self.config = self.root / "sshd_config"
        self.authorized = self.root / "authorized_keys"
        env_opts = f'environment="HOME={self.home}",environment="{TAG_VAR}={tag}"'
        self.authorized.write_text(
            "".join(f"{env_opts} {p.read_text().strip()}\n" for p in user_pubs)
        )
        self.config.write_text(
            f"Port {self.port}\n"
            f"ListenAddress {address}\n"
            f"HostKey {self.host_key}\n"
            "PidFile none\n"
            f"AuthorizedKeysFile {self.authorized}\n"
            "StrictModes no\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "PubkeyAuthentication yes\n"
            "PermitRootLogin prohibit-password\n"
            "UsePAM no\n"
            f"PermitUserEnvironment HOME,{TAG_VAR}\n"
            "Subsystem sftp internal-sftp\n"
            f"LogLevel {log_level}\n"
            "MaxStartups 100\n" + extra
        )
        self.proc: subprocess.Popen | None = None

    @property
    def fingerprint(self) -> str:
        return pubkey_fingerprint(self.host_key.with_suffix(".pub"))

    def known_hosts_line(self, name: str | None = None) -> str:
        alg, data = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"{name or f'[{self.address}]:{self.port}'} {alg} {data}\n"

    def start(self) -> Sshd:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation directory
        check = subprocess.run([SSHD, "-t", "-f", str(self.config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"sshd -t rejected {self.config}: {check.stderr}")
        self.proc = subprocess.Popen(
            [*ns_prefix(self.netns), SSHD, "-D", "-f", str(self.config), "-E", str(self.log)],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Ready when a client gets the SSH banner (sshd refuses Port=0, so we also learn here
        whether someone else took our port)."""
        deadline = time.monotonic() + timeout
        code = (
            "import socket,sys\n"
            f"s=socket.create_connection(({self.address!r},{self.port}),1)\n"
            "s.settimeout(1)\n"
            "sys.exit(0 if s.recv(8).startswith(b'SSH-2.0') else 1)\n"
        )
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {self.log_text()[-2000:]}")
            if self.client_netns:
                r = subprocess.run(
                    [*ns_prefix(self.client_netns), sys.executable, "-c", code],
                    capture_output=True,
                )
                if r.returncode == 0:
                    return
            else:
                try:
                    with socket.create_connection((self.address, self.port), 1) as s:
                        s.settimeout(1)
                        if s.recv(8).startswith(b"SSH-2.0"):
                            return
                except OSError:
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"sshd on {self.address}:{self.port} not ready: {self.log_text()}")

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def connections(self) -> int:
        return self.log_text().count("Connection from ")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        kill_tagged(self.tag)


# ---------------------------------------------------------------------- the box's processes
def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def tagged_pids(tag: str) -> list[int]:
    """Every process started under the test sshd (agents, jobwraps, jobs, their shells)."""
    needle = f"{TAG_VAR}={tag}".encode() + b"\0"
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and needle in _environ(int(d)) + b"\0":
            out.append(int(d))
    return out


def agent_pids(tag: str) -> list[int]:
    return [
        p for p in tagged_pids(tag) if "eagle-tui/agent-" in cmdline(p) and " serve" in cmdline(p)
    ]


def kill_tagged(tag: str) -> None:
    for _ in range(3):
        pids = tagged_pids(tag)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
